package forward

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/switchboard-relay/switchboard/internal/connect"
	"github.com/switchboard-relay/switchboard/internal/logkey"
	"github.com/switchboard-relay/switchboard/internal/mux"
	"github.com/switchboard-relay/switchboard/internal/peer"
	"github.com/switchboard-relay/switchboard/internal/tunnel"
)

// Opener opens streams to the HTTP service of devices' version 2 agents
// on this relay: *tunnel.Pool.
type Opener interface {
	OpenHTTP(ctx context.Context, device string) (*tunnel.HTTPStream, error)
}

var _ Opener = (*tunnel.Pool)(nil)

// Server is the holder's end: it takes other relays' sessions and splices
// each of their streams onto a stream of the device's agent here, never
// onto another relay (a forwarded stream is never forwarded again).
type Server struct {
	Open Opener
	// Verify checks a peer signature for a device (or SessionScope) and
	// returns the relay that made it: peer.Signer.VerifySignature.
	Verify func(signature, device string) (string, error)
	// PingAfter and DeadAfter are the liveness checks of a forwarding
	// relay, as for mux.Config. Defaults 2 s and 4 s: that relay pings
	// more often.
	PingAfter, DeadAfter time.Duration
	Logger               *slog.Logger

	wg sync.WaitGroup // the sessions and their streams

	mu       sync.Mutex // guards the fields below
	sessions map[*mux.Session]struct{}
	closed   bool
}

// ServeHTTP takes a forwarding relay's session, signed for SessionScope,
// and serves its streams until it ends or Close is called.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !strings.EqualFold(r.Header.Get("Upgrade"), Protocol) {
		w.Header().Set("Upgrade", Protocol)
		http.Error(w, "this endpoint takes other relays' forwards over "+Protocol, http.StatusUpgradeRequired)
		return
	}
	from, err := s.Verify(r.Header.Get(peer.Header), SessionScope)
	if err != nil {
		http.Error(w, "a forward session from another relay was refused: "+err.Error(), http.StatusUnauthorized)
		return
	}
	conn, ok := connect.Hijack(w, Protocol)
	if !ok {
		return
	}
	sess := mux.New(conn, mux.Config{
		MaxWindow: tunnel.MaxWindow,
		PingAfter: cmp.Or(s.PingAfter, 2*time.Second),
		DeadAfter: cmp.Or(s.DeadAfter, 4*time.Second),
	})
	if !s.add(sess) {
		sess.Close()
		return
	}
	defer s.remove(sess)
	s.serve(sess, from)
}

func (s *Server) add(sess *mux.Session) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	if s.sessions == nil {
		s.sessions = map[*mux.Session]struct{}{}
	}
	s.sessions[sess] = struct{}{}
	s.wg.Add(1)
	return true
}

func (s *Server) remove(sess *mux.Session) {
	s.mu.Lock()
	delete(s.sessions, sess)
	s.mu.Unlock()
	s.wg.Done()
}

// Close ends every session and its streams, and waits for them: the
// relay stops. A graceful stop lets the streams end first, as the agents'
// sessions they are spliced onto drain.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	all := make([]*mux.Session, 0, len(s.sessions))
	for sess := range s.sessions {
		all = append(all, sess)
	}
	s.mu.Unlock()
	for _, sess := range all {
		sess.Close()
	}
	s.wg.Wait()
}

// serve splices each stream of sess onto the agent of the device it names.
func (s *Server) serve(sess *mux.Session, from string) {
	defer sess.Close()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		st, err := sess.Accept()
		if err != nil {
			return
		}
		wg.Go(func() { s.join(st, from) })
	}
}

// join serves one stream: it checks the opening's signature for the
// device, opens the agent's stream, sends the service's announcement and
// splices the two. A stream it cannot serve is reset CodeUnavailable,
// before anything reached the device.
func (s *Server) join(st *mux.Stream, from string) {
	device, sig, err := parseOpen(st.Meta())
	if err == nil {
		_, err = s.Verify(sig, device)
	}
	var up *tunnel.HTTPStream
	if err == nil {
		up, err = s.Open.OpenHTTP(context.Background(), device)
	}
	if err != nil {
		s.logger().Debug("forwarded stream not served here", logkey.RelayID, from, logkey.Device, device, logkey.Err, err)
		if errors.Is(err, tunnel.ErrBusy) {
			st.Reset(CodeBusy)
			return
		}
		st.Reset(CodeUnavailable)
		return
	}
	defer up.Done()
	if err := writePreamble(st, up.Service); err != nil {
		st.Reset(CodeUnavailable)
		up.Reset(mux.CodeCancel)
		return
	}
	// When the agent's session is asked to go, the forwarding relay is
	// told to send no new request on this stream, so that the session
	// can end once what is in flight has.
	stop := context.AfterFunc(up.Leaving, func() { retire(st) })
	defer stop()
	spliceStreams(st, up.Stream)
}

// retire tells the forwarding relay that st carries no new request: a
// stream of the holder's, opened and ended at once, naming st.
func retire(st *mux.Stream) {
	n, err := st.Session().Open(context.Background(), retireMeta(st.ID()))
	if err != nil {
		return
	}
	n.CloseWrite()
}

// spliceStreams copies both ways between the forwarding relay's stream st and
// the agent's up until both directions end, each end passed on as a
// half-close. A reset on either side resets the other: the agent's own
// codes (it could not reach its service) reach the forwarding relay as
// they are, and a tunnel that died under the stream as CodeAgentLost.
func spliceStreams(st, up *mux.Stream) {
	var once sync.Once
	fail := func(err error) {
		once.Do(func() {
			code := CodeAgentLost
			var re *mux.ResetError
			if errors.As(err, &re) && re.Remote {
				code = re.Code
			}
			st.Reset(code)
			up.Reset(mux.CodeCancel)
		})
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		half(up, st, fail)
	}()
	half(st, up, fail)
	<-done
	st.Close()
	up.Close()
}

// half copies src to dst, then half-closes dst.
func half(dst, src *mux.Stream, fail func(error)) {
	if _, err := src.WriteTo(dst); err != nil {
		fail(err)
		return
	}
	if err := dst.CloseWrite(); err != nil {
		fail(err)
	}
}

func (s *Server) logger() *slog.Logger {
	if s.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return s.Logger
}
