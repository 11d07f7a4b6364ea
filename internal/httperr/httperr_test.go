package httperr_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/httperr"
)

// TestWrite answers errors over a real listener and reads what a client
// gets: the wire format every text listener shares.
func TestWrite(t *testing.T) {
	errCause := errors.New("cause")
	tests := []struct {
		name       string
		err        error
		status     int
		body       string
		retryAfter string
	}{
		{"plain error", errors.New("boom"), 500, "boom\n", ""},
		{"status error", httperr.New(http.StatusBadRequest, "no device named"), 400, "no device named\n", ""},
		{"wrapped: the inner message only", fmt.Errorf("forward: %w", httperr.New(http.StatusBadGateway, "relay gone")), 502, "relay gone\n", ""},
		{"retry after, rounded up", &httperr.Error{Status: 503, Message: "busy", RetryAfter: 1500 * time.Millisecond}, 503, "busy\n", "2"},
		{"no message: the cause's", &httperr.Error{Status: 504, Err: errCause}, 504, "cause\n", ""},
		{"no message, no cause: the status text", &httperr.Error{Status: 404}, 404, "Not Found\n", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { httperr.Write(w, tt.err) }))
			defer srv.Close()
			resp, err := http.Get(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.status || string(body) != tt.body || resp.Header.Get("Retry-After") != tt.retryAfter {
				t.Errorf("got %d %q Retry-After %q, want %d %q %q", resp.StatusCode, body, resp.Header.Get("Retry-After"), tt.status, tt.body, tt.retryAfter)
			}
			if ct, sniff := resp.Header.Get("Content-Type"), resp.Header.Get("X-Content-Type-Options"); ct != "text/plain; charset=utf-8" || sniff != "nosniff" {
				t.Errorf("Content-Type %q, X-Content-Type-Options %q", ct, sniff)
			}
		})
	}
}

func TestErrorMatches(t *testing.T) {
	errCause := errors.New("cause")
	err := fmt.Errorf("op: %w", &httperr.Error{Status: 503, Message: "m", Err: errCause})
	if !errors.Is(err, errCause) {
		t.Error("the cause is not matched by errors.Is")
	}
	var se httperr.StatusError
	if !errors.As(err, &se) || se.HTTPStatus() != 503 {
		t.Errorf("errors.As found %v, want the 503", se)
	}
	if httperr.StatusOf(errCause, 418) != 418 || httperr.MessageOf(errCause) != "cause" || httperr.Has(errCause) {
		t.Error("an error without a status did not fall back")
	}
}
