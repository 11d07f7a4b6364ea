package fleettest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/coder/websocket"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/switchboard-relay/switchboard/internal/agent"
	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/node"
	"github.com/switchboard-relay/switchboard/internal/testkit"
)

// The compatibility run puts the reference http-relay pair
// (googlecloudrobotics/core: http-relay-server and http-relay-client, built
// outside this repository) beside ours and runs the same end-to-end cases
// through each combination. docs/design/long-poll-relay.md says how to run it.
const (
	envReferenceAgent = "SWITCHBOARD_REFERENCE_AGENT" // path of an http-relay-client binary
	envReferenceRelay = "SWITCHBOARD_REFERENCE_RELAY" // path of an http-relay-server binary
)

// compatCaseTimeout bounds one case through one pair.
const compatCaseTimeout = 8 * time.Second

// Device names of the two agents every pair runs: one in front of an
// HTTP/1.1 backend, one in front of a gRPC backend (h2c).
const (
	compatWeb  = "web"
	compatGRPC = "grpc"
)

// compatEnv is what a case needs to reach the devices through one pair.
type compatEnv struct {
	base    string      // the relay's public base URL
	creds   http.Header // added to every user request (our relay's user token)
	client  *http.Client
	grpc    testgrpc.TestServiceClient
	grpcMD  []string // metadata of every gRPC call
	backend *testBackend
}

// compatPair starts one relay and the two agents in front of fresh
// backends, and returns when both devices answer.
type compatPair struct {
	name    string
	ourSide bool // our relay or our agent takes part
	start   func(t *testing.T, bins referenceBinaries, web *testBackend, grpcAddr string) *compatEnv
}

type referenceBinaries struct{ agent, relay string }

var compatPairs = []compatPair{
	{"ref agent, ref relay", false, func(t *testing.T, bins referenceBinaries, web *testBackend, grpcAddr string) *compatEnv {
		relay := startReferenceRelay(t, bins.relay)
		startReferenceAgent(t, bins.agent, relay, compatWeb, web.Listener.Addr().String(), false)
		startReferenceAgent(t, bins.agent, relay, compatGRPC, grpcAddr, true)
		return waitReady(t, newCompatEnv(t, relay, nil, web))
	}},
	{"ref agent, our relay", true, func(t *testing.T, bins referenceBinaries, web *testBackend, grpcAddr string) *compatEnv {
		r := StartRelay(t, func(c *node.Config) { c.AllowAnonymousAgents = true })
		startReferenceAgent(t, bins.agent, r.URL, compatWeb, web.Listener.Addr().String(), false)
		startReferenceAgent(t, bins.agent, r.URL, compatGRPC, grpcAddr, true)
		return waitReady(t, newCompatEnv(t, r.URL, ourUser(t, r), web))
	}},
	{"our long-poll agent, ref relay", true, func(t *testing.T, bins referenceBinaries, web *testBackend, grpcAddr string) *compatEnv {
		relay := startReferenceRelay(t, bins.relay)
		startOurAgents(t, &Relay{URL: relay}, agent.ProtocolLongPoll, "", "", web, grpcAddr)
		return waitReady(t, newCompatEnv(t, relay, nil, web))
	}},
	{"our long-poll agent, our relay", true, func(t *testing.T, bins referenceBinaries, web *testBackend, grpcAddr string) *compatEnv {
		r := StartRelay(t)
		startOurAgents(t, r, agent.ProtocolLongPoll, r.Token(t, auth.KindAgent, "web", compatWeb), r.Token(t, auth.KindAgent, "grpc", compatGRPC), web, grpcAddr)
		return waitReady(t, newCompatEnv(t, r.URL, ourUser(t, r), web))
	}},
	{"our native agent, our relay", true, func(t *testing.T, bins referenceBinaries, web *testBackend, grpcAddr string) *compatEnv {
		r := StartRelay(t)
		startOurAgents(t, r, agent.ProtocolNative, r.Token(t, auth.KindAgent, "web", compatWeb), r.Token(t, auth.KindAgent, "grpc", compatGRPC), web, grpcAddr)
		return waitReady(t, newCompatEnv(t, r.URL, ourUser(t, r), web))
	}},
}

// TestCompatibilityWithReference runs every case through every pair, prints
// the table of results, and fails when a case that passes through the
// reference pair fails through a pair with our relay or our agent in it. A
// case that fails through the reference pair itself is not held against us.
func TestCompatibilityWithReference(t *testing.T) {
	bins := referenceBinaries{agent: os.Getenv(envReferenceAgent), relay: os.Getenv(envReferenceRelay)}
	if bins.agent == "" || bins.relay == "" {
		t.Skipf("set %s and %s to the paths of the reference http-relay-client and http-relay-server binaries to run the compatibility cases (docs/design/long-poll-relay.md)", envReferenceAgent, envReferenceRelay)
	}
	for _, p := range []string{bins.agent, bins.relay} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("reference binary: %v", err)
		}
	}
	cases := compatCases()
	results := make([][]error, len(compatPairs)) // [pair][case]
	for i := range results {
		results[i] = make([]error, len(cases))
		for j := range cases {
			results[i][j] = errors.New("not run: the pair did not start")
		}
	}
	for i, p := range compatPairs {
		t.Run(p.name, func(t *testing.T) {
			web := newBackend(t, p.name)
			web.Config.Handler = compatBackendHandler(web.Config.Handler)
			env := p.start(t, bins, web, startInteropGRPC(t))
			for j, c := range cases {
				ctx, cancel := context.WithTimeout(context.Background(), compatCaseTimeout)
				results[i][j] = c.run(ctx, env)
				cancel()
			}
		})
	}

	var table strings.Builder
	tw := tabwriter.NewWriter(&table, 0, 4, 2, ' ', 0)
	fmt.Fprint(tw, "case")
	for _, p := range compatPairs {
		fmt.Fprintf(tw, "\t%s", p.name)
	}
	fmt.Fprintln(tw)
	var errs []string
	for j, c := range cases {
		fmt.Fprint(tw, c.name)
		for i, p := range compatPairs {
			err := results[i][j]
			cell := "pass"
			if err != nil {
				cell = "FAIL"
				errs = append(errs, fmt.Sprintf("%s / %s: %v", c.name, p.name, err))
			}
			fmt.Fprintf(tw, "\t%s", cell)
			if err != nil && p.ourSide && results[0][j] == nil {
				t.Errorf("%q passes through the reference pair but fails through %q: %v", c.name, p.name, err)
			}
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	t.Logf("compatibility with the reference http-relay pair:\n%s\nfailures:\n  %s", table.String(), strings.Join(errs, "\n  "))
}

// compatBackendHandler adds answers of chosen statuses and a redirect to the
// test backend's handler.
func compatBackendHandler(next http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/status/{code}", func(w http.ResponseWriter, r *http.Request) {
		code, _ := strconv.Atoi(r.PathValue("code"))
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(code)
		fmt.Fprintf(w, "status %d from the backend\n", code)
	})
	mux.HandleFunc("/redirect", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/elsewhere", http.StatusFound)
	})
	mux.Handle("/", next)
	return mux
}

// compatCase is one user request (or call) through a pair.
type compatCase struct {
	name string
	run  func(ctx context.Context, e *compatEnv) error
}

func compatCases() []compatCase {
	cases := []compatCase{
		{"GET small", func(ctx context.Context, e *compatEnv) error {
			echo, err := e.echo(ctx, http.MethodGet, "/echo/hi", nil, nil)
			if err == nil && echo.Path != "/echo/hi" {
				err = fmt.Errorf("backend saw path %q", echo.Path)
			}
			return err
		}},
		{"query string", func(ctx context.Context, e *compatEnv) error {
			const q = "a=1&a=2&b=%20x%2Fy&c=&d=%E2%9C%93"
			echo, err := e.echo(ctx, http.MethodGet, "/echo/q?"+q, nil, nil)
			if err == nil && echo.Query != q {
				err = fmt.Errorf("backend saw query %q, want %q", echo.Query, q)
			}
			return err
		}},
		{"headers, one empty", func(ctx context.Context, e *compatEnv) error {
			h := http.Header{"X-Empty": {""}, "X-Multi": {"one", "two"}, "X-Plain": {"value"}}
			echo, err := e.echo(ctx, http.MethodGet, "/echo/headers", nil, h)
			if err != nil {
				return err
			}
			for k, want := range h {
				if got := echo.Header[k]; strings.Join(got, "|") != strings.Join(want, "|") || len(got) != len(want) {
					return fmt.Errorf("backend saw %s %q, want %q", k, got, want)
				}
			}
			return nil
		}},
		{"POST echo small", func(ctx context.Context, e *compatEnv) error {
			return e.postEcho(ctx, "hello, relay")
		}},
		{"POST echo 1 MiB", func(ctx context.Context, e *compatEnv) error {
			return e.postEcho(ctx, strings.Repeat("0123456789abcdef", 1<<16))
		}},
		{"streamed response", func(ctx context.Context, e *compatEnv) error {
			resp, err := e.do(ctx, http.MethodGet, "/sse", nil, nil)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("status %s", resp.Status)
			}
			br := bufio.NewReader(resp.Body)
			for i := 1; i <= 3; i++ {
				// The backend sends each event only when let go, so each
				// must reach the user before the next exists.
				select {
				case e.backend.sseGo <- struct{}{}:
				case <-ctx.Done():
					return fmt.Errorf("event %d: the backend did not get the request: %w", i, ctx.Err())
				}
				want := fmt.Sprintf("data: event %d", i)
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						return fmt.Errorf("event %d: %w", i, err)
					}
					if strings.TrimSpace(line) == want {
						break
					}
				}
			}
			return nil
		}},
		{"large download 8 MiB", func(ctx context.Context, e *compatEnv) error {
			const n = 8 << 20
			resp, err := e.do(ctx, http.MethodGet, fmt.Sprintf("/bytes/%d", n), nil, nil)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			got, err := io.Copy(io.Discard, resp.Body)
			if err != nil || got != n {
				return fmt.Errorf("read %d of %d bytes: %v", got, n, err)
			}
			return nil
		}},
		{"HEAD", func(ctx context.Context, e *compatEnv) error {
			resp, err := e.do(ctx, http.MethodHead, "/bytes/1000", nil, nil)
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Length") != "1000" {
				return fmt.Errorf("status %s, Content-Length %q", resp.Status, resp.Header.Get("Content-Length"))
			}
			return nil
		}},
		{"404 passed through", func(ctx context.Context, e *compatEnv) error {
			return e.status(ctx, http.StatusNotFound)
		}},
		{"500 passed through", func(ctx context.Context, e *compatEnv) error {
			return e.status(ctx, http.StatusInternalServerError)
		}},
		{"redirect not followed", func(ctx context.Context, e *compatEnv) error {
			resp, err := e.do(ctx, http.MethodGet, "/redirect", nil, nil)
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusFound || resp.Header.Get("Location") != "/elsewhere" {
				return fmt.Errorf("status %s, Location %q", resp.Status, resp.Header.Get("Location"))
			}
			return nil
		}},
		{"trailers", func(ctx context.Context, e *compatEnv) error {
			resp, err := e.do(ctx, http.MethodGet, "/trailers", nil, nil)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil {
				return err
			}
			if string(body) != "body before trailers" || resp.Trailer.Get("X-Checksum") != "abc123" {
				return fmt.Errorf("body %q, trailer X-Checksum %q", body, resp.Trailer.Get("X-Checksum"))
			}
			return nil
		}},
		{"websocket echo (101 upgrade)", func(ctx context.Context, e *compatEnv) error {
			ws := "ws" + strings.TrimPrefix(e.base, "http") + "/client/" + compatWeb + "/ws"
			conn, _, err := websocket.Dial(ctx, ws, &websocket.DialOptions{HTTPHeader: e.creds.Clone(), HTTPClient: e.client})
			if err != nil {
				return err
			}
			defer conn.CloseNow()
			for _, msg := range []string{"ping", "pong pong"} {
				if err := conn.Write(ctx, websocket.MessageText, []byte(msg)); err != nil {
					return err
				}
				_, got, err := conn.Read(ctx)
				if err != nil {
					return err
				}
				if string(got) != msg {
					return fmt.Errorf("echo %q, want %q", got, msg)
				}
			}
			return conn.Close(websocket.StatusNormalClosure, "")
		}},
		{"escaped slash in path", func(ctx context.Context, e *compatEnv) error {
			echo, err := e.echo(ctx, http.MethodGet, "/echo/a%2Fb", nil, nil)
			if err == nil && echo.RawPath != "/echo/a%2Fb" {
				err = fmt.Errorf("backend saw raw path %q (path %q)", echo.RawPath, echo.Path)
			}
			return err
		}},
	}
	for _, g := range grpcCases {
		cases = append(cases, compatCase{g.name, func(ctx context.Context, e *compatEnv) error {
			return g.run(metadata.AppendToOutgoingContext(ctx, e.grpcMD...), e.grpc)
		}})
	}
	return cases
}

// do sends one user request to the web device.
func (e *compatEnv) do(ctx context.Context, method, path string, body []byte, h http.Header) (*http.Response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, e.base+"/client/"+compatWeb+path, rd)
	if err != nil {
		return nil, err
	}
	for k, vv := range e.creds {
		req.Header[k] = vv
	}
	for k, vv := range h {
		req.Header[k] = vv
	}
	return e.client.Do(req)
}

// echo sends a request to the backend's echo handler and decodes what it saw.
func (e *compatEnv) echo(ctx context.Context, method, path string, body []byte, h http.Header) (echoReply, error) {
	var echo echoReply
	resp, err := e.do(ctx, method, path, body, h)
	if err != nil {
		return echo, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return echo, fmt.Errorf("status %s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	if err := json.NewDecoder(resp.Body).Decode(&echo); err != nil {
		return echo, fmt.Errorf("decode the echo: %w", err)
	}
	return echo, nil
}

func (e *compatEnv) postEcho(ctx context.Context, body string) error {
	echo, err := e.echo(ctx, http.MethodPost, "/echo/post", []byte(body), http.Header{"Content-Type": {"text/plain"}})
	if err == nil && echo.Body != body {
		err = fmt.Errorf("backend saw %d bytes, want %d", len(echo.Body), len(body))
	}
	return err
}

func (e *compatEnv) status(ctx context.Context, code int) error {
	resp, err := e.do(ctx, http.MethodGet, fmt.Sprintf("/status/%d", code), nil, nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if want := fmt.Sprintf("status %d from the backend\n", code); resp.StatusCode != code || string(body) != want {
		return fmt.Errorf("status %s, body %q", resp.Status, body)
	}
	return nil
}

// newCompatEnv connects the user's clients to relay; creds, when set, go
// with every request.
func newCompatEnv(t *testing.T, relay string, creds http.Header, web *testBackend) *compatEnv {
	t.Helper()
	client := NewClient(t, true)
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	conn, err := grpc.NewClient(strings.TrimPrefix(relay, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	md := []string{"x-server-name", compatGRPC}
	for k, vv := range creds {
		md = append(md, strings.ToLower(k), vv[0])
	}
	return &compatEnv{base: relay, creds: creds, client: client, grpc: testgrpc.NewTestServiceClient(conn), grpcMD: md, backend: web}
}

// ourUser returns the credentials of a user of both devices on r.
func ourUser(t *testing.T, r *Relay) http.Header {
	return http.Header{"X-Switchboard-Token": {r.Token(t, auth.KindUser, "compat user", compatWeb, compatGRPC)}}
}

// waitReady waits until both devices answer through the pair: the web
// device with a 200, the gRPC device with any answer of the backend (an
// error status that is not Unavailable counts, so that a pair which breaks
// every call still gets its cases run and reported). A pair that never
// comes up is logged, and its cases fail one by one.
func waitReady(t *testing.T, e *compatEnv) *compatEnv {
	t.Helper()
	ready := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if _, err := e.echo(ctx, http.MethodGet, "/echo/ready", nil, nil); err != nil {
			return fmt.Errorf("web device: %w", err)
		}
		_, err := e.grpc.EmptyCall(metadata.AppendToOutgoingContext(ctx, e.grpcMD...), &testgrpc.Empty{})
		if c := status.Code(err); c == codes.Unavailable || c == codes.DeadlineExceeded {
			return fmt.Errorf("grpc device: %w", err)
		}
		return nil
	}
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for err := ready(); err != nil; err = ready() {
		if time.Now().After(deadline) {
			t.Logf("the pair did not come up within 20s: %v", err)
			break
		}
		<-tick.C
	}
	return e
}

func startOurAgents(t *testing.T, r *Relay, proto, webToken, grpcToken string, web *testBackend, grpcAddr string) {
	StartAgent(t, r, compatWeb, web.URL, webToken, protocol(proto))
	StartAgent(t, r, compatGRPC, "http://"+grpcAddr, grpcToken, protocol(proto), func(c *agent.Config) { c.BackendH2C = true })
}

// startReferenceRelay runs the reference relay on a free loopback port and
// returns its base URL once it answers its health check.
func startReferenceRelay(t *testing.T, bin string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	startProcess(t, bin, "--port", strconv.Itoa(port))
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	c := NewClient(t, false)
	Eventually(t, 10*time.Second, func() error {
		code, err := Status(c, base+"/healthz")
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("health check: status %d", code)
		}
		return err
	})
	return base
}

// startReferenceAgent runs the reference agent for device against relay.
func startReferenceAgent(t *testing.T, bin, relay, device, backend string, h2c bool) {
	t.Helper()
	args := []string{
		"--relay_scheme", "http", "--relay_address", strings.TrimPrefix(relay, "http://"),
		"--backend_scheme", "http", "--backend_address", backend,
		"--server_name", device, "--disable_auth_for_remote",
	}
	if h2c {
		args = append(args, "--force_http2")
	}
	startProcess(t, bin, args...)
}

// startProcess runs bin until the test ends, then kills it; what it wrote
// is logged if the test failed.
func startProcess(t *testing.T, bin string, args ...string) {
	t.Helper()
	var out testkit.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		select {
		case err := <-done:
			t.Logf("%s %s exited before the end of the test (%v); its last output:\n%s", bin, strings.Join(args, " "), err, lastLines(out.String(), 15))
			return
		default:
		}
		cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("%s %s, last output:\n%s", bin, strings.Join(args, " "), lastLines(out.String(), 15))
		}
	})
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
