package ranking

import (
	"fmt"
	"slices"
	"testing"
)

func fleet(n int) []Relay {
	rs := make([]Relay, n)
	for i := range rs {
		rs[i] = Relay{ID: fmt.Sprintf("rl-%08x", 0x1000+i*7919), Available: true}
	}
	return rs
}

func TestBest(t *testing.T) {
	base := []Relay{
		{ID: "rl-aaaaaaaa", Region: "eu", Available: true},
		{ID: "rl-bbbbbbbb", Region: "us", Available: true},
		{ID: "rl-cccccccc", Region: "eu", Available: true},
	}
	pick := func(device, region string, rs []Relay) string {
		i := Best(device, region, rs)
		if i < 0 {
			return ""
		}
		return rs[i].ID
	}
	// The unconstrained winner by score, to build the cases on.
	hrw := func(device string, ids ...string) string {
		return slices.MaxFunc(ids, func(a, b string) int {
			sa, sb := Score(device, a), Score(device, b)
			switch {
			case sa < sb:
				return -1
			case sa > sb:
				return 1
			}
			return 0
		})
	}
	with := func(f func([]Relay)) []Relay {
		rs := slices.Clone(base)
		f(rs)
		return rs
	}
	tests := []struct {
		name, device, region string
		relays               []Relay
		want                 string
	}{
		{"no region: highest score", "robot-1", "", base, hrw("robot-1", "rl-aaaaaaaa", "rl-bbbbbbbb", "rl-cccccccc")},
		{"same region first", "robot-1", "us", base, "rl-bbbbbbbb"},
		{"within the region by score", "robot-1", "eu", base, hrw("robot-1", "rl-aaaaaaaa", "rl-cccccccc")},
		{"unknown region: by score", "robot-1", "ap", base, hrw("robot-1", "rl-aaaaaaaa", "rl-bbbbbbbb", "rl-cccccccc")},
		{"region relay unavailable: another region", "robot-1", "us", with(func(rs []Relay) { rs[1].Available = false }), hrw("robot-1", "rl-aaaaaaaa", "rl-cccccccc")},
		{"region relay full: another region", "robot-1", "us", with(func(rs []Relay) { rs[1].Load, rs[1].Capacity = 5, 5 }), hrw("robot-1", "rl-aaaaaaaa", "rl-cccccccc")},
		{"capacity 0 means no ceiling", "robot-1", "us", with(func(rs []Relay) {
			for i := range rs {
				rs[i].Load = 1 << 20
			}
		}), "rl-bbbbbbbb"},
		{"a relay loaded beyond the balance is passed over", "robot-1", "us", with(func(rs []Relay) { rs[1].Load = 10 }), hrw("robot-1", "rl-aaaaaaaa", "rl-cccccccc")},
		{"unless every relay is", "robot-1", "us", with(func(rs []Relay) {
			for i := range rs {
				rs[i].Load, rs[i].Capacity = 10, 11
			}
			rs[0].Available = false
		}), "rl-bbbbbbbb"},
		{"none available", "robot-1", "", with(func(rs []Relay) {
			for i := range rs {
				rs[i].Available = false
			}
		}), ""},
		{"empty fleet", "robot-1", "", nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := pick(tt.device, tt.region, tt.relays); got != tt.want {
				t.Errorf("Best = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestTiesByID(t *testing.T) {
	a, b := &Relay{ID: "rl-00000001"}, &Relay{ID: "rl-00000002"}
	if !better("d", "", a, b, 7, 7) || better("d", "", b, a, 7, 7) {
		t.Error("equal scores must order by id, lowest first")
	}
	if !better("d", "", b, a, 8, 7) {
		t.Error("a higher score must win over a lower id")
	}
}

func TestHolderIsSticky(t *testing.T) {
	rs := fleet(4)
	for d := range 200 {
		device := fmt.Sprintf("dev-%d", d)
		best := Best(device, "", rs)
		other := (best + 1) % len(rs)
		// Attached elsewhere and that relay is available: stay.
		if got := Holder(device, "", rs[other].ID, rs); got != other {
			t.Fatalf("%s: Holder = %d, want the current relay %d", device, got, other)
		}
		// Even when it is over capacity: capacity applies to assignments.
		full := slices.Clone(rs)
		full[other].Load, full[other].Capacity = 10, 1
		if got := Holder(device, "", rs[other].ID, full); got != other {
			t.Fatalf("%s: Holder over capacity = %d, want %d", device, got, other)
		}
		// Its relay unavailable or unknown: the ranking decides.
		down := slices.Clone(rs)
		down[other].Available = false
		if got := Holder(device, "", rs[other].ID, down); got != Best(device, "", down) {
			t.Fatalf("%s: Holder with its relay down = %d", device, got)
		}
		if got := Holder(device, "", "rl-gone", rs); got != best {
			t.Fatalf("%s: Holder with an unknown relay = %d, want %d", device, got, best)
		}
	}
}

func TestRankOrder(t *testing.T) {
	rs := fleet(6)
	rs[2].Available = false
	rs[4].Region = "eu"
	order := Rank("robot-9", "eu", rs, make([]int, 0, len(rs)))
	if len(order) != 5 || order[0] != 4 || slices.Contains(order, 2) {
		t.Fatalf("Rank = %v: want 5 relays, the same-region one first, the unavailable one left out", order)
	}
	for i := 1; i+1 < len(order); i++ {
		if Score("robot-9", rs[order[i]].ID) < Score("robot-9", rs[order[i+1]].ID) {
			t.Errorf("Rank = %v is not in score order after the region", order)
		}
	}
	if Best("robot-9", "eu", rs) != order[0] {
		t.Error("Best and Rank disagree")
	}
}

// TestSpread places 1,000 devices one after another on 4 relays, as they
// arrive, over many fleets of random ids: the bounded load keeps every relay
// within Balance of the average, where plain rendezvous hashing strays to
// 1.2.
func TestSpread(t *testing.T) {
	worst := 0.0
	for f := range 200 {
		rs := make([]Relay, 4)
		for i := range rs {
			rs[i] = Relay{ID: fmt.Sprintf("rl-%08x", Score(fmt.Sprint(f), fmt.Sprint(i))>>32), Available: true}
		}
		for d := range 1000 {
			rs[Best(fmt.Sprintf("device-%04d", d), "", rs)].Load++
		}
		hi := 0
		for _, r := range rs {
			hi = max(hi, r.Load)
		}
		worst = max(worst, float64(hi)/250)
	}
	t.Logf("1,000 devices over 4 relays, 200 fleets: worst max/avg %.3f", worst)
	if worst > Balance {
		t.Errorf("max/avg %.3f, want ≤ %.2f", worst, Balance)
	}
}

// TestDeathMovesOnlyTheDeadRelaysDevices: with one relay gone, every device
// whose best relay lives keeps it, and the dead relay's devices spread over
// all survivors.
func TestDeathMovesOnlyTheDeadRelaysDevices(t *testing.T) {
	rs := fleet(5)
	dead := 2
	after := slices.Clone(rs)
	after[dead].Available = false
	moved := make([]int, len(rs))
	for d := range 5000 {
		device := fmt.Sprintf("device-%d", d)
		before, now := Best(device, "", rs), Best(device, "", after)
		if before != dead && now != before {
			t.Fatalf("%s moved from live relay %d to %d", device, before, now)
		}
		if before == dead {
			moved[now]++
		}
	}
	for i, n := range moved {
		if i != dead && n < 150 {
			t.Errorf("survivor %d took only %d of the dead relay's devices: %v", i, n, moved)
		}
	}
}

func TestNoAllocations(t *testing.T) {
	rs := fleet(16)
	order := make([]int, 0, len(rs))
	if n := testing.AllocsPerRun(100, func() {
		Best("robot-1", "eu", rs)
		Holder("robot-1", "eu", rs[3].ID, rs)
		order = Rank("robot-1", "eu", rs, order)
	}); n != 0 {
		t.Errorf("%v allocations per lookup, want 0", n)
	}
}

func BenchmarkBest16(b *testing.B) {
	rs := fleet(16)
	for b.Loop() {
		Best("robot-1", "eu", rs)
	}
}
