package tunnel

import (
	"io"
	"net/http"
	"strconv"
	"strings"
)

// HTTP/2 cannot carry a 101 Switching Protocols, so an upgrade travels as a
// marked stream: the relay sends the request with UpgradeHeader naming the
// protocol (and no Connection/Upgrade headers); the agent performs the real
// upgrade with the backend and answers 200 with UpgradedHeader when the
// backend switched. From then on the stream's request body carries the
// user's bytes and its response body the backend's.
const (
	UpgradeHeader  = "X-Switchboard-Upgrade"
	UpgradedHeader = "X-Switchboard-Upgraded"
)

// upgradeType returns the protocol a request asks to switch to, or "".
func upgradeType(h http.Header) string {
	if !headerHasToken(h, "Connection", "upgrade") {
		return ""
	}
	return h.Get("Upgrade")
}

// upgradeRoundTrip sends an upgrade request on rt and turns a switched
// stream back into a 101 response whose body is the two-way byte stream.
func upgradeRoundTrip(rt http.RoundTripper, req *http.Request, proto string) (*http.Response, error) {
	pr, pw := io.Pipe()
	out := req.Clone(req.Context())
	out.Header.Del("Connection")
	out.Header.Del("Upgrade")
	out.Header.Set(UpgradeHeader, proto)
	out.Body, out.ContentLength = pr, -1
	resp, err := rt.RoundTrip(out)
	if err != nil {
		pw.Close()
		return nil, err
	}
	if resp.Header.Get(UpgradedHeader) != strconv.Itoa(http.StatusSwitchingProtocols) {
		pw.Close() // the backend refused the upgrade; its answer goes to the user as is
		return resp, nil
	}
	resp.Header.Del(UpgradedHeader)
	resp.Header.Set("Connection", "Upgrade")
	resp.Header.Set("Upgrade", proto)
	resp.StatusCode = http.StatusSwitchingProtocols
	resp.Status = "101 Switching Protocols"
	resp.ContentLength = 0
	resp.Body = &upgradedStream{r: resp.Body, w: pw}
	return resp, nil
}

// upgradedStream is the user's side of an upgraded stream.
type upgradedStream struct {
	r io.ReadCloser  // the backend's bytes
	w *io.PipeWriter // the user's bytes
}

func (s *upgradedStream) Read(p []byte) (int, error)  { return s.r.Read(p) }
func (s *upgradedStream) Write(p []byte) (int, error) { return s.w.Write(p) }

// CloseWrite tells the backend that the user sends no more.
func (s *upgradedStream) CloseWrite() error { return s.w.Close() }

func (s *upgradedStream) Close() error {
	s.w.Close()
	return s.r.Close()
}

// hopHeaders are connection-specific and never forwarded.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func removeHopHeaders(h http.Header) {
	for _, v := range h.Values("Connection") {
		for t := range strings.SplitSeq(v, ",") {
			if t = strings.TrimSpace(t); t != "" {
				h.Del(t)
			}
		}
	}
	for _, k := range hopHeaders {
		h.Del(k)
	}
}
