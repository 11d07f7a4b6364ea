package store

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	"golang.org/x/crypto/bcrypt"
)

// ErrAuthFailed is wrapped by Open's error when NATS refused the relay's
// credentials, or asked for credentials the relay was not given.
var ErrAuthFailed = errors.New("NATS authentication failed")

// Kinds of credentials, as named in logs and messages.
const (
	authNone     = "none"
	authPassword = "user/password"
	authToken    = "token"
	authNkey     = "nkey"
	authCreds    = "creds"
)

// Credentials are what the relay presents to NATS and, with the embedded
// server, what that server demands of every client, the relay's own
// in-process connection included. At most one kind may be given: a user and
// password, a token, an nkey seed, or a .creds file. The zero value, the
// default, presents nothing and lets the embedded server accept anyone who
// reaches it (in-process only or on loopback, see Config.Listen).
//
// Secrets are read from files, so that they never appear on a command line;
// Password and Token exist for programs that hold the secret already. Files
// are read once, by Open. Credentials print and log without their secrets.
type Credentials struct {
	// User is the NATS user name. It needs a password (PasswordFile or
	// Password). Empty by default.
	User string

	// PasswordFile names a file holding User's password; one trailing
	// newline is ignored. Empty by default.
	PasswordFile string

	// Password is User's password itself, instead of PasswordFile.
	Password string

	// TokenFile names a file holding a NATS authorization token; one
	// trailing newline is ignored. Empty by default.
	TokenFile string

	// Token is the authorization token itself, instead of TokenFile.
	Token string

	// NkeySeedFile names a file holding an nkey user seed ("SU…", as
	// written by `nk -gen user`). The relay signs the server's challenge
	// with it; the embedded server accepts the public key derived from it.
	// The connection reads the file again on each reconnection, so it must
	// stay a regular file. Empty by default.
	NkeySeedFile string

	// CredsFile names a NATS .creds file (a user JWT and its nkey seed), as
	// issued for a NATS server in operator mode (nsc). External NATS only:
	// the embedded server does not run in operator mode. Empty by default.
	CredsFile string
}

// Kind names the kind of credentials given: "none", "user/password",
// "token", "nkey" or "creds". It says nothing of the secret itself.
func (c Credentials) Kind() string {
	kinds := c.kinds()
	if len(kinds) == 0 {
		return authNone
	}
	return strings.Join(kinds, "+")
}

func (c Credentials) kinds() []string {
	var kinds []string
	if c.User != "" || c.Password != "" || c.PasswordFile != "" {
		kinds = append(kinds, authPassword)
	}
	if c.Token != "" || c.TokenFile != "" {
		kinds = append(kinds, authToken)
	}
	if c.NkeySeedFile != "" {
		kinds = append(kinds, authNkey)
	}
	if c.CredsFile != "" {
		kinds = append(kinds, authCreds)
	}
	return kinds
}

// String describes the credentials without their secrets, so that printing
// a Config (%v, %+v) never shows a password or a token.
func (c Credentials) String() string {
	if c.User != "" {
		return fmt.Sprintf("%s %q", c.Kind(), c.User)
	}
	return c.Kind()
}

// LogValue logs the credentials without their secrets.
func (c Credentials) LogValue() slog.Value { return slog.StringValue(c.String()) }

// validate rejects incomplete or mixed credentials; embedded says whether
// they are for the embedded server.
func (c Credentials) validate(embedded bool) error {
	if kinds := c.kinds(); len(kinds) > 1 {
		return invalid("Credentials", func(name func(string) string) string {
			return fmt.Sprintf("are of several kinds (%s); give one: %s with %s, %s, %s or %s", strings.Join(kinds, ", "),
				name("Credentials.User"), name("Credentials.PasswordFile"), name("Credentials.TokenFile"), name("Credentials.NkeySeedFile"), name("Credentials.CredsFile"))
		})
	}
	switch {
	case c.Password != "" && c.PasswordFile != "":
		return invalid("Credentials.PasswordFile", func(name func(string) string) string {
			return fmt.Sprintf("(%s) and %s are both given; give one", c.PasswordFile, name("Credentials.Password"))
		})
	case c.Token != "" && c.TokenFile != "":
		return invalid("Credentials.TokenFile", func(name func(string) string) string {
			return fmt.Sprintf("(%s) and %s are both given; give one", c.TokenFile, name("Credentials.Token"))
		})
	case c.User == "" && (c.Password != "" || c.PasswordFile != ""):
		return invalid("Credentials.User", func(name func(string) string) string {
			return "is empty, but a NATS password is given, which needs its user: add " + name("Credentials.User")
		})
	case c.User != "" && c.Password == "" && c.PasswordFile == "":
		return invalid("Credentials.User", func(name func(string) string) string {
			return fmt.Sprintf("%q has no password; give %s, a file that holds it", c.User, name("Credentials.PasswordFile"))
		})
	case strings.ContainsAny(c.User, " \t\r\n"):
		return invalid("Credentials.User", func(func(string) string) string { return fmt.Sprintf("%q contains white space", c.User) })
	case embedded && c.CredsFile != "":
		return invalid("Credentials.CredsFile", func(name func(string) string) string {
			return fmt.Sprintf("(%s) needs a NATS server in operator mode, which the embedded server is not; use it with %s, or give the embedded server a user and password, a token or an nkey", c.CredsFile, name("URLs"))
		})
	}
	return nil
}

// secrets are resolved Credentials: the files read, the nkey's public key
// derived. Never log them; kind and user are safe to show.
type secrets struct {
	kind      string
	user      string
	password  string
	token     string
	nkeyFile  string
	nkeyPub   string // public key of the seed in nkeyFile
	credsFile string
}

// load reads the files c names and checks what they hold.
func (c Credentials) load() (secrets, error) {
	s := secrets{kind: c.Kind(), user: c.User, password: c.Password, token: c.Token, nkeyFile: c.NkeySeedFile, credsFile: c.CredsFile}
	var err error
	if c.PasswordFile != "" {
		if s.password, err = readSecret("NATS password", c.PasswordFile); err != nil {
			return secrets{}, err
		}
	}
	if c.TokenFile != "" {
		if s.token, err = readSecret("NATS token", c.TokenFile); err != nil {
			return secrets{}, err
		}
	}
	if c.NkeySeedFile != "" {
		if s.nkeyPub, err = nkeyPublicKey(c.NkeySeedFile); err != nil {
			return secrets{}, err
		}
	}
	if c.CredsFile != "" {
		if _, err := os.Stat(c.CredsFile); err != nil {
			return secrets{}, invalidf("NATS .creds file: %v", err)
		}
	}
	return s, nil
}

// readSecret reads a secret from path, without one trailing newline.
func readSecret(what, path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", invalidf("reading the %s: %v", what, err)
	}
	v := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if v == "" {
		return "", invalidf("the %s file %s is empty", what, path)
	}
	return v, nil
}

// nkeyPublicKey returns the public key of the nkey user seed in path.
func nkeyPublicKey(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", invalidf("reading the NATS nkey seed: %v", err)
	}
	defer clear(b)
	kp, err := nkeys.ParseDecoratedNKey(b)
	if err != nil {
		return "", invalidf("the NATS nkey file %s holds no nkey seed (%v); make one with `nk -gen user`", path, err)
	}
	defer kp.Wipe()
	pub, err := kp.PublicKey()
	if err != nil || !nkeys.IsValidPublicUserKey(pub) {
		return "", invalidf("the NATS nkey file %s holds no user seed (SU…); make one with `nk -gen user`", path)
	}
	return pub, nil
}

// clientOptions are the nats.go options that present s.
func (s secrets) clientOptions() ([]nats.Option, error) {
	switch s.kind {
	case authPassword:
		return []nats.Option{nats.UserInfo(s.user, s.password)}, nil
	case authToken:
		return []nats.Option{nats.Token(s.token)}, nil
	case authNkey:
		opt, err := nats.NkeyOptionFromSeed(s.nkeyFile)
		if err != nil {
			return nil, invalidf("NATS nkey file %s: %v", s.nkeyFile, err)
		}
		return []nats.Option{opt}, nil
	case authCreds:
		return []nats.Option{nats.UserCredentials(s.credsFile)}, nil
	}
	return nil, nil
}

// requireOf makes the embedded server demand s of every client.
func (s secrets) requireOf(opts *server.Options) {
	switch s.kind {
	case authPassword:
		opts.Users = []*server.User{{Username: s.user, Password: serverPassword(s.password)}}
	case authToken:
		opts.Authorization = s.token
	case authNkey:
		opts.Nkeys = []*server.NkeyUser{{Nkey: s.nkeyPub}}
	}
}

// serverPassword is what the embedded server compares a client's password
// with: a bcrypt hash, so that the server does not warn of a plaintext
// password in its configuration. The hash lives in this process only, next
// to the password itself, so the cheapest cost does; a password bcrypt
// cannot take (over 72 bytes) is compared as it is.
func serverPassword(password string) string {
	hash, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.MinCost)
	if err != nil {
		return password
	}
	return string(hash)
}

// refused explains an authentication failure by what was presented,
// without the secret.
func (s secrets) refused() string {
	switch s.kind {
	case authPassword:
		return fmt.Sprintf("the server refused user %q with the password given; check both, and that the server knows this user", s.user)
	case authToken:
		return "the server refused the token given; check it against the server's"
	case authNkey:
		return fmt.Sprintf("the server refused the nkey %s; check that the server lists this public key", s.nkeyPub)
	case authCreds:
		return fmt.Sprintf("the server refused the .creds file %s; check that it is current and issued for this server's operator", s.credsFile)
	}
	return "the server requires credentials and none were given; give --nats-user with --nats-password-file, --nats-token-file, --nats-nkey-file or --nats-creds"
}

// isAuthError reports whether err means that NATS refused the credentials.
func isAuthError(err error) bool {
	for _, target := range []error{nats.ErrAuthorization, nats.ErrAuthExpired, nats.ErrAuthRevoked, nats.ErrAccountAuthExpired, nats.ErrNkeysNotSupported} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

// isLoopbackHost reports whether the embedded server, bound to host, is
// reachable from this machine only: an empty host (which binds 127.0.0.1),
// "localhost" or a loopback address. Names other than localhost count as
// reachable from elsewhere, whatever they resolve to today.
func isLoopbackHost(host string) bool {
	if host == "" || strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// urlHasUserinfo reports whether a NATS URL carries credentials itself.
func urlHasUserinfo(raw string) bool {
	if !strings.Contains(raw, "://") {
		raw = "nats://" + raw
	}
	u, err := url.Parse(raw)
	return err == nil && u.User != nil
}

// redactURL hides the credentials a NATS URL may carry: the password of
// user:password@, or the whole of token@.
func redactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.User == nil {
		if i := strings.LastIndex(raw, "@"); i >= 0 {
			return "xxxxx" + raw[i:] // unparsable; keep the host only
		}
		return raw
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	} else {
		u.User = url.User("xxxxx")
	}
	return u.String()
}
