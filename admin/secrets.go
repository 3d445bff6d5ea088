package admin

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdispatch/pgdispatch/signing"
)

// SigningSecret describes a row of the signing_secrets table, without
// the secret (docs/operations.md, "Rotating the signing secret").
type SigningSecret struct {
	ID        int64     `json:"id"`
	CreatedAt time.Time `json:"created_at"`
	// ExpiresAt is when it stops signing; nil: not set, it signs until
	// the next rotation.
	ExpiresAt *time.Time `json:"expires_at"`
	// Expired reports whether it no longer signs.
	Expired bool `json:"expired"`
}

// Rotation is what RotateSigningSecret did.
type Rotation struct {
	// ID is the new secret's.
	ID int64 `json:"id"`
	// OthersExpireAt is when the last of the other secrets stops
	// signing; nil: none signs.
	OthersExpireAt *time.Time `json:"others_expire_at"`
}

// RotateSigningSecret adds secret, which signs every http_callback
// request from now on, and ends the other secrets after overlap, during
// which they sign too (rotate_signing_secret() in SQL). The workers are
// told, and sign with it from their next request on.
func (a *Admin) RotateSigningSecret(ctx context.Context, secret signing.Secret, overlap time.Duration) (Rotation, error) {
	if overlap < 0 {
		return Rotation{}, fmt.Errorf("rotate the signing secret: the overlap must be zero or more, not %s", overlap)
	}
	if len(secret) < signing.MinSecretBytes || len(secret) > signing.MaxSecretBytes {
		return Rotation{}, fmt.Errorf("rotate the signing secret: a secret has %d to %d bytes, not %d",
			signing.MinSecretBytes, signing.MaxSecretBytes, len(secret))
	}
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	var r Rotation
	err := a.pool.QueryRow(ctx, a.sql(`SELECT id, others_expire_at FROM {schema}.rotate_signing_secret($1, make_interval(secs => $2::float8))`),
		[]byte(secret), overlap.Seconds()).Scan(&r.ID, &r.OthersExpireAt)
	if err != nil {
		return Rotation{}, fmt.Errorf("rotate the signing secret: %w", err)
	}
	return r, nil
}

// SigningSecrets lists the signing secrets kept, oldest first, without
// the secrets.
func (a *Admin) SigningSecrets(ctx context.Context) ([]SigningSecret, error) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	rows, _ := a.pool.Query(ctx, a.sql(`
SELECT id, created_at, expires_at, coalesce(expires_at <= now(), false) FROM {schema}.signing_secrets ORDER BY id`))
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (SigningSecret, error) {
		var s SigningSecret
		return s, row.Scan(&s.ID, &s.CreatedAt, &s.ExpiresAt, &s.Expired)
	})
	if err != nil {
		return nil, fmt.Errorf("list the signing secrets: %w", err)
	}
	return out, nil
}
