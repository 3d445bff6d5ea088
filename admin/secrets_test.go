package admin_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/admin"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/signing"
)

// A rotation ends the other secrets after its overlap, keeps an end that
// comes sooner, and deletes the secrets that ended; list shows no secret.
func TestRotateSigningSecret(t *testing.T) {
	t.Parallel()
	a, _, _ := setup(t)
	ctx := context.Background()
	rotate := func(overlap time.Duration) admin.Rotation {
		t.Helper()
		r, err := a.RotateSigningSecret(ctx, signing.Generate(), overlap)
		require.NoError(t, err)
		return r
	}
	first := rotate(time.Hour)
	require.Nil(t, first.OthersExpireAt, "no other secret signs")
	second := rotate(time.Hour)
	require.NotNil(t, second.OthersExpireAt)
	third := rotate(2 * time.Hour)
	require.True(t, third.OthersExpireAt.After(*second.OthersExpireAt), "the last of the others ends later")
	list, err := a.SigningSecrets(ctx)
	require.NoError(t, err)
	require.Len(t, list, 3)
	require.Equal(t, *second.OthersExpireAt, *list[0].ExpiresAt, "the first keeps its sooner end")
	require.Equal(t, *third.OthersExpireAt, *list[1].ExpiresAt)
	require.Nil(t, list[2].ExpiresAt)

	ended := rotate(0)
	require.Nil(t, ended.OthersExpireAt, "the others stop at once")
	list, err = a.SigningSecrets(ctx)
	require.NoError(t, err)
	require.Len(t, list, 4)
	for _, s := range list[:3] {
		require.True(t, s.Expired, s.ID)
	}
	last := rotate(time.Hour)
	list, err = a.SigningSecrets(ctx)
	require.NoError(t, err)
	require.Equal(t, []int64{ended.ID, last.ID}, []int64{list[0].ID, list[1].ID}, "the ended secrets are deleted")
	require.Len(t, list, 2)

	_, err = a.RotateSigningSecret(ctx, signing.Generate(), -time.Second)
	require.ErrorContains(t, err, "the overlap must be zero or more")
	_, err = a.RotateSigningSecret(ctx, signing.Secret("short"), 0)
	require.ErrorContains(t, err, "a secret has 16 to 64 bytes")
}

// Rotations at once take turns: one secret, the last, signs without an
// end.
func TestConcurrentRotationsTakeTurns(t *testing.T) {
	t.Parallel()
	a, _, _ := setup(t)
	ctx := context.Background()
	errs := make(chan error, 8)
	for range 8 {
		go func() {
			_, err := a.RotateSigningSecret(ctx, signing.Generate(), time.Hour)
			errs <- err
		}()
	}
	for range 8 {
		require.NoError(t, <-errs)
	}
	list, err := a.SigningSecrets(ctx)
	require.NoError(t, err)
	require.Len(t, list, 8)
	for _, s := range list[:7] {
		require.NotNil(t, s.ExpiresAt, s.ID)
	}
	require.Nil(t, list[7].ExpiresAt)
}

// A rotation in a transaction that began before another rotation
// committed ends that rotation's secret without breaking the table's
// checks: its end is never before the secret was made.
func TestRotationInOlderTransaction(t *testing.T) {
	t.Parallel()
	a, schema, _ := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tx, err := pgtest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `SELECT now()`) // the transaction's now() is fixed here
	require.NoError(t, err)
	first, err := a.RotateSigningSecret(ctx, signing.Generate(), time.Hour)
	require.NoError(t, err)
	var id int64
	err = tx.QueryRow(ctx, `SELECT id FROM `+pgx.Identifier{schema, "rotate_signing_secret"}.Sanitize()+`($1, interval '0')`,
		[]byte(signing.Generate())).Scan(&id)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	list, err := a.SigningSecrets(ctx)
	require.NoError(t, err)
	require.Len(t, list, 2)
	require.Equal(t, []int64{first.ID, id}, []int64{list[0].ID, list[1].ID})
	require.True(t, list[0].Expired, "the overlap of 0 ends the first at once")
	require.False(t, list[1].Expired)
}
