package tunnel

import (
	"context"
	"io"
	"log"
	"net"
	"net/http"
	"strconv"
	"sync"

	"golang.org/x/net/http2"
)

// Serve serves HTTP/2 with h on an agent's tunnel connection until the
// connection dies or ctx ends. Streams marked as upgrades are handed to
// upgrader instead of h. It advertises DefaultMaxStreams concurrent
// streams, the relay's default cap per agent: a relay sends no more.
func Serve(ctx context.Context, conn net.Conn, h http.Handler, l Liveness) {
	l = l.WithDefaults()
	srv := &http2.Server{
		MaxConcurrentStreams:         DefaultMaxStreams,
		MaxUploadBufferPerStream:     4 << 20,
		MaxUploadBufferPerConnection: 16 << 20,
		ReadIdleTimeout:              l.Interval,
		PingTimeout:                  l.Timeout,
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	// The agent reports a lost tunnel itself; x/net's own lines (a ping
	// that timed out) would only repeat it on the standard logger.
	base := &http.Server{ErrorLog: log.New(io.Discard, "", 0)}
	srv.ServeConn(conn, &http2.ServeConnOpts{Context: ctx, BaseConfig: base, Handler: h})
}

// UpgradeHandler serves the marked upgrade streams: it performs the real
// upgrade with the backend through backend (whose 101 response body must be
// writable, as net/http's Transport gives) and then copies bytes both ways.
// Other requests go to next.
func UpgradeHandler(backend http.RoundTripper, rewrite func(*http.Request) *http.Request, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proto := r.Header.Get(UpgradeHeader)
		if proto == "" {
			next.ServeHTTP(w, r)
			return
		}
		out := rewrite(r)
		out.Header.Del(UpgradeHeader)
		out.Header.Set("Connection", "Upgrade")
		out.Header.Set("Upgrade", proto)
		out.Body, out.ContentLength = http.NoBody, 0
		resp, err := backend.RoundTrip(out)
		if err != nil {
			http.Error(w, "Backend request failed: "+err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusSwitchingProtocols {
			removeHopHeaders(resp.Header)
			copyHeader(w.Header(), resp.Header)
			w.WriteHeader(resp.StatusCode)
			io.Copy(w, resp.Body)
			return
		}
		conn, ok := resp.Body.(io.ReadWriteCloser)
		if !ok {
			http.Error(w, "Backend switched protocols without a writable connection", http.StatusBadGateway)
			return
		}
		removeHopHeaders(resp.Header)
		copyHeader(w.Header(), resp.Header)
		w.Header().Set(UpgradedHeader, strconv.Itoa(http.StatusSwitchingProtocols))
		w.WriteHeader(http.StatusOK)
		pipeUpgraded(w, r, conn)
	})
}

// pipeUpgraded copies the user's bytes (the stream's request body) to the
// backend and the backend's bytes to the stream's response until either ends.
func pipeUpgraded(w http.ResponseWriter, r *http.Request, conn io.ReadWriteCloser) {
	rc := http.NewResponseController(w)
	rc.Flush()
	var wg sync.WaitGroup
	wg.Go(func() {
		io.Copy(conn, r.Body)
		if cw, ok := conn.(interface{ CloseWrite() error }); ok {
			cw.CloseWrite()
		}
	})
	buf := make([]byte, 32<<10)
	for {
		n, err := conn.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				break
			}
			if rc.Flush() != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	conn.Close()
	r.Body.Close()
	wg.Wait()
}

func copyHeader(dst, src http.Header) {
	for k, vv := range src {
		dst[k] = append(dst[k], vv...)
	}
}
