package ranking

// State is what decides whether a relay is available: what the fleet state
// says of it, and what this relay holds against it.
type State struct {
	// Fresh: it beat within the fleet's fresh window.
	Fresh bool
	// Healthy: its last heartbeat said it is healthy.
	Healthy bool
	// Draining: it is held out of placement (an operator's drain, a roll).
	Draining bool
	// Stopping: it is shutting down.
	Stopping bool
	// Vetoed: this relay leaves it out (its watchdog, secret parity), or
	// leaves it out for one device (an agent said it cannot reach it).
	Vetoed bool
}

// Answers reports whether the relay answers requests: fresh, healthy and
// not vetoed, even while it drains or stops. A request for a device whose
// agents are still at such a relay goes there: a drain moves nothing
// mid-flight, and users follow the agents as they leave.
func (s State) Answers() bool { return s.Fresh && s.Healthy && !s.Vetoed }

// Up reports whether the relay answers and is not shutting down, drained
// or not: a relay that came back from an update while its roll still holds
// it.
func (s State) Up() bool { return s.Answers() && !s.Stopping }

// Available reports whether the relay takes devices: it is up and not
// draining. Only an available relay is placed on, ranked or kept as a
// device's holder (Relay.Available).
func (s State) Available() bool { return s.Up() && !s.Draining }
