package ranking

import "testing"

func TestStandby(t *testing.T) {
	relays := []Relay{
		{ID: "rl-a", Region: "eu"},
		{ID: "rl-b", Region: "eu"},
		{ID: "rl-c", Region: "us"},
		{ID: "rl-d", Region: ""},
	}
	for _, tc := range []struct {
		name   string
		holder int
		order  []int
		want   int
	}{
		{"another region first", 0, []int{0, 1, 2}, 2},
		{"next in the ranking when all share the region", 0, []int{0, 1}, 1},
		{"the holder is left out wherever it ranks", 1, []int{0, 1}, 0},
		{"a relay without a region is another region", 2, []int{2, 3, 0}, 3},
		{"no other relay", 0, []int{0}, -1},
		{"an empty ranking", 0, nil, -1},
		{"a holder out of the ranking", 1, []int{0, 2}, 2},
		{"no holder known", -1, []int{1, 0}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Standby(tc.holder, relays, tc.order); got != tc.want {
				t.Fatalf("Standby(%d, %v) = %d, want %d", tc.holder, tc.order, got, tc.want)
			}
		})
	}
}
