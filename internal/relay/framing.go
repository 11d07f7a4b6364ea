package relay

import (
	"errors"
	"io"
	"net/http"

	"github.com/switchboard-relay/switchboard/internal/httperr"
)

// BodyError is a failure to read the user's request body: its framing is
// broken (a bad chunk size, a body shorter than its Content-Length) or the
// user stopped sending it. It is the user's fault, not the device's: 400,
// unless the read failed for a reason that has its own status (a body
// that stalled: 408).
type BodyError struct{ Err error }

func (e *BodyError) Error() string {
	if httperr.Has(e.Err) {
		return httperr.MessageOf(e.Err)
	}
	return "the request body could not be read (" + e.Err.Error() + "); check the client's framing (Content-Length, chunked encoding)"
}

func (e *BodyError) Unwrap() error { return e.Err }

// HTTPStatus is 400, or the status of the read's own error.
func (e *BodyError) HTTPStatus() int { return httperr.StatusOf(e.Err, http.StatusBadRequest) }

// userBody is a user's request body as the transports read it: its read
// errors are BodyErrors, so that they are told apart from the device's or
// the tunnel's whatever wraps them on the way back.
type userBody struct{ io.ReadCloser }

func (b *userBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF && !errors.Is(err, http.ErrBodyReadAfterClose) {
		err = &BodyError{Err: err}
	}
	return n, err
}

// closeIfChunked makes an HTTP/1 connection close after the response to a
// request whose body is chunked. Such a request may also have carried a
// Content-Length, which net/http drops before the handler can see it: RFC
// 9112 §6.1 then asks the server to close the connection, since a proxy in
// front may have framed the body by the length, and what is left on the
// connection could be read as another request (request smuggling).
func closeIfChunked(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor == 1 && len(r.TransferEncoding) > 0 && r.Header.Get("Upgrade") == "" {
		w.Header().Set("Connection", "close")
	}
}

var _ httperr.StatusError = (*BodyError)(nil)
