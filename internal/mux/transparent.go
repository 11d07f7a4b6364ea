package mux

import "net"

// Transparent is a connection that wraps another and passes its bytes on
// unchanged, only watching what its reads return (the agent's note of
// when its relay was last heard from, a dialled tunnel's note of where it
// was placed). A session over a Transparent connection whose innermost
// wrapped connection is a socket reads and writes that socket itself, as
// it does a bare one — holding no read buffer while idle, writing without
// a wake-up, parked while idle (see rawReader, sink, park) — and tells
// each wrapper what every read returned. Close, deadlines and addresses
// still go through the outermost connection.
type Transparent interface {
	net.Conn
	// Wrapped returns the connection this one wraps.
	Wrapped() net.Conn
	// SawRead is told what each read of the wrapped connection returned,
	// in place of the wrapper's own Read.
	SawRead(n int, err error)
}

// socketOf returns the connection beneath conn's Transparent wrappers,
// and a function that tells the wrappers of a read of it (nil when conn
// is not wrapped). It returns conn itself when what lies beneath is not a
// socket: the wrappers then see their reads as usual.
func socketOf(conn net.Conn) (net.Conn, func(n int, err error)) {
	var seen []Transparent
	inner := conn
	for {
		t, ok := inner.(Transparent)
		if !ok {
			break
		}
		seen = append(seen, t)
		inner = t.Wrapped()
	}
	if len(seen) == 0 || !kernelSocket(inner) {
		return conn, nil
	}
	if len(seen) == 1 {
		return inner, seen[0].SawRead
	}
	return inner, func(n int, err error) {
		for _, t := range seen {
			t.SawRead(n, err)
		}
	}
}
