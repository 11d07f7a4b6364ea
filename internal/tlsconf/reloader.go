package tlsconf

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// Log attribute keys.
const (
	attrComponent = "component"
	attrCertFile  = "cert_file"
	attrKeyFile   = "key_file"
	attrSubject   = "subject"
	attrNotAfter  = "not_after"
	attrError     = "error"
)

// CheckInterval is how often, at most, a Reloader looks at its files again:
// on the first handshake after it has passed.
const CheckInterval = time.Second

// Reloader serves a certificate and key pair from two PEM files and picks
// up replaced files without a restart. It owns no goroutine: a handshake
// that comes CheckInterval or more after the last look stats both files,
// and reads them again when either changed (another file, time or size).
// A change that does not load — a broken file, or a pair caught half
// written — leaves the previous certificate in service and is warned about
// once; the next change is tried again.
type Reloader struct {
	certFile, keyFile string
	log               *slog.Logger
	every             time.Duration    // CheckInterval; shorter in tests
	now               func() time.Time // time.Now

	mu         sync.Mutex // guards the fields below
	cert       *tls.Certificate
	loaded     stamps    // the files as they were when cert was read
	checked    time.Time // when the files were last looked at
	warned     stamps    // the files as they were at the last warning
	haveWarned bool      // warned holds a change that failed to load
}

// NewReloader loads the pair certFile, keyFile and returns a Reloader
// serving it. An error names the file that is missing or unreadable, or
// both files when they do not make a valid pair. log receives the reloads
// and the warnings; nil discards them.
func NewReloader(certFile, keyFile string, log *slog.Logger) (*Reloader, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Reloader{
		certFile: certFile,
		keyFile:  keyFile,
		log:      log.With(attrComponent, "tls"),
		every:    CheckInterval,
		now:      time.Now,
	}
	cert, st, err := r.load()
	if err != nil {
		return nil, err
	}
	r.cert, r.loaded, r.checked = cert, st, r.now()
	return r, nil
}

// GetCertificate returns the current certificate, for tls.Config.
func (r *Reloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now := r.now(); now.Sub(r.checked) >= r.every {
		r.checked = now
		r.reloadLocked()
	}
	return r.cert, nil
}

// reloadLocked reads the files again if they changed since they were loaded.
func (r *Reloader) reloadLocked() {
	st, err := r.stat()
	if err == nil && st.equal(r.loaded) {
		return
	}
	var cert *tls.Certificate
	if err == nil {
		cert, st, err = r.load()
	}
	if err != nil {
		if !r.haveWarned || !st.equal(r.warned) {
			r.warned, r.haveWarned = st, true
			r.log.Warn("TLS certificate files changed but do not load; still serving the previous certificate",
				attrCertFile, r.certFile, attrKeyFile, r.keyFile, attrError, err)
		}
		return
	}
	r.cert, r.loaded, r.haveWarned = cert, st, false
	args := []any{attrCertFile, r.certFile, attrKeyFile, r.keyFile}
	if cert.Leaf != nil {
		args = append(args, attrSubject, cert.Leaf.Subject.String(), attrNotAfter, cert.Leaf.NotAfter)
	}
	r.log.Info("TLS certificate reloaded", args...)
}

// load reads and parses the pair, with the files' stamps taken before they
// were read: a file replaced while it is read differs at the next look.
func (r *Reloader) load() (*tls.Certificate, stamps, error) {
	st, err := r.stat()
	if err != nil {
		return nil, st, err
	}
	certPEM, err := os.ReadFile(r.certFile)
	if err != nil {
		return nil, st, fmt.Errorf("read TLS certificate file: %w", err)
	}
	keyPEM, err := os.ReadFile(r.keyFile)
	if err != nil {
		return nil, st, fmt.Errorf("read TLS key file: %w", err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, st, fmt.Errorf("TLS certificate file %s with key file %s: %w", r.certFile, r.keyFile, err)
	}
	return &cert, st, nil
}

// stat looks at both files.
func (r *Reloader) stat() (stamps, error) {
	var st stamps
	var err error
	if st.cert, err = os.Stat(r.certFile); err != nil {
		return st, fmt.Errorf("TLS certificate file: %w", err)
	}
	if st.key, err = os.Stat(r.keyFile); err != nil {
		return st, fmt.Errorf("TLS key file: %w", err)
	}
	return st, nil
}

// stamps are what a Reloader notices of its two files; nil for a file that
// could not be stat'ed.
type stamps struct{ cert, key os.FileInfo }

func (s stamps) equal(o stamps) bool { return sameFile(s.cert, o.cert) && sameFile(s.key, o.key) }

// sameFile reports whether a and b are the same file, unmodified.
func sameFile(a, b os.FileInfo) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return os.SameFile(a, b) && a.ModTime().Equal(b.ModTime()) && a.Size() == b.Size()
}
