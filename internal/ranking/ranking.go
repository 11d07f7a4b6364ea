// Package ranking decides which relay should hold a device: the relay it is
// attached to while that relay is available (sticky), else the best of the
// available relays, same region first, then by rendezvous hashing of
// (device, relay id), ties by id. Every node computes the same answer from
// the same fleet state, with no coordination and no allocation per lookup.
//
// Rendezvous (highest-random-weight) hashing gives each device its own
// order of the relays: when a relay dies, its devices spread evenly over the
// survivors, and no other device moves; a relay that joins takes nothing
// (stickiness), and gets its share of new devices.
package ranking

// Relay is a candidate as the ranking sees it.
type Relay struct {
	ID     string
	Region string
	// Available is State.Available: fresh, healthy, not draining or
	// stopping, not vetoed.
	Available bool
	// Load counts the devices assigned to the relay; Capacity is its
	// ceiling. A relay at capacity takes no new device but keeps those it
	// has. Capacity 0 means no ceiling.
	Load, Capacity int
}

// hasRoom reports whether r may take one more device.
func (r *Relay) hasRoom() bool { return r.Capacity <= 0 || r.Load < r.Capacity }

// Score is the rendezvous weight of device on relay id: a 64-bit hash of
// both, mixed so that every bit depends on every input byte.
func Score(device, id string) uint64 {
	const (
		offset = 14695981039346656037
		prime  = 1099511628211
	)
	h := uint64(offset)
	for i := range len(device) {
		h ^= uint64(device[i])
		h *= prime
	}
	h ^= 0xff // a separator no name byte equals, so ("ab","c") ≠ ("a","bc")
	h *= prime
	for i := range len(id) {
		h ^= uint64(id[i])
		h *= prime
	}
	// The splitmix64 finaliser: FNV alone is weak in its high bits.
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}

// better reports whether a ranks before b for device in region.
func better(device, region string, a, b *Relay, sa, sb uint64) bool {
	ra, rb := region != "" && a.Region == region, region != "" && b.Region == region
	if ra != rb {
		return ra
	}
	if sa != sb {
		return sa > sb
	}
	return a.ID < b.ID
}

// Balance bounds the load of the relay Best picks: at most Balance times
// the average load of the available relays once the device is placed
// (consistent hashing with bounded loads). A relay over the bound is passed
// over for new devices and keeps those it has; when every relay is over it,
// the bound is ignored.
const Balance = 1.05

// Best returns the index in relays of the relay that should take device,
// new to the fleet or moving, whose agent is in region ("" for none): the
// best-ranked available relay with room, passing over relays loaded beyond
// Balance times the average. It returns -1 when none can.
func Best(device, region string, relays []Relay) int {
	if i := best(device, region, relays, loadBound(relays)); i >= 0 {
		return i
	}
	return best(device, region, relays, 0)
}

// loadBound is the most devices a relay may hold and still take one more:
// Balance times the average once the new device is placed, rounded down,
// and at least 1.
func loadBound(relays []Relay) int {
	total, n := 0, 0
	for i := range relays {
		if relays[i].Available {
			total += relays[i].Load
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return max(1, int(Balance*float64(total+1)/float64(n)))
}

// best is Best with relays at or over bound passed over (0: no bound).
func best(device, region string, relays []Relay, bound int) int {
	best := -1
	var bestScore uint64
	for i := range relays {
		r := &relays[i]
		if !r.Available || !r.hasRoom() || bound > 0 && r.Load >= bound {
			continue
		}
		s := Score(device, r.ID)
		if best < 0 || better(device, region, r, &relays[best], s, bestScore) {
			best, bestScore = i, s
		}
	}
	return best
}

// Holder returns the index of the relay that holds device: the relay with
// id current while it is available, whatever the ranking would prefer now
// and whatever its load (capacity is enforced when a device is assigned,
// never afterwards); else Best. It returns -1 when no relay can.
func Holder(device, region, current string, relays []Relay) int {
	if current != "" {
		for i := range relays {
			if relays[i].ID == current && relays[i].Available {
				return i
			}
		}
	}
	return Best(device, region, relays)
}

// Rank writes into order the indexes of the available relays with room, best
// first, and returns it; pass order with enough capacity (len(relays)) to
// rank without allocating. An agent walks this list when its relay is lost.
func Rank(device, region string, relays []Relay, order []int) []int {
	order = order[:0]
	for i := range relays {
		if relays[i].Available && relays[i].hasRoom() {
			order = append(order, i)
		}
	}
	// Insertion sort: fleets are small, and it needs no closure or scratch.
	for i := 1; i < len(order); i++ {
		x := order[i]
		sx := Score(device, relays[x].ID)
		j := i
		for ; j > 0; j-- {
			y := order[j-1]
			if !better(device, region, &relays[x], &relays[y], sx, Score(device, relays[y].ID)) {
				break
			}
			order[j] = y
		}
		order[j] = x
	}
	return order
}

// Standby returns the index in relays of the relay a device held by
// relays[holder] should keep its standby tunnel at: of the ranking order
// (Rank's), the first relay other than the holder that is in another
// region than the holder's, else the first other than the holder: a
// standby that shares nothing with the holder where the fleet allows it.
// It returns -1 when order names no other relay.
func Standby(holder int, relays []Relay, order []int) int {
	first := -1
	for _, i := range order {
		if i == holder {
			continue
		}
		if holder < 0 || relays[i].Region != relays[holder].Region {
			return i
		}
		if first < 0 {
			first = i
		}
	}
	return first
}
