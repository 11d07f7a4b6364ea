package peer

import "context"

type forwardedKey struct{}

type forwarded struct {
	from string
	hops int
}

// WithForwarded returns ctx marked as the context of a request that relay
// from forwarded here, as its hops-th hop between relays.
func WithForwarded(ctx context.Context, from string, hops int) context.Context {
	return context.WithValue(ctx, forwardedKey{}, forwarded{from: from, hops: hops})
}

// Forwarded returns how often the request of ctx was forwarded between
// relays to get here, and by which relay last: 0 and "" when a user sent it
// here.
func Forwarded(ctx context.Context) (hops int, from string) {
	f, _ := ctx.Value(forwardedKey{}).(forwarded)
	return f.hops, f.from
}
