package fleetsecret

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/switchboard-relay/switchboard/internal/secret"

	"github.com/switchboard-relay/switchboard/internal/logkey"
)

// readFile reads a fleet secret file and returns its secrets, the signing
// one first, and a digest of its content.
func readFile(path string) ([][]byte, [sha256.Size]byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, [sha256.Size]byte{}, err
	}
	keys, err := parseFile(data)
	return keys, sha256.Sum256(data), err
}

// parseFile parses the content of a fleet secret file: one secret per
// line, the first signs and the others are accepted; a line is hex when it
// is an even number of hex digits, else standard base64 (padding
// optional); blank lines and lines starting with '#' are skipped. Errors
// name lines, never their content.
func parseFile(data []byte) ([][]byte, error) {
	var keys [][]byte
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		k, err := decodeLine(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", i+1, err)
		}
		if len(k) < secret.MinBytes {
			return nil, fmt.Errorf("line %d: a secret of %d bytes is too short; use %d random bytes (openssl rand -base64 %d)", i+1, len(k), secret.Bytes, secret.Bytes)
		}
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("no secret in the file; put one, base64 or hex, on the first line (openssl rand -base64 %d)", secret.Bytes)
	}
	if len(keys) > MaxSecrets {
		return nil, fmt.Errorf("%d secrets; at most %d are accepted at once", len(keys), MaxSecrets)
	}
	return keys, nil
}

func decodeLine(line string) ([]byte, error) {
	if len(line)%2 == 0 {
		if k, err := hex.DecodeString(line); err == nil {
			return k, nil
		}
	}
	if k, err := base64.StdEncoding.DecodeString(line); err == nil {
		return k, nil
	}
	if k, err := base64.RawStdEncoding.DecodeString(line); err == nil {
		return k, nil
	}
	return nil, errors.New("neither hex nor standard base64")
}

// openFile makes the ring run the secret file.
func (k *Keeper) openFile() error {
	path := k.cfg.File
	keys, sum, err := readFile(path)
	if err != nil {
		return fmt.Errorf("fleet secret file %s: %w", path, err)
	}
	if k.ring, err = secret.NewRing(keys[0], keys[1:]...); err != nil {
		return fmt.Errorf("fleet secret file %s: %w", path, err)
	}
	k.loop.fileSum = sum
	k.warnLoosePermissions(path)
	k.log.Info("running the fleet secret from a file, not the fleet's stored one", logkey.Path, path,
		logkey.Fingerprint, k.ring.Fingerprint(), logkey.Accepted, strings.Join(k.ring.Accepted(), ","))
	return nil
}

// reloadFile applies the secret file when its content changed. A file that
// cannot be read or parsed leaves the running secret as it is.
func (k *Keeper) reloadFile() {
	path := k.cfg.File
	keys, sum, err := readFile(path)
	if err == nil && sum == k.loop.fileSum {
		k.loop.badFile = false
		return
	}
	if err == nil {
		err = k.ring.Set(keys[0], keys[1:]...)
	}
	if err != nil {
		if !k.loop.badFile || sum != k.loop.badSum {
			k.log.Warn("the fleet secret file cannot be used; still running the secret read before", logkey.Path, path, logkey.Err, err)
		}
		k.loop.badFile, k.loop.badSum = true, sum
		return
	}
	k.loop.fileSum, k.loop.badFile = sum, false
	k.warnLoosePermissions(path)
	k.log.Info("fleet secret file changed: applied", logkey.Path, path,
		logkey.Fingerprint, k.ring.Fingerprint(), logkey.Accepted, strings.Join(k.ring.Accepted(), ","))
	k.beatNow()
}

// warnLoosePermissions warns when others than the owner may read path.
func (k *Keeper) warnLoosePermissions(path string) {
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
		k.log.Warn("the fleet secret file is readable by others than its owner; chmod 600 it", logkey.Path, path, logkey.Mode, fi.Mode().Perm().String())
	}
}
