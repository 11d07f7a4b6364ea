package broker_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchboard-relay/switchboard/internal/broker"
	"github.com/switchboard-relay/switchboard/internal/config"
	"github.com/switchboard-relay/switchboard/internal/wire"
)

// Every test runs inside a synctest bubble: time is virtual, so the
// durations asserted below are exact, and synctest.Wait tells when every
// goroutine has done all it can without time passing.

// elapse lets d of the bubble's virtual time pass on a timer of its fake
// clock, which jumps ahead as soon as every goroutine of the bubble is
// blocked: no test waits in real time.
func elapse(d time.Duration) { <-time.After(d) }

const dev = "dev"

// testConfig spells out every timeout so that the tests read on their own.
func testConfig() broker.Config {
	return broker.Config{
		PollWait:               30 * time.Second,
		NoAgentGrace:           2 * time.Second,
		PickupTimeout:          10 * time.Second,
		InactiveRequestTimeout: 60 * time.Second,
		InactiveBackendTimeout: 30 * time.Minute,
		RequestStreamWait:      20 * time.Second,
		AgentGoneGrace:         time.Second,
		MaxPendingPerDevice:    4,
		MaxBodyBytes:           1 << 10,
		BlockSize:              10,
	}
}

// fixture is a broker started inside the bubble and closed before it ends.
type fixture struct {
	t   *testing.T
	b   *broker.Broker
	reg *prometheus.Registry
}

func newFixture(t *testing.T, cfg broker.Config) *fixture {
	t.Helper()
	reg := prometheus.NewRegistry()
	cfg.Metrics = reg
	b, err := broker.New(cfg)
	if err != nil {
		t.Fatalf("broker.New: %v", err)
	}
	t.Cleanup(b.Close)
	return &fixture{t: t, b: b, reg: reg}
}

// userReq is a user request for device; the device is the URL's host, as
// the relay's reverse proxy sets it.
func userReq(device, target string, body io.Reader) *http.Request {
	req := httptest.NewRequest(http.MethodGet, "http://relay.test"+target, body)
	if body != nil {
		req.Method = http.MethodPost
	}
	req.URL.Host = device
	return req
}

type rtResult struct {
	resp *http.Response
	err  error
	took time.Duration // virtual time from the call to its return
}

// roundTrip runs b.RoundTrip(req) in a goroutine.
func (f *fixture) roundTrip(req *http.Request) <-chan rtResult {
	ch := make(chan rtResult, 1)
	start := time.Now()
	go func() {
		resp, err := f.b.RoundTrip(req)
		ch <- rtResult{resp, err, time.Since(start)}
	}()
	return ch
}

type pollResult struct {
	ex   *broker.Exchange
	err  error
	took time.Duration
}

// poll runs b.Poll in a goroutine.
func (f *fixture) poll(ctx context.Context, device, agentID, instance string) <-chan pollResult {
	ch := make(chan pollResult, 1)
	start := time.Now()
	go func() {
		ex, err := f.b.Poll(ctx, device, agentID, instance)
		ch <- pollResult{ex, err, time.Since(start)}
	}()
	return ch
}

// deliver runs b.Deliver in a goroutine.
func (f *fixture) deliver(agentID string, r *wire.Response) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- f.b.Deliver(f.t.Context(), agentID, r) }()
	return ch
}

// connect makes device known, as if its agent had just polled and left.
func (f *fixture) connect(device string) {
	f.t.Helper()
	ctx, cancel := context.WithCancel(f.t.Context())
	pc := f.poll(ctx, device, "", "")
	synctest.Wait()
	cancel()
	if r := <-pc; !errors.Is(r.err, context.Canceled) {
		f.t.Fatalf("poll ended with %v, want context.Canceled", r.err)
	}
}

// take starts a poll by agentID, sends req, and returns the exchange the poll
// received and the user's pending round trip.
func (f *fixture) take(agentID, instance string, req *http.Request) (*broker.Exchange, <-chan rtResult) {
	f.t.Helper()
	pc := f.poll(f.t.Context(), req.URL.Host, agentID, instance)
	synctest.Wait()
	rc := f.roundTrip(req)
	p := now(f.t, pc)
	if p.err != nil {
		f.t.Fatalf("poll: %v", p.err)
	}
	return p.ex, rc
}

// open takes req and answers it with a 200 head (and hdr pairs), returning
// the exchange and the user's response.
func (f *fixture) open(agentID string, req *http.Request, hdr ...string) (*broker.Exchange, *http.Response) {
	f.t.Helper()
	ex, rc := f.take(agentID, "", req)
	if err := f.b.Deliver(f.t.Context(), agentID, head(ex.ID, http.StatusOK, hdr...)); err != nil {
		f.t.Fatalf("deliver head: %v", err)
	}
	r := now(f.t, rc)
	if r.err != nil {
		f.t.Fatalf("RoundTrip: %v", r.err)
	}
	return ex, r.resp
}

// head is a first chunk: status and headers given as name, value pairs.
func head(id string, status int, hdr ...string) *wire.Response {
	r := &wire.Response{ID: id, HasStatus: true, StatusCode: int32(status)}
	for i := 0; i+1 < len(hdr); i += 2 {
		r.Header = append(r.Header, wire.Header{Name: hdr[i], Value: hdr[i+1]})
	}
	return r
}

// now returns what ch holds once every goroutine is blocked, failing the
// test when ch has nothing without time passing.
func now[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	synctest.Wait()
	select {
	case v := <-ch:
		return v
	default:
		t.Fatalf("no result without time passing")
		panic("unreachable")
	}
}

// pending fails the test when ch already has a result.
func pending[T any](t *testing.T, ch <-chan T, what string) {
	t.Helper()
	synctest.Wait()
	select {
	case v := <-ch:
		t.Fatalf("%s ended early: %+v", what, v)
	default:
	}
}

// brokerError asserts that err is a *broker.Error with status.
func brokerError(t *testing.T, err error, status int) *broker.Error {
	t.Helper()
	var be *broker.Error
	if !errors.As(err, &be) {
		t.Fatalf("err = %v (%T), want *broker.Error with status %d", err, err, status)
	}
	if be.Status != status || be.HTTPStatus() != status {
		t.Fatalf("status %d (%q), want %d", be.Status, be.Message, status)
	}
	if be.Message == "" {
		t.Fatal("error without a message")
	}
	return be
}

// gauge returns the value of the broker's gauge name.
func (f *fixture) gauge(name string) float64 {
	f.t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		f.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	f.t.Fatalf("no metric %s", name)
	return 0
}

// readChunk reads once from body and returns the bytes.
func readChunk(t *testing.T, body io.Reader) string {
	t.Helper()
	buf := make([]byte, 1024)
	n, err := body.Read(buf)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	return string(buf[:n])
}

var idPattern = regexp.MustCompile(`^dev:[0-9a-f]{32}$`)

func TestEachRequestGoesToExactlyOnePoll(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, testConfig())
		const polls, requests = 5, 3
		var pcs []<-chan pollResult
		for range polls {
			pcs = append(pcs, f.poll(t.Context(), dev, "agent", ""))
		}
		synctest.Wait()
		var rcs []<-chan rtResult
		for i := range requests {
			rcs = append(rcs, f.roundTrip(userReq(dev, fmt.Sprintf("/r%d?x=1", i), strings.NewReader(fmt.Sprint("body", i)))))
		}
		synctest.Wait()

		byPath := map[string]*broker.Exchange{}
		var waiting []<-chan pollResult
		for _, pc := range pcs {
			select {
			case p := <-pc:
				if p.err != nil {
					t.Fatalf("poll: %v", p.err)
				}
				msg, err := wire.UnmarshalRequest(p.ex.Message(), 1<<20)
				if err != nil {
					t.Fatalf("decode handed request: %v", err)
				}
				if msg.ID != p.ex.ID || !idPattern.MatchString(p.ex.ID) || p.ex.Device != dev {
					t.Fatalf("exchange id %q (message id %q, device %q), want dev:<32 hex>", p.ex.ID, msg.ID, p.ex.Device)
				}
				if byPath[msg.URL] != nil {
					t.Fatalf("request %s handed to two polls", msg.URL)
				}
				byPath[msg.URL] = p.ex
				if msg.Method != http.MethodPost || !strings.HasPrefix(string(msg.Body), "body") {
					t.Fatalf("handed request %s %s body %q", msg.Method, msg.URL, msg.Body)
				}
			default:
				waiting = append(waiting, pc)
			}
		}
		if len(byPath) != requests || len(waiting) != polls-requests {
			t.Fatalf("%d polls got a request and %d wait, want %d and %d", len(byPath), len(waiting), requests, polls-requests)
		}
		for i, rc := range rcs {
			ex := byPath[fmt.Sprintf("http://invalid/r%d?x=1", i)]
			if ex == nil {
				t.Fatalf("request %d was not handed out as http://invalid/r%d?x=1: %v", i, i, byPath)
			}
			r := head(ex.ID, http.StatusOK)
			r.Body, r.EOF = []byte(fmt.Sprint("answer", i)), true
			if err := f.b.Deliver(t.Context(), "agent", r); err != nil {
				t.Fatalf("deliver: %v", err)
			}
			res := now(t, rc)
			if res.err != nil {
				t.Fatalf("RoundTrip %d: %v", i, res.err)
			}
			body, err := io.ReadAll(res.resp.Body)
			res.resp.Body.Close()
			if err != nil || string(body) != fmt.Sprint("answer", i) {
				t.Fatalf("request %d got %q, %v", i, body, err)
			}
		}
		// The polls that got nothing end at the poll wait.
		for _, pc := range waiting {
			if p := <-pc; !errors.Is(p.err, broker.ErrPollTimeout) || p.took != testConfig().PollWait {
				t.Fatalf("idle poll ended with %v after %v, want ErrPollTimeout after %v", p.err, p.took, testConfig().PollWait)
			}
		}
		if got := f.gauge("switchboard_broker_active_requests"); got != 0 {
			t.Fatalf("active requests gauge %v after every response closed, want 0", got)
		}
	})
}

func TestManyPollsManyRequestsEachHandedOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, testConfig())
		const n = 50
		seen := make(chan string, 2*n)
		done := make(chan struct{})
		for range n {
			go func() {
				p := <-f.poll(t.Context(), dev, "agent", "")
				if p.err != nil {
					t.Errorf("poll: %v", p.err)
					return
				}
				seen <- p.ex.ID
				r := head(p.ex.ID, http.StatusNoContent)
				r.EOF = true
				if err := f.b.Deliver(t.Context(), "agent", r); err != nil {
					t.Errorf("deliver: %v", err)
				}
			}()
		}
		synctest.Wait()
		go func() {
			defer close(done)
			var rcs []<-chan rtResult
			for range n {
				rcs = append(rcs, f.roundTrip(userReq(dev, "/", nil)))
			}
			for _, rc := range rcs {
				r := <-rc
				if r.err != nil {
					t.Errorf("RoundTrip: %v", r.err)
					continue
				}
				r.resp.Body.Close()
			}
		}()
		<-done
		ids := map[string]int{}
		for range n {
			ids[<-seen]++
		}
		for id, k := range ids {
			if k != 1 {
				t.Fatalf("request %s handed out %d times", id, k)
			}
		}
		if len(ids) != n {
			t.Fatalf("%d distinct requests handed out, want %d", len(ids), n)
		}
	})
}

func TestPollEndsAfterPollWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, testConfig())
		p := <-f.poll(t.Context(), dev, "", "")
		if !errors.Is(p.err, broker.ErrPollTimeout) || p.took != 30*time.Second {
			t.Fatalf("poll ended with %v after %v, want ErrPollTimeout after 30s", p.err, p.took)
		}
	})
}

func TestPollEndsWhenAgentGoesAway(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, testConfig())
		ctx, cancel := context.WithCancel(t.Context())
		pc := f.poll(ctx, dev, "", "")
		elapse(5 * time.Second)
		cancel()
		if p := now(t, pc); !errors.Is(p.err, context.Canceled) || p.took != 5*time.Second {
			t.Fatalf("poll ended with %v after %v, want context.Canceled after 5s", p.err, p.took)
		}
	})
}

func TestUnknownDeviceFailsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, testConfig())
		r := now(t, f.roundTrip(userReq("ghost", "/", nil)))
		be := brokerError(t, r.err, http.StatusServiceUnavailable)
		if !errors.Is(r.err, broker.ErrNoAgent) || be.RetryAfter <= 0 || !strings.Contains(be.Message, `"ghost"`) {
			t.Fatalf("got %+v, want ErrNoAgent with Retry-After naming the device", be)
		}
		if r.took != 0 {
			t.Fatalf("a device never seen took %v to answer, want at once", r.took)
		}
	})
}

func TestDeviceWhoseAgentLeftFailsAfterNoAgentGrace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, testConfig())
		f.connect(dev)
		elapse(time.Minute) // the agent is gone, but not forgotten
		r := <-f.roundTrip(userReq(dev, "/", nil))
		be := brokerError(t, r.err, http.StatusServiceUnavailable)
		if !errors.Is(r.err, broker.ErrNoAgent) || be.RetryAfter <= 0 {
			t.Fatalf("got %+v, want ErrNoAgent with Retry-After", be)
		}
		if r.took != 2*time.Second {
			t.Fatalf("answered after %v, want the no-agent grace (2s)", r.took)
		}
	})
}

func TestAgentReturningWithinGraceTakesTheRequest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, testConfig())
		f.connect(dev)
		elapse(time.Minute)
		rc := f.roundTrip(userReq(dev, "/", nil))
		elapse(1500 * time.Millisecond) // the agent reconnects
		p := now(t, f.poll(t.Context(), dev, "", ""))
		if p.err != nil {
			t.Fatalf("poll: %v", p.err)
		}
		if err := f.b.Deliver(t.Context(), "", head(p.ex.ID, http.StatusOK)); err != nil {
			t.Fatal(err)
		}
		r := now(t, rc)
		if r.err != nil {
			t.Fatalf("RoundTrip: %v", r.err)
		}
		r.resp.Body.Close()
	})
}

func TestBusyAgentGetsThePickupTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, testConfig())
		_, _ = f.take("agent", "", userReq(dev, "/a", nil)) // the agent's only poll is busy with /a
		r := <-f.roundTrip(userReq(dev, "/b", nil))
		be := brokerError(t, r.err, http.StatusServiceUnavailable)
		if !errors.Is(r.err, broker.ErrNoAgent) || be.RetryAfter <= 0 || !strings.Contains(be.Message, "picked up") {
			t.Fatalf("got %+v, want a pickup ErrNoAgent with Retry-After", be)
		}
		if r.took != 10*time.Second {
			t.Fatalf("answered after %v, want the pickup timeout (10s)", r.took)
		}
	})
}

func TestBusyAgentPollingAgainWithinPickupTakesTheRequest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, testConfig())
		_, _ = f.take("agent", "", userReq(dev, "/a", nil))
		rc := f.roundTrip(userReq(dev, "/b", nil))
		elapse(9 * time.Second) // longer than the no-agent grace, within the pickup timeout
		p := now(t, f.poll(t.Context(), dev, "agent", ""))
		if p.err != nil {
			t.Fatalf("poll: %v", p.err)
		}
		if err := f.b.Deliver(t.Context(), "agent", head(p.ex.ID, http.StatusOK)); err != nil {
			t.Fatal(err)
		}
		if r := now(t, rc); r.err != nil {
			t.Fatalf("RoundTrip: %v", r.err)
		} else {
			r.resp.Body.Close()
		}
	})
}

func TestUserGivingUpBeforePickupIsSkippedByPolls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, testConfig())
		f.connect(dev)
		ctx, cancel := context.WithCancel(t.Context())
		req := userReq(dev, "/", nil).WithContext(ctx)
		rc := f.roundTrip(req)
		pending(t, rc, "RoundTrip")
		cancel()
		if r := now(t, rc); !errors.Is(r.err, context.Canceled) {
			t.Fatalf("RoundTrip: %v, want context.Canceled", r.err)
		}
		p := <-f.poll(t.Context(), dev, "", "")
		if !errors.Is(p.err, broker.ErrPollTimeout) {
			t.Fatalf("poll got %v, %v; want nothing (ErrPollTimeout): the user went away", p.ex, p.err)
		}
	})
}

func TestUnusableFirstChunkIsBadGateway(t *testing.T) {
	for _, tc := range []struct {
		name  string
		first func(id string) *wire.Response
	}{
		{"no status", func(id string) *wire.Response { return &wire.Response{ID: id, Body: []byte("x")} }},
		{"status 42", func(id string) *wire.Response { return head(id, 42) }},
		{"status 100", func(id string) *wire.Response { return head(id, 100) }},
		{"status 1000", func(id string) *wire.Response { return head(id, 1000) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				f := newFixture(t, testConfig())
				ex, rc := f.take("agent", "", userReq(dev, "/", nil))
				if err := f.b.Deliver(t.Context(), "agent", tc.first(ex.ID)); err != nil {
					t.Fatal(err)
				}
				brokerError(t, now(t, rc).err, http.StatusBadGateway)
				if err := f.b.Deliver(t.Context(), "agent", &wire.Response{ID: ex.ID, EOF: true}); !errors.Is(err, broker.ErrUnknownRequest) {
					t.Fatalf("a chunk after the 502: %v, want ErrUnknownRequest", err)
				}
			})
		})
	}
}

func TestSilentAgentIsGatewayTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, testConfig())
		_, rc := f.take("agent", "", userReq(dev, "/", nil))
		r := <-rc
		brokerError(t, r.err, http.StatusGatewayTimeout)
		if !errors.Is(r.err, broker.ErrTimeout) || r.took != 60*time.Second {
			t.Fatalf("got %v after %v, want ErrTimeout after the inactive request timeout (60s)", r.err, r.took)
		}
	})
}

func TestSilenceMidResponseIsGatewayTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, testConfig())
		ex, resp := f.open("agent", userReq(dev, "/", nil))
		defer resp.Body.Close()
		go func() {
			elapse(59 * time.Second) // just inside the timeout: keeps the response alive
			f.b.Deliver(t.Context(), "agent", &wire.Response{ID: ex.ID, Body: []byte("a")})
		}()
		if got := readChunk(t, resp.Body); got != "a" {
			t.Fatalf("read %q, want a", got)
		}
		start := time.Now()
		_, err := resp.Body.Read(make([]byte, 8))
		brokerError(t, err, http.StatusGatewayTimeout)
		if took := time.Since(start); !errors.Is(err, broker.ErrTimeout) || took != 60*time.Second {
			t.Fatalf("read ended with %v after %v, want ErrTimeout after 60s", err, took)
		}
	})
}

func TestChunksStreamInOrderPacedByTheUser(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, testConfig())
		ex, resp := f.open("agent", userReq(dev, "/", nil), "Content-Type", "text/event-stream", "X-Multi", "1", "X-Multi", "2")
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" ||
			!slices.Equal(resp.Header.Values("X-Multi"), []string{"1", "2"}) || resp.ContentLength != -1 {
			t.Fatalf("response %d %v (length %d)", resp.StatusCode, resp.Header, resp.ContentLength)
		}
		for _, piece := range []string{"one", "two", "three"} {
			dc := f.deliver("agent", &wire.Response{ID: ex.ID, Body: []byte(piece)})
			pending(t, dc, "Deliver before the user read") // flow control: the agent waits for the user
			if got := readChunk(t, resp.Body); got != piece {
				t.Fatalf("read %q, want %q", got, piece)
			}
			if err := now(t, dc); err != nil {
				t.Fatalf("deliver %q: %v", piece, err)
			}
		}
		dc := f.deliver("agent", &wire.Response{ID: ex.ID, EOF: true})
		if n, err := resp.Body.Read(make([]byte, 8)); n != 0 || err != io.EOF {
			t.Fatalf("read after the last chunk: %d, %v; want io.EOF", n, err)
		}
		if err := now(t, dc); err != nil {
			t.Fatal(err)
		}
	})
}

func TestContentLengthFromTheAgent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, testConfig())
		ex, rc := f.take("agent", "", userReq(dev, "/", nil))
		first := head(ex.ID, http.StatusOK, "Content-Length", "5")
		first.Body, first.EOF = []byte("hello"), true
		if err := f.b.Deliver(t.Context(), "agent", first); err != nil {
			t.Fatal(err)
		}
		r := now(t, rc)
		if r.err != nil {
			t.Fatal(r.err)
		}
		defer r.resp.Body.Close()
		body, err := io.ReadAll(r.resp.Body)
		if r.resp.ContentLength != 5 || string(body) != "hello" || err != nil {
			t.Fatalf("length %d body %q err %v", r.resp.ContentLength, body, err)
		}
	})
}

// The broker announces and merges trailers; it passes Grpc-* headers through
// as headers (the relay's reverse proxy promotes a trailers-only answer).
func TestTrailersAnnouncedAndMerged(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, testConfig())
		ex, resp := f.open("agent", userReq(dev, "/", nil),
			"Trailer", "X-Checksum, x-late", "Trailer", wire.AbortTrailer,
			"Content-Type", "application/grpc", "Grpc-Status", "0", "Grpc-Message", "fine")
		defer resp.Body.Close()
		if resp.Header.Get("Trailer") != "" {
			t.Fatalf("the Trailer header reached the user: %v", resp.Header)
		}
		if resp.Header.Get("Content-Type") != "application/grpc" || resp.Header.Get("Grpc-Status") != "0" || resp.Header.Get("Grpc-Message") != "fine" {
			t.Fatalf("headers %v, want them passed through", resp.Header)
		}
		for _, k := range []string{"X-Checksum", "X-Late"} {
			if v, ok := resp.Trailer[k]; !ok || len(v) != 0 {
				t.Fatalf("announced trailer %s = %v (present %v), want announced and empty; trailers %v", k, v, ok, resp.Trailer)
			}
		}
		if _, ok := resp.Trailer[wire.AbortTrailer]; ok {
			t.Fatalf("the abort trailer was announced to the user: %v", resp.Trailer)
		}
		go func() {
			f.b.Deliver(t.Context(), "agent", &wire.Response{ID: ex.ID, Body: []byte("ab"),
				Trailer: []wire.Header{{Name: "X-Checksum", Value: "part1"}}})
			f.b.Deliver(t.Context(), "agent", &wire.Response{ID: ex.ID, Body: []byte("cd"), EOF: true,
				Trailer: []wire.Header{{Name: "x-checksum", Value: "part2"}, {Name: "X-Late", Value: "late"}}})
		}()
		body, err := io.ReadAll(resp.Body)
		if err != nil || string(body) != "abcd" {
			t.Fatalf("body %q, %v", body, err)
		}
		if got := resp.Trailer.Values("X-Checksum"); !slices.Equal(got, []string{"part1", "part2"}) {
			t.Fatalf("X-Checksum trailers %q, want both chunks' values in order", got)
		}
		if resp.Trailer.Get("X-Late") != "late" || len(resp.Trailer) != 2 {
			t.Fatalf("trailers %v", resp.Trailer)
		}
	})
}

func TestAbortTrailerBreaksTheBody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, testConfig())
		ex, resp := f.open("agent", userReq(dev, "/", nil))
		defer resp.Body.Close()
		go f.b.Deliver(t.Context(), "agent", &wire.Response{ID: ex.ID, Body: []byte("partial"), EOF: true,
			Trailer: []wire.Header{{Name: "X-Sum", Value: "1"}, {Name: "x-switchboard-abort", Value: "backend reset"}}})
		body, err := io.ReadAll(resp.Body)
		if string(body) != "partial" || !errors.Is(err, io.ErrUnexpectedEOF) || !strings.Contains(err.Error(), "backend reset") {
			t.Fatalf("body %q, err %v; want the bytes before the abort, then io.ErrUnexpectedEOF", body, err)
		}
		if _, ok := resp.Trailer[wire.AbortTrailer]; ok {
			t.Fatalf("the abort trailer reached the user: %v", resp.Trailer)
		}
	})
}

func TestUserCloseRefusesLaterChunks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, testConfig())
		ex, resp := f.open("agent", userReq(dev, "/", nil))
		blocked := f.deliver("agent", &wire.Response{ID: ex.ID, Body: []byte("unread")})
		pending(t, blocked, "Deliver nobody reads")
		resp.Body.Close()
		if err := now(t, blocked); !errors.Is(err, broker.ErrUnknownRequest) {
			t.Fatalf("blocked Deliver after the user closed: %v, want ErrUnknownRequest", err)
		}
		if err := f.b.Deliver(t.Context(), "agent", &wire.Response{ID: ex.ID, EOF: true}); !errors.Is(err, broker.ErrUnknownRequest) {
			t.Fatalf("Deliver after the user closed: %v, want ErrUnknownRequest", err)
		}
		if _, err := f.b.NextUpstream(t.Context(), "agent", ex.ID); !errors.Is(err, broker.ErrUnknownRequest) {
			t.Fatalf("NextUpstream after the user closed: %v, want ErrUnknownRequest", err)
		}
	})
}

func TestUnknownRequestIDs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, testConfig())
		for _, id := range []string{"", "dev:00000000000000000000000000000000"} {
			if err := f.b.Deliver(t.Context(), "", &wire.Response{ID: id, HasStatus: true, StatusCode: 200}); !errors.Is(err, broker.ErrUnknownRequest) {
				t.Fatalf("Deliver(%q): %v, want ErrUnknownRequest", id, err)
			}
			if _, err := f.b.NextUpstream(t.Context(), "", id); !errors.Is(err, broker.ErrUnknownRequest) {
				t.Fatalf("NextUpstream(%q): %v, want ErrUnknownRequest", id, err)
			}
		}
	})
}

func TestUpgradedStream(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, testConfig()) // BlockSize 10
		ex, rc := f.take("agent", "", userReq(dev, "/ws", nil))
		first := head(ex.ID, http.StatusSwitchingProtocols, "Upgrade", "echo", "Connection", "Upgrade")
		first.Body = []byte("hi ")
		if err := f.b.Deliver(t.Context(), "agent", first); err != nil {
			t.Fatal(err)
		}
		r := now(t, rc)
		if r.err != nil {
			t.Fatal(r.err)
		}
		resp := r.resp
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusSwitchingProtocols || resp.ContentLength != 0 || resp.Header.Get("Upgrade") != "echo" {
			t.Fatalf("response %d length %d %v", resp.StatusCode, resp.ContentLength, resp.Header)
		}
		rwc, ok := resp.Body.(io.ReadWriteCloser)
		if !ok {
			t.Fatalf("the body of a 101 is a %T, not an io.ReadWriteCloser", resp.Body)
		}

		// Agent → user.
		go f.b.Deliver(t.Context(), "agent", &wire.Response{ID: ex.ID, Body: []byte("there")})
		if got := readChunk(t, rwc) + readChunk(t, rwc); got != "hi there" {
			t.Fatalf("read %q", got)
		}

		// User → agent, in pieces of at most BlockSize.
		payload := "0123456789abcdefghijKLMNO"
		wc := make(chan error, 1)
		go func() {
			_, err := rwc.Write([]byte(payload))
			wc <- err
		}()
		var got []string
		for len(strings.Join(got, "")) < len(payload) {
			p, err := f.b.NextUpstream(t.Context(), "agent", ex.ID)
			if err != nil || len(p) == 0 || len(p) > 10 {
				t.Fatalf("NextUpstream: %q, %v; want 1..10 bytes", p, err)
			}
			got = append(got, string(p))
		}
		if !slices.Equal(got, []string{"0123456789", "abcdefghij", "KLMNO"}) {
			t.Fatalf("pieces %q", got)
		}
		if err := now(t, wc); err != nil {
			t.Fatalf("Write: %v", err)
		}

		// Nothing sent: an empty answer after the request stream wait.
		start := time.Now()
		p, err := f.b.NextUpstream(t.Context(), "agent", ex.ID)
		if p != nil || err != nil || time.Since(start) != 20*time.Second {
			t.Fatalf("idle NextUpstream: %q, %v after %v; want nothing after 20s", p, err, time.Since(start))
		}

		// The user half-closes.
		cw, ok := resp.Body.(interface{ CloseWrite() error })
		if !ok {
			t.Fatalf("the body of a 101 has no CloseWrite")
		}
		cw.CloseWrite()
		if _, err := f.b.NextUpstream(t.Context(), "agent", ex.ID); !errors.Is(err, broker.ErrStreamClosed) {
			t.Fatalf("NextUpstream after CloseWrite: %v, want ErrStreamClosed", err)
		}
		if _, err := rwc.Write([]byte("late")); !errors.Is(err, io.ErrClosedPipe) {
			t.Fatalf("Write after CloseWrite: %v, want io.ErrClosedPipe", err)
		}
		// The agent may still send until its end.
		go f.b.Deliver(t.Context(), "agent", &wire.Response{ID: ex.ID, Body: []byte("bye"), EOF: true})
		if rest, err := io.ReadAll(rwc); string(rest) != "bye" || err != nil {
			t.Fatalf("rest %q, %v", rest, err)
		}
	})
}

func TestAnotherAgentsRequest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, testConfig())
		ex, rc := f.take("agent-a", "", userReq(dev, "/", nil))
		if err := f.b.Deliver(t.Context(), "agent-b", head(ex.ID, http.StatusOK)); !errors.Is(err, broker.ErrNotYours) {
			t.Fatalf("Deliver by another agent: %v, want ErrNotYours", err)
		}
		if err := f.b.Deliver(t.Context(), "", head(ex.ID, http.StatusOK)); !errors.Is(err, broker.ErrNotYours) {
			t.Fatalf("Deliver by an anonymous agent: %v, want ErrNotYours", err)
		}
		if _, err := f.b.NextUpstream(t.Context(), "agent-b", ex.ID); !errors.Is(err, broker.ErrNotYours) {
			t.Fatalf("NextUpstream by another agent: %v, want ErrNotYours", err)
		}
		pending(t, rc, "RoundTrip") // nothing reached the user
		if err := f.b.Deliver(t.Context(), "agent-a", head(ex.ID, http.StatusOK)); err != nil {
			t.Fatalf("Deliver by the owner: %v", err)
		}
		now(t, rc).resp.Body.Close()
	})
}

func TestRequeueHandsTheRequestToAnotherPoll(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, testConfig())
		ex, rc := f.take("agent", "", userReq(dev, "/", nil))
		f.b.Requeue(ex) // writing it to the agent failed
		p := now(t, f.poll(t.Context(), dev, "agent", ""))
		if p.err != nil || p.ex.ID != ex.ID {
			t.Fatalf("poll after Requeue: %v, %v; want the same request", p.ex, p.err)
		}
		if err := f.b.Deliver(t.Context(), "agent", head(ex.ID, http.StatusOK)); err != nil {
			t.Fatal(err)
		}
		now(t, rc).resp.Body.Close()
	})
}

// TestRequeueWhileDrainingFailsAtOnce: a request whose write to the agent
// failed after the relay began to drain can never be picked up again; its
// user should get the draining 503 at once, not wait for the pickup timeout
// (or, when that already fired, the inactivity timeout, past any drain
// deadline).
func TestRequeueWhileDrainingFailsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, testConfig())
		ex, rc := f.take("agent", "", userReq(dev, "/", nil))
		elapse(15 * time.Second) // past the pickup timeout: the request had been taken
		f.b.Drain()
		pending(t, rc, "RoundTrip of a taken request")
		f.b.Requeue(ex)
		synctest.Wait()
		select {
		case r := <-rc:
			if !errors.Is(r.err, broker.ErrDraining) {
				t.Fatalf("RoundTrip: %v, want ErrDraining", r.err)
			}
		default:
			r := <-rc
			t.Fatalf("the requeued request of a draining broker waited %v more and ended with %v; want ErrDraining at once", r.took-15*time.Second, r.err)
		}
	})
}

func TestDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, testConfig())
		exA, respA := f.open("agent", userReq(dev, "/in-flight", nil)) // taken, streaming
		defer respA.Body.Close()
		queued := f.roundTrip(userReq(dev, "/queued", nil)) // no poll waiting for it
		idle := f.poll(t.Context(), "other", "agent2", "")  // a poll waiting for a request
		pending(t, queued, "queued RoundTrip")
		pending(t, idle, "idle poll")

		f.b.Drain()
		f.b.Drain() // idempotent
		if p := now(t, idle); !errors.Is(p.err, broker.ErrDraining) {
			t.Fatalf("waiting poll: %v, want ErrDraining", p.err)
		}
		r := now(t, queued)
		be := brokerError(t, r.err, http.StatusServiceUnavailable)
		if !errors.Is(r.err, broker.ErrDraining) || be.RetryAfter <= 0 {
			t.Fatalf("queued request: %+v, want ErrDraining with Retry-After", be)
		}
		r = now(t, f.roundTrip(userReq(dev, "/new", nil)))
		if be := brokerError(t, r.err, http.StatusServiceUnavailable); !errors.Is(r.err, broker.ErrDraining) || be.RetryAfter <= 0 {
			t.Fatalf("new request: %+v, want ErrDraining with Retry-After", be)
		}
		wait := make(chan error, 1)
		go func() { wait <- f.b.Wait(t.Context()) }()
		pending(t, wait, "Wait with a request in flight")

		// The request in flight runs to its end, however long it takes.
		elapse(45 * time.Second)
		go f.b.Deliver(t.Context(), "agent", &wire.Response{ID: exA.ID, Body: []byte("still "), Trailer: []wire.Header{{Name: "X-T", Value: "1"}}})
		go func() {
			elapse(45 * time.Second)
			f.b.Deliver(t.Context(), "agent", &wire.Response{ID: exA.ID, Body: []byte("here"), EOF: true})
		}()
		body, err := io.ReadAll(respA.Body)
		if string(body) != "still here" || err != nil || respA.Trailer.Get("X-T") != "1" {
			t.Fatalf("in-flight body %q, %v, trailers %v", body, err, respA.Trailer)
		}
		pending(t, wait, "Wait before the user closed the body")
		respA.Body.Close()
		if err := now(t, wait); err != nil {
			t.Fatalf("Wait: %v", err)
		}
		if err := f.b.Wait(t.Context()); err != nil {
			t.Fatalf("second Wait: %v", err)
		}
		if a, p := f.gauge("switchboard_broker_active_requests"), f.gauge("switchboard_broker_pending_requests"); a != 0 || p != 0 {
			t.Fatalf("active %v pending %v after the drain, want 0 and 0", a, p)
		}
	})
}

// TestPollDuringDrainIsHeldUntilIdle: agents poll again at once after a
// 408, so a poll that arrives during a drain must be held until nothing is in
// flight (then 408) rather than answered at once; otherwise every long-poll
// agent spins against the draining relay for the whole drain.
func TestPollDuringDrainIsHeldUntilIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, testConfig())
		_, resp := f.open("agent", userReq(dev, "/", nil))
		f.b.Drain()
		pc := f.poll(t.Context(), dev, "agent", "")
		elapse(5 * time.Second)
		select {
		case p := <-pc:
			t.Fatalf("a poll during the drain ended with %v after %v; want it held while a request is in flight", p.err, p.took)
		default:
		}
		resp.Body.Close()
		if p := now(t, pc); !errors.Is(p.err, broker.ErrDraining) {
			t.Fatalf("held poll once idle: %v, want ErrDraining", p.err)
		}
		if p := now(t, f.poll(t.Context(), dev, "agent", "")); !errors.Is(p.err, broker.ErrDraining) {
			t.Fatalf("poll of an idle draining broker: %v, want ErrDraining at once", p.err)
		}
	})
}

// TestDrainKeepsAStreamingAgentAlive: during a drain an agent's polls get
// no request, but the agent is alive and still streaming its answers; its
// requests must not be failed as those of a gone agent.
func TestDrainKeepsAStreamingAgentAlive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, testConfig())
		ex, resp := f.openInstance("inst-1")
		defer resp.Body.Close()
		waiting := f.poll(t.Context(), dev, "agent", "inst-1")
		synctest.Wait()
		f.b.Drain()
		if p := now(t, waiting); !errors.Is(p.err, broker.ErrDraining) {
			t.Fatalf("waiting poll: %v, want ErrDraining", p.err)
		}
		again := f.poll(t.Context(), dev, "agent", "inst-1") // the agent polls again at once
		elapse(10 * time.Second)
		go f.b.Deliver(t.Context(), "agent", &wire.Response{ID: ex.ID, Body: []byte("still streaming"), EOF: true})
		if body, err := io.ReadAll(resp.Body); string(body) != "still streaming" || err != nil {
			t.Fatalf("body %q, %v; want the stream intact through the drain", body, err)
		}
		resp.Body.Close()
		if p := now(t, again); !errors.Is(p.err, broker.ErrDraining) {
			t.Fatalf("poll during the drain: %v, want ErrDraining", p.err)
		}
	})
}

func TestWaitEndsWithItsContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, testConfig())
		_, resp := f.open("agent", userReq(dev, "/", nil))
		defer resp.Body.Close()
		f.b.Drain()
		ctx, cancel := context.WithTimeout(t.Context(), 25*time.Second)
		defer cancel()
		start := time.Now()
		if err := f.b.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) || time.Since(start) != 25*time.Second {
			t.Fatalf("Wait: %v after %v, want DeadlineExceeded after 25s", err, time.Since(start))
		}
	})
}

func TestWaitWithNothingInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, testConfig())
		f.b.Drain()
		if err := now(t, func() <-chan error {
			c := make(chan error, 1)
			go func() { c <- f.b.Wait(t.Context()) }()
			return c
		}()); err != nil {
			t.Fatal(err)
		}
	})
}

func TestCloseAbortsEverything(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, testConfig())
		exA, respA := f.open("agent", userReq(dev, "/streaming", nil))
		defer respA.Body.Close()
		_, waitingFirst := f.take("agent", "", userReq(dev, "/taken", nil))
		queued := f.roundTrip(userReq(dev, "/queued", nil))
		idle := f.poll(t.Context(), "other", "", "")
		blocked := f.deliver("agent", &wire.Response{ID: exA.ID, Body: []byte("unread")})
		pending(t, blocked, "Deliver nobody reads")

		f.b.Close()
		f.b.Close() // idempotent

		if err := now(t, blocked); !errors.Is(err, broker.ErrUnknownRequest) {
			t.Fatalf("blocked Deliver: %v, want ErrUnknownRequest", err)
		}
		if r := now(t, waitingFirst); r.err == nil {
			t.Fatal("a request waiting for its first chunk survived Close")
		}
		if r := now(t, queued); !errors.Is(r.err, broker.ErrDraining) {
			t.Fatalf("queued request: %v, want ErrDraining", r.err)
		}
		if p := now(t, idle); !errors.Is(p.err, broker.ErrDraining) {
			t.Fatalf("idle poll: %v, want ErrDraining", p.err)
		}
		if _, err := io.ReadAll(respA.Body); !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("reading a response cut by Close: %v, want io.ErrUnexpectedEOF", err)
		}
		if r := now(t, f.roundTrip(userReq(dev, "/", nil))); !errors.Is(r.err, broker.ErrDraining) {
			t.Fatalf("RoundTrip after Close: %v, want ErrDraining", r.err)
		}
		if err := f.b.Wait(t.Context()); err != nil {
			t.Fatalf("Wait after Close: %v", err)
		}
	})
}

func TestDroppedAgentInstanceFailsItsRequestsAfterGrace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, testConfig()) // AgentGoneGrace 1s
		ex, rc := f.take("agent", "inst-1", userReq(dev, "/stream", nil))
		_, waitingFirst := f.take("agent", "inst-1", userReq(dev, "/slow", nil))
		if err := f.b.Deliver(t.Context(), "agent", head(ex.ID, http.StatusOK)); err != nil {
			t.Fatal(err)
		}
		resp := now(t, rc).resp
		defer resp.Body.Close()

		// The agent's next poll loses its connection; no other poll follows.
		ctx, cancel := context.WithCancel(t.Context())
		pc := f.poll(ctx, dev, "agent", "inst-1")
		elapse(3 * time.Second) // the poll itself keeps the agent alive
		cancel()
		now(t, pc)
		dropped := time.Now()

		_, err := resp.Body.Read(make([]byte, 8))
		took := time.Since(dropped)
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("read from a dropped agent's stream: %v, want io.ErrUnexpectedEOF", err)
		}
		if took < time.Second || took > 1500*time.Millisecond {
			t.Fatalf("failed %v after the drop, want within [1s, 1.5s] (the grace plus one sweep)", took)
		}
		r := now(t, waitingFirst)
		if !errors.Is(r.err, io.ErrUnexpectedEOF) {
			t.Fatalf("request awaiting its first chunk: %v, want io.ErrUnexpectedEOF", r.err)
		}
	})
}

// TestAgentInstanceSilentAfterTakingARequestIsGone: Switchboard's agent polls
// again as soon as a poll returns, so an instance that took a request and then
// stopped polling died between two polls: its next poll never reached the
// relay, so no dropped connection was seen. Its requests must fail well
// before the inactivity timeout (a few graces: a loaded agent may be late).
// fleettest's TestAgentKilledMidStream/longpoll flaked on exactly this (about
// 1 run in 40 under -race) while only dropped polls counted.
func TestAgentInstanceSilentAfterTakingARequestIsGone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, testConfig())    // AgentGoneGrace 1s, InactiveRequestTimeout 60s
		_, resp := f.openInstance("inst-1") // its poll ended normally; no other poll follows
		defer resp.Body.Close()
		start := time.Now()
		_, err := resp.Body.Read(make([]byte, 8))
		took := time.Since(start)
		if !errors.Is(err, io.ErrUnexpectedEOF) || took < time.Second || took > 10*time.Second {
			t.Fatalf("read ended with %v after %v; want io.ErrUnexpectedEOF after more than the grace (1s) and well before the inactivity timeout (60s)", err, took)
		}
		t.Logf("a silent agent's request failed after %v", took)
	})
}

func TestAgentInstanceBackWithinGraceKeepsItsRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, testConfig())
		ex, resp := f.openInstance("inst-1")
		defer resp.Body.Close()
		ctx, cancel := context.WithCancel(t.Context())
		pc := f.poll(ctx, dev, "agent", "inst-1")
		synctest.Wait()
		cancel() // dropped...
		now(t, pc)
		elapse(500 * time.Millisecond)
		back := f.poll(t.Context(), dev, "agent", "inst-1") // ...and back within the grace
		elapse(10 * time.Second)
		go f.b.Deliver(t.Context(), "agent", &wire.Response{ID: ex.ID, Body: []byte("alive"), EOF: true})
		if body, err := io.ReadAll(resp.Body); string(body) != "alive" || err != nil {
			t.Fatalf("body %q, %v; want the stream intact", body, err)
		}
		pending(t, back, "the returned agent's poll")
	})
}

func TestAnonymousAgentDropWaitsForInactivity(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, testConfig())
		_, resp := f.open("agent", userReq(dev, "/", nil)) // no instance id
		defer resp.Body.Close()
		ctx, cancel := context.WithCancel(t.Context())
		pc := f.poll(ctx, dev, "agent", "")
		synctest.Wait()
		cancel()
		now(t, pc)
		start := time.Now()
		_, err := resp.Body.Read(make([]byte, 8))
		if !errors.Is(err, broker.ErrTimeout) || time.Since(start) != 60*time.Second {
			t.Fatalf("read: %v after %v; an agent without instance id is only noticed at the inactivity timeout (60s)", err, time.Since(start))
		}
	})
}

// openInstance takes a request by agent instance id and answers its head.
func (f *fixture) openInstance(instance string) (*broker.Exchange, *http.Response) {
	f.t.Helper()
	ex, rc := f.take("agent", instance, userReq(dev, "/", nil))
	if err := f.b.Deliver(f.t.Context(), "agent", head(ex.ID, http.StatusOK)); err != nil {
		f.t.Fatal(err)
	}
	r := now(f.t, rc)
	if r.err != nil {
		f.t.Fatal(r.err)
	}
	return ex, r.resp
}

func TestFullQueueIsServiceUnavailableWithRetryAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.MaxPendingPerDevice = 2
		f := newFixture(t, cfg)
		_, _ = f.take("agent", "", userReq(dev, "/busy", nil)) // the agent is connected and busy
		q1 := f.roundTrip(userReq(dev, "/1", nil))
		q2 := f.roundTrip(userReq(dev, "/2", nil))
		pending(t, q1, "first queued request")
		pending(t, q2, "second queued request")
		if got := f.gauge("switchboard_broker_pending_requests"); got != 2 {
			t.Fatalf("pending gauge %v, want 2", got)
		}
		r := now(t, f.roundTrip(userReq(dev, "/3", nil)))
		be := brokerError(t, r.err, http.StatusServiceUnavailable)
		if be.RetryAfter <= 0 || be.RetryAfterDelay() != be.RetryAfter {
			t.Fatalf("full queue: %+v, want Retry-After", be)
		}
		// The queue frees up as the agent takes requests.
		p := now(t, f.poll(t.Context(), dev, "agent", ""))
		if p.err != nil {
			t.Fatal(p.err)
		}
		q3 := f.roundTrip(userReq(dev, "/3", nil))
		pending(t, q3, "a request queued once there was room")
	})
}

func TestRequestBodyLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.MaxBodyBytes = 10
		f := newFixture(t, cfg)
		f.connect(dev)

		tooBig := userReq(dev, "/", strings.NewReader("12345678901")) // Content-Length 11
		brokerError(t, now(t, f.roundTrip(tooBig)).err, http.StatusRequestEntityTooLarge)

		chunked := userReq(dev, "/", io.NopCloser(strings.NewReader("12345678901"))) // length unknown
		chunked.ContentLength = -1
		brokerError(t, now(t, f.roundTrip(chunked)).err, http.StatusRequestEntityTooLarge)

		exact := userReq(dev, "/", io.NopCloser(strings.NewReader("1234567890")))
		exact.ContentLength = -1
		ex, rc := f.take("agent", "", exact)
		msg, err := wire.UnmarshalRequest(ex.Message(), 1<<10)
		if err != nil || string(msg.Body) != "1234567890" {
			t.Fatalf("handed body %q, %v", msg.Body, err)
		}
		f.b.Deliver(t.Context(), "agent", head(ex.ID, http.StatusOK))
		now(t, rc).resp.Body.Close()
	})
}

func TestDevicesForgottenAfterInactiveBackendTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, testConfig()) // InactiveBackendTimeout 30m
		f.connect(dev)
		if got := f.b.Devices(); !slices.Equal(got, []string{dev}) {
			t.Fatalf("Devices = %v, want [dev]", got)
		}
		elapse(30*time.Minute - time.Second)
		if got := f.b.Devices(); !slices.Equal(got, []string{dev}) {
			t.Fatalf("Devices just before the timeout = %v, want [dev]", got)
		}
		elapse(time.Second)
		if got := f.b.Devices(); len(got) != 0 {
			t.Fatalf("Devices after the timeout = %v, want none", got)
		}
		r := now(t, f.roundTrip(userReq(dev, "/", nil)))
		if !errors.Is(r.err, broker.ErrNoAgent) || r.took != 0 {
			t.Fatalf("request for a forgotten device: %v after %v, want ErrNoAgent at once", r.err, r.took)
		}
		elapse(time.Minute) // one sweep
		if got := f.gauge("switchboard_broker_devices"); got != 0 {
			t.Fatalf("devices gauge %v after the sweep, want 0 (the record is dropped)", got)
		}
	})
}

// TestDeviceWithExpiredRequestsIsForgotten: requests that gave up waiting
// for an agent leave their exchanges in the device's queue, where only a poll
// takes them out. A device whose agent never came back keeps its record and
// up to MaxPendingPerDevice request bodies (64 × 64 MiB by default) forever.
func TestDeviceWithExpiredRequestsIsForgotten(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, testConfig())
		f.connect(dev)
		elapse(time.Minute)
		if r := <-f.roundTrip(userReq(dev, "/", strings.NewReader("a body held in memory"))); !errors.Is(r.err, broker.ErrNoAgent) {
			t.Fatalf("RoundTrip: %v, want ErrNoAgent", r.err)
		}
		elapse(31 * time.Minute) // past the inactive backend timeout and a sweep
		if got := f.gauge("switchboard_broker_devices"); got != 0 {
			t.Errorf("devices gauge %v half an hour after the agent left, want 0: the expired request pins the device record", got)
		}
	})
}

// TestExpiredRequestsDoNotFillTheQueue: after MaxPendingPerDevice requests
// for a device whose agent left have each waited the no-agent grace and
// failed, the next one must fail the same way, not as "N requests waiting
// already" (which also counts it as "rejected" instead of "no_agent").
func TestExpiredRequestsDoNotFillTheQueue(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := testConfig()
		cfg.MaxPendingPerDevice = 2
		f := newFixture(t, cfg)
		f.connect(dev)
		elapse(time.Minute)
		for i := range 3 {
			r := <-f.roundTrip(userReq(dev, "/", nil))
			if !errors.Is(r.err, broker.ErrNoAgent) {
				t.Fatalf("request %d: %v (after %v), want ErrNoAgent after the no-agent grace; no request is waiting any more", i, r.err, r.took)
			}
		}
	})
}

func TestConfigDefaultsAndValidation(t *testing.T) {
	var c broker.Config
	c.Complete()
	if c.PollWait != 30*time.Second || c.NoAgentGrace != 2*time.Second || c.PickupTimeout != 10*time.Second ||
		c.InactiveRequestTimeout != time.Minute || c.InactiveBackendTimeout != 30*time.Minute ||
		c.RequestStreamWait != 30*time.Second || c.AgentGoneGrace != time.Second || c.MaxPendingPerDevice != 64 ||
		c.MaxBodyBytes != 64<<20 || c.BlockSize != 10240 || c.Logger == nil {
		t.Fatalf("defaults %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
	bad := testConfig()
	bad.PickupTimeout = 2 * bad.InactiveRequestTimeout
	bad.BlockSize = -1
	_, err := broker.New(bad)
	fields := config.Fields(err)
	if len(fields) != 2 || fields[0].Field != "BlockSize" || fields[1].Field != "PickupTimeout" || fields[0].Component != "broker" {
		t.Fatalf("New with bad config: %v, want both problems named by their fields", err)
	}
}

// TestForgetDeviceDuringPoll forgets a device while its agent's poll waits
// (the device moved to another relay): the poll ends at once, the broker
// stays usable, and the next poll counts the agent again.
func TestForgetDeviceDuringPoll(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, testConfig())
		done := make(chan error, 1)
		go func() {
			_, err := f.b.Poll(context.Background(), dev, "", "instance-1")
			done <- err
		}()
		synctest.Wait()
		if !f.b.HasAgent(dev) {
			t.Fatal("the polling agent is not counted")
		}
		f.b.ForgetDevice(dev)
		synctest.Wait()
		select {
		case err := <-done:
			if !errors.Is(err, broker.ErrPollTimeout) {
				t.Fatalf("poll ended with %v, want ErrPollTimeout", err)
			}
		default:
			t.Fatal("the waiting poll did not end")
		}
		if f.b.HasAgent(dev) || f.b.Remembers(dev) {
			t.Error("a forgotten device still counts as having an agent")
		}
		ctx, cancel := context.WithCancel(context.Background())
		go f.b.Poll(ctx, dev, "", "instance-1")
		synctest.Wait()
		if !f.b.HasAgent(dev) {
			t.Error("a new poll after the forget is not counted")
		}
		cancel()
		synctest.Wait()
	})
}

// TestFailAgentEndsWhatARevokedAgentTook checks that revoking an agent's
// credential fails the requests it took and is answering (before and after
// the response head), and leaves other agents' requests alone.
func TestFailAgentEndsWhatARevokedAgentTook(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, testConfig())
		revoked := errors.New("revoked")
		_, pending := f.take("agent-a", "", userReq(dev, "/pending", nil))
		_, streaming := f.open("agent-a", userReq(dev, "/stream", nil))
		otherEx, otherRC := f.take("agent-b", "", userReq(dev, "/other", nil))
		if n := f.b.FailAgent("agent-a", &broker.Error{Status: http.StatusBadGateway, Err: revoked, Message: "revoked"}); n != 2 {
			t.Fatalf("FailAgent failed %d requests, want 2", n)
		}
		synctest.Wait()
		if r := now(t, pending); !errors.Is(r.err, revoked) {
			t.Errorf("request not yet answered: %v, want the revocation", r.err)
		}
		if _, err := io.ReadAll(streaming.Body); !errors.Is(err, revoked) {
			t.Errorf("streamed body: %v, want the revocation", err)
		}
		if f.b.FailAgent("", revoked) != 0 {
			t.Error("anonymous agents matched")
		}
		if err := f.b.Deliver(t.Context(), "agent-b", head(otherEx.ID, http.StatusOK)); err != nil {
			t.Fatalf("another agent's request: %v", err)
		}
		if r := now(t, otherRC); r.err != nil {
			t.Errorf("another agent's request: %v", r.err)
		}
	})
}
