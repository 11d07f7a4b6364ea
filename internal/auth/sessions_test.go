package auth

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
)

// What a handler detaches outlives it, and ends when its token is
// revoked, or at once when it was revoked before.
func TestDetachOutlivesTheHandlerUntilRevoked(t *testing.T) {
	var s Sessions
	detach := func(tokenID string) (context.Context, context.CancelFunc) {
		var ctx context.Context
		var end context.CancelFunc
		s.Wrap(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
			s.Bind(r.Context(), tokenID)
			ctx, end = s.Detach(r.Context())
		})).ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
		return ctx, end
	}
	ctx, end := detach("t1")
	other, endOther := detach("t2")
	defer endOther()
	if ctx.Err() != nil || s.Active("t1") != 1 {
		t.Fatalf("after the handler: %v, %d filed under t1, want alive and 1", ctx.Err(), s.Active("t1"))
	}
	if n := s.Revoke("t1"); n != 1 || !errors.Is(context.Cause(ctx), ErrRevoked) {
		t.Fatalf("revoked %d, cause %v; want 1 and ErrRevoked", n, context.Cause(ctx))
	}
	if other.Err() != nil {
		t.Fatalf("another token's detached context ended: %v", other.Err())
	}
	end()
	_, end2 := detach("t2")
	end2()
	if n := s.Active("t2"); n != 1 {
		t.Fatalf("%d filed under t2 after one of two ended, want 1", n)
	}

	// Revoked while the handler ran, before it detached (Wrap then aborts
	// the handler).
	defer func() {
		if r := recover(); r != http.ErrAbortHandler {
			t.Errorf("the revoked handler ended with %v, want http.ErrAbortHandler", r)
		}
	}()
	s.Wrap(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		s.Bind(r.Context(), "t3")
		s.Revoke("t3")
		ctx, end := s.Detach(r.Context())
		defer end()
		if !errors.Is(context.Cause(ctx), ErrRevoked) {
			t.Errorf("detached after a revocation: cause %v, want ErrRevoked", context.Cause(ctx))
		}
	})).ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
}
