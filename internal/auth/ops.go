package auth

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Create makes a new token as req asks and returns its secret, the full token
// string the bearer presents, which is not kept anywhere. Errors in req wrap
// ErrInvalidRequest; when NATS cannot be reached the error wraps
// ErrUnavailable. A token exists exactly when Create succeeds: after any
// other error, a write that still reaches NATS is undone (see withdraw).
func (s *Store) Create(ctx context.Context, req CreateRequest) (secret string, tok Token, err error) {
	req, err = req.normalize()
	if err != nil {
		return "", Token{}, err
	}
	for range maxAttempts {
		pt, err := newToken(req.Kind)
		if err != nil {
			return "", Token{}, fmt.Errorf("auth: create token: %w", err)
		}
		tok := Token{ID: pt.id, Kind: req.Kind, Name: req.Name, Devices: req.Devices, CreatedAt: now()}
		if s.known(tok.ID) {
			continue // id collision: draw another
		}
		err = s.insert(ctx, tok, hashSecret(pt.secret))
		if errors.Is(err, jetstream.ErrKeyExists) {
			continue // id collision: draw another
		}
		if err != nil {
			s.withdraw(tok.ID) // the write may still land: see withdraw
			return "", Token{}, createError(err)
		}
		s.log.Info("token created", attrTokenID, tok.ID, attrKind, tok.Kind, attrName, tok.Name)
		return pt.String(), cloneToken(tok), nil
	}
	return "", Token{}, fmt.Errorf("auth: create token: no free id after %d attempts", maxAttempts)
}

// known reports whether this relay has seen id used, so that Create does
// not try it: a failed create withdraws its id, and must not withdraw
// another token's.
func (s *Store) known(id string) bool {
	return s.tokens.Seen(id) || s.isWithdrawn(id)
}

// insert stores a token under a new key and caches it at once, so that this
// relay accepts it before the watch echoes it back.
func (s *Store) insert(ctx context.Context, tok Token, h secretHash) error {
	data, err := encodeRecord(tok, h)
	if err != nil {
		return err
	}
	rev, err := s.kv.Create(ctx, tok.ID, data)
	if err != nil {
		return err
	}
	s.tokens.Put(tok.ID, cached{tok: tok, hash: h}, rev)
	return nil
}

// List returns every token this relay knows, revoked ones included, oldest
// first. It never returns secrets or their hashes.
func (s *Store) List(ctx context.Context) ([]Token, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	all := s.tokens.All()
	out := make([]Token, 0, len(all))
	for _, c := range all {
		if !s.isWithdrawn(c.tok.ID) {
			out = append(out, cloneToken(c.tok))
		}
	}
	slices.SortFunc(out, func(a, b Token) int {
		return cmp.Or(a.CreatedAt.Compare(b.CreatedAt), cmp.Compare(a.ID, b.ID))
	})
	return out, nil
}

// Revoke marks the token with the given id revoked; every relay refuses it
// from then on. Revoking a revoked token succeeds. An unknown id yields an
// error wrapping ErrNotFound.
func (s *Store) Revoke(ctx context.Context, id string) error {
	if !validID(id) {
		return fmt.Errorf("auth: revoke %q: %w", id, ErrNotFound)
	}
	for range maxAttempts {
		err := s.revokeOnce(ctx, id)
		if errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue // changed under us: read it again
		}
		if err != nil {
			return fmt.Errorf("auth: revoke %s: %w", id, err)
		}
		return nil
	}
	return fmt.Errorf("auth: revoke %s: the record kept changing; try again", id)
}

func (s *Store) revokeOnce(ctx context.Context, id string) error {
	e, err := s.kv.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return ErrNotFound
	}
	if err != nil {
		return err
	}
	c, err := decodeRecord(id, e.Value())
	if err != nil { // unusable anyway: remove it
		return s.kv.Delete(ctx, id, jetstream.LastRevision(e.Revision()))
	}
	if c.tok.Revoked {
		s.tokens.Put(id, c, e.Revision())
		return nil
	}
	c.tok.Revoked, c.tok.RevokedAt = true, now()
	data, err := encodeRecord(c.tok, c.hash)
	if err != nil {
		return err
	}
	rev, err := s.kv.Update(ctx, id, data, e.Revision())
	if err != nil {
		return err
	}
	s.tokens.Put(id, c, rev)
	s.log.Info("token revoked", attrTokenID, id, attrKind, c.tok.Kind, attrName, c.tok.Name)
	return nil
}

// now is the time stamped on records: UTC, to the microsecond, fine enough
// that tokens created one after the other list in that order.
func now() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }
