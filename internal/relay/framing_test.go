package relay

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/switchboard-relay/switchboard/internal/httperr"
)

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// gatewayError is a transport's error that blames the device (502), as the
// tunnel's and the router's do, wrapping what went wrong.
type gatewayError struct{ err error }

func (e *gatewayError) Error() string   { return "the device did not answer: " + e.err.Error() }
func (e *gatewayError) Unwrap() error   { return e.err }
func (e *gatewayError) HTTPStatus() int { return http.StatusBadGateway }

// TestBodyErrorsAreTheUsers: a transport that fails reading the user's
// body, whatever it wraps the error in, answers 400 and closes the
// connection; its own failures stay 502.
func TestBodyErrorsAreTheUsers(t *testing.T) {
	h := NewHandler(Config{
		Agents: http.NotFoundHandler(), Tunnels: http.NotFoundHandler(),
		Transport: roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if _, err := io.ReadAll(r.Body); err != nil {
				return nil, &gatewayError{fmt.Errorf("copy the body: %w", err)}
			}
			return nil, &gatewayError{errors.New("stream reset")}
		}),
	})
	srv := httptest.NewServer(h)
	defer srv.Close()
	for _, tt := range []struct {
		name, body, headers string
		status              int
		words               string
	}{
		{"bad chunk size", "zz\r\nhello\r\n0\r\n\r\n", "Transfer-Encoding: chunked\r\n", 400, "request body could not be read (invalid byte in chunk length)"},
		{"the device's failure", "hello", "Content-Length: 5\r\n", 502, "stream reset"},
	} {
		conn, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(conn, "POST /client/dev/x HTTP/1.1\r\nHost: relay\r\n%s\r\n%s", tt.headers, tt.body)
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != tt.status || !strings.Contains(string(b), tt.words) {
			t.Errorf("%s: %d %q, want %d saying %q", tt.name, resp.StatusCode, b, tt.status, tt.words)
		}
		if tt.status != http.StatusBadRequest {
			continue
		}
		if _, err := br.ReadByte(); err != io.EOF {
			t.Errorf("%s: after the answer, read %v, want the connection closed", tt.name, err)
		}
	}
}

func TestBodyErrorKeepsAStalledBodysStatus(t *testing.T) {
	err := error(&BodyError{Err: &idleError{timeout: time.Second}})
	var se httperr.StatusError
	if !errors.As(err, &se) || se.HTTPStatus() != http.StatusRequestTimeout || !strings.Contains(se.Error(), "no byte of the request body") {
		t.Errorf("%v: want the stalled body's 408", err)
	}
}
