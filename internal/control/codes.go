package control

import (
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/switchboard-relay/switchboard/internal/access"
	"github.com/switchboard-relay/switchboard/internal/auth"
	"github.com/switchboard-relay/switchboard/internal/httperr"
)

// PathCodes issues access codes.
const PathCodes = "/api/v1/codes"

// CodeIssuer makes a single-use access code for the user p: for device,
// the paths under scope, alive for ttl (0: the default). Its errors carry
// an HTTP status via an HTTPStatus() int method.
type CodeIssuer func(p auth.Principal, device, scope string, ttl time.Duration) (code string, expires time.Time, err error)

// CodeRequest is the body of POST /api/v1/codes.
type CodeRequest struct {
	// Device is the device the code opens.
	Device string `json:"device"`
	// Path is the path scope under the device: the code, and the browser
	// session it opens, work for this path and below. Default "/".
	Path string `json:"path,omitempty"`
	// TTLSeconds is how long the code lives, 1 to 60. Default 30.
	TTLSeconds int `json:"ttl_seconds,omitempty"`
}

// CreatedCode answers POST /api/v1/codes.
type CreatedCode struct {
	Code      string    `json:"code"`
	Device    string    `json:"device"`
	Path      string    `json:"path"`
	ExpiresAt time.Time `json:"expires_at"`
	// URLPath is the path and query to open on any relay's public
	// listener: /client/<device><path>?code=<code>.
	URLPath string `json:"url_path"`
}

func (h *handler) createCode(w http.ResponseWriter, r *http.Request, p auth.Principal) {
	if h.cfg.Codes == nil {
		writeError(w, http.StatusServiceUnavailable, "this relay issues no access codes")
		return
	}
	var req CodeRequest
	if err := decodeJSON(w, r, &req); err != nil {
		writeErr(w, err)
		return
	}
	if req.Device == "" {
		writeError(w, http.StatusBadRequest, `"device" is required: the device the code opens, e.g. {"device":"robot-1"}`)
		return
	}
	if req.TTLSeconds < 0 || req.TTLSeconds > int(access.MaxCodeTTL/time.Second) {
		writeError(w, http.StatusBadRequest, fmt.Sprintf(`"ttl_seconds" is %d; a code lives 1 to %d seconds`, req.TTLSeconds, int(access.MaxCodeTTL/time.Second)))
		return
	}
	code, exp, err := h.cfg.Codes(p, req.Device, req.Path, time.Duration(req.TTLSeconds)*time.Second)
	if err != nil {
		writeError(w, httperr.StatusOf(err, http.StatusBadRequest), err.Error())
		return
	}
	scope := req.Path
	if scope == "" {
		scope = "/"
	}
	writeJSON(w, http.StatusCreated, CreatedCode{
		Code: code, Device: req.Device, Path: scope, ExpiresAt: exp.UTC(),
		URLPath: "/client/" + req.Device + scope + "?" + url.Values{access.CodeParam: {code}}.Encode(),
	})
}
