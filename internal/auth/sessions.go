package auth

import (
	"context"
	"errors"
	"net/http"
	"sync"
)

// ErrRevoked is the cause of a request cut because the token that let it in
// was revoked.
var ErrRevoked = errors.New("the token that authorized this was revoked")

// Sessions tracks the requests each token let in while they run, so that
// revoking the token cuts them: long downloads, log follows, websockets
// and the polls of long-poll agents alike. It is safe for concurrent use.
//
// Wrap puts every request under a cancelable context; Bind, called by
// whatever authenticated the request, files it under the token's id;
// Revoke cancels every request filed under an id.
type Sessions struct {
	mu    sync.Mutex // guards byTok
	byTok map[string]map[*binding]struct{}
}

// binding is one request's place in Sessions.
type binding struct {
	cancel  context.CancelCauseFunc
	tokenID string // "" until bound; guarded by Sessions.mu
	revoked bool   // its token was revoked; guarded by Sessions.mu
}

type bindingKey struct{}

// Wrap returns h with each request under a context that Revoke can
// cancel. A request cut by a revocation is aborted: its connection (or
// HTTP/2 stream) is closed rather than answered, as when the relay stops.
func (s *Sessions) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithCancelCause(r.Context())
		b := &binding{cancel: cancel}
		defer func() {
			s.unbind(b)
			revoked := errors.Is(context.Cause(ctx), ErrRevoked)
			cancel(nil)
			if revoked {
				panic(http.ErrAbortHandler)
			}
		}()
		h.ServeHTTP(w, r.WithContext(context.WithValue(ctx, bindingKey{}, b)))
	})
}

// Bind files the request of ctx under tokenID. It does nothing for a
// request that Wrap did not see or for an empty id.
func (s *Sessions) Bind(ctx context.Context, tokenID string) {
	b, ok := ctx.Value(bindingKey{}).(*binding)
	if !ok || tokenID == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if b.tokenID != "" {
		s.removeLocked(b)
	}
	s.bindLocked(b, tokenID)
}

func (s *Sessions) bindLocked(b *binding, tokenID string) {
	b.tokenID = tokenID
	if s.byTok == nil {
		s.byTok = map[string]map[*binding]struct{}{}
	}
	set := s.byTok[tokenID]
	if set == nil {
		set = map[*binding]struct{}{}
		s.byTok[tokenID] = set
	}
	set[b] = struct{}{}
}

// Detach returns a context for what outlives the handler of the request
// of ctx (an upgraded connection, whose handler returns once it is handed
// over): it keeps ctx's values but not its end, and is cancelled, with
// cause ErrRevoked, when the token the request is filed under is revoked
// (at once if it was already). Calling end files it away and cancels it.
func (s *Sessions) Detach(ctx context.Context) (_ context.Context, end context.CancelFunc) {
	dctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	b, ok := ctx.Value(bindingKey{}).(*binding)
	if !ok {
		return dctx, func() { cancel(nil) }
	}
	d := &binding{cancel: cancel}
	s.mu.Lock()
	switch {
	case b.revoked:
		cancel(ErrRevoked)
	case b.tokenID != "":
		s.bindLocked(d, b.tokenID)
	}
	s.mu.Unlock()
	return dctx, func() {
		s.unbind(d)
		cancel(nil)
	}
}

// Revoke cuts every request filed under tokenID and returns how many.
func (s *Sessions) Revoke(tokenID string) int {
	s.mu.Lock()
	set := s.byTok[tokenID]
	delete(s.byTok, tokenID)
	for b := range set {
		b.tokenID = ""
		b.revoked = true
	}
	s.mu.Unlock()
	for b := range set {
		b.cancel(ErrRevoked)
	}
	return len(set)
}

// Active returns how many requests are filed under tokenID.
func (s *Sessions) Active(tokenID string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byTok[tokenID])
}

func (s *Sessions) unbind(b *binding) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if b.tokenID != "" {
		s.removeLocked(b)
	}
}

func (s *Sessions) removeLocked(b *binding) {
	set := s.byTok[b.tokenID]
	delete(set, b)
	if len(set) == 0 {
		delete(s.byTok, b.tokenID)
	}
	b.tokenID = ""
}
