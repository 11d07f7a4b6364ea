package auth

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// adminTokenName names the admin token a relay generates on first start.
const adminTokenName = "generated admin token"

// ErrAdminTokenFile is wrapped when the admin token file cannot be used as is.
var ErrAdminTokenFile = errors.New("unusable admin token file")

// EnsureAdminToken makes sure the admin token file at path holds an admin
// token the fleet accepts. Without a file it creates a token and writes it
// there, mode 0600 in a directory of mode 0700, and reports created. With a
// file it makes sure the bucket holds the token's record, restoring it from
// the file's secret when the bucket was wiped; if the token was revoked, it
// replaces the file with a new token and reports created.
func (s *Store) EnsureAdminToken(ctx context.Context, path string) (created bool, err error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return true, s.createAdminFile(ctx, path)
	}
	if err != nil {
		return false, fmt.Errorf("auth: admin token: %w", err)
	}
	pt, ok := parseToken(strings.TrimSpace(string(data)))
	if !ok || pt.kind != KindAdmin {
		return false, fmt.Errorf("auth: %w: %s does not hold a switchboard admin token (sbx_…); remove it to have a new one generated", ErrAdminTokenFile, path)
	}
	revoked, err := s.ensureAdminRecord(ctx, pt)
	if err != nil {
		return false, fmt.Errorf("auth: admin token in %s: %w", path, err)
	}
	if revoked {
		s.log.Warn("the admin token in the data directory was revoked; writing a new one", attrPath, path)
		return true, s.createAdminFile(ctx, path)
	}
	return false, nil
}

// ensureAdminRecord makes sure the bucket holds the record of the admin token
// pt, restoring it if missing, and reports whether it was revoked.
func (s *Store) ensureAdminRecord(ctx context.Context, pt parsedToken) (revoked bool, err error) {
	h := hashSecret(pt.secret)
	e, err := s.kv.Get(ctx, pt.id)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		tok := Token{ID: pt.id, Kind: KindAdmin, Name: adminTokenName, CreatedAt: now()}
		if err := s.insert(ctx, tok, h); err != nil {
			return false, fmt.Errorf("restoring its record: %w", err)
		}
		s.log.Warn("restored the admin token's record: the token store had lost it", attrTokenID, pt.id)
		return false, nil
	}
	if err != nil {
		return false, err
	}
	c, err := decodeRecord(pt.id, e.Value())
	if err != nil || c.tok.Kind != KindAdmin || subtle.ConstantTimeCompare(h[:], c.hash[:]) != 1 {
		return false, fmt.Errorf("%w: the token store holds another token under id %s; remove the file to have a new one generated", ErrAdminTokenFile, pt.id)
	}
	s.tokens.Put(pt.id, c, e.Revision())
	return c.tok.Revoked, nil
}

// createAdminFile creates an admin token and writes it to path. If the file
// cannot be written, the token is revoked again: nobody could use it.
func (s *Store) createAdminFile(ctx context.Context, path string) error {
	secret, tok, err := s.Create(ctx, CreateRequest{Kind: KindAdmin, Name: adminTokenName})
	if err != nil {
		return err
	}
	if err := writeSecretFile(path, secret); err != nil {
		if rerr := s.Revoke(ctx, tok.ID); rerr != nil {
			s.log.Error("revoking an admin token that could not be saved", attrTokenID, tok.ID, attrError, rerr)
		}
		return fmt.Errorf("auth: saving the admin token: %w", err)
	}
	return nil
}

// writeSecretFile writes secret to path, mode 0600, atomically: a reader sees
// the old file or the whole new one.
func writeSecretFile(path, secret string) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".admin-token-*") // mode 0600
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // fails harmlessly once renamed
	if _, err := f.WriteString(secret + "\n"); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
