package ranking

import "testing"

// TestAvailability is the table of which relays answer requests, are up,
// and take devices.
func TestAvailability(t *testing.T) {
	ok := State{Fresh: true, Healthy: true}
	with := func(f func(*State)) State { s := ok; f(&s); return s }
	for _, c := range []struct {
		name                   string
		s                      State
		answers, up, available bool
	}{
		{"fresh and healthy", ok, true, true, true},
		{"draining", with(func(s *State) { s.Draining = true }), true, true, false},
		{"stopping", with(func(s *State) { s.Stopping = true }), true, false, false},
		{"stale", with(func(s *State) { s.Fresh = false }), false, false, false},
		{"unhealthy", with(func(s *State) { s.Healthy = false }), false, false, false},
		{"vetoed", with(func(s *State) { s.Vetoed = true }), false, false, false},
		{"vetoed and draining", with(func(s *State) { s.Vetoed, s.Draining = true, true }), false, false, false},
		{"nothing known", State{}, false, false, false},
	} {
		if a, u, av := c.s.Answers(), c.s.Up(), c.s.Available(); a != c.answers || u != c.up || av != c.available {
			t.Errorf("%s: answers %v, up %v, available %v; want %v, %v, %v", c.name, a, u, av, c.answers, c.up, c.available)
		}
	}
}
