package claimer

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// A claim of a limited queue that walks keys another claim holds, more of
// them than it takes, is walking just behind that claim: from where it
// ends, the next one would walk behind it again, and so on, each claim
// spending its walk on the keys the other took. Its next walk starts
// elsewhere instead, at a point picked at random between the queue's
// first and last keys.
func TestFlowClaimBehindAnotherStartsElsewhere(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, pool, jobs := newTestClaimer(ctx, t, Config{})
	setLimit(ctx, t, c, pool, "", 1, false, 0, 0)
	_, err := pool.Exec(ctx, `INSERT INTO `+jobs+` (kind, flow_key)
		SELECT 'noop', 'k' || lpad(g::text, 3, '0') FROM generate_series(0, 199) g ORDER BY g`)
	require.NoError(t, err)
	claimFlow := "SELECT id, cursor_key FROM " + pgx.Identifier{c.cfg.Schema, "claim_flow"}.Sanitize() +
		"($1, $2, 'w', 30, 5, 1048576, NULL, false)"

	// Another claim holds the first 100 keys, until it ends.
	ahead, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = ahead.Rollback(context.Background()) }()
	rows, err := ahead.Query(ctx, claimFlow, c.cfg.Queue, 100)
	require.NoError(t, err)
	taken, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct {
		ID     *int64
		Cursor *string
	}])
	require.NoError(t, err)
	require.Len(t, taken, 100)
	require.Equal(t, "k099", *taken[0].Cursor)

	// Claims of 10 from the first key find only held keys as far as they
	// walk; where each says to start next varies, within the keys.
	cursors := map[string]bool{}
	for range 6 {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		rows, err := tx.Query(ctx, claimFlow, c.cfg.Queue, 10)
		require.NoError(t, err)
		got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct {
			ID     *int64
			Cursor *string
		}])
		require.NoError(t, err)
		require.NoError(t, tx.Rollback(ctx))
		require.Len(t, got, 1)
		require.Nil(t, got[0].ID, "every key it walked was held")
		require.NotNil(t, got[0].Cursor)
		cursor := *got[0].Cursor
		require.True(t, cursor >= "k" && cursor <= "k199", "cursor %q is not between the first and the last key", cursor)
		cursors[cursor] = true
	}
	require.Greater(t, len(cursors), 1, "every claim behind the other would start its next walk at %v", cursors)
}

// The point a claim behind another picks is made of characters between
// those of the first and last keys: keys whose characters surround the
// UTF-16 surrogates, which are no character, cannot make it fail.
func TestFlowClaimBehindAnotherPicksACharacter(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, pool, jobs := newTestClaimer(ctx, t, Config{})
	setLimit(ctx, t, c, pool, "", 1, false, 0, 0)
	keys := []string{"a\ud7ff", "a\ue000", "a\ue000\U0010ffff", "a\ue000\U0010ffff\ud7ff"}
	for _, k := range keys {
		insertKeyed(ctx, t, pool, jobs, k, 1)
	}
	claimFlow := "SELECT count(*) FROM " + pgx.Identifier{c.cfg.Schema, "claim_flow"}.Sanitize() +
		"($1, $2, 'w', 30, 5, 1048576, NULL, false)"
	ahead, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = ahead.Rollback(context.Background()) }()
	var n int
	require.NoError(t, ahead.QueryRow(ctx, claimFlow, c.cfg.Queue, len(keys)).Scan(&n))
	require.Equal(t, len(keys), n)
	for i := range 40 {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		var cursor *string
		err = tx.QueryRow(ctx, "SELECT cursor_key FROM "+pgx.Identifier{c.cfg.Schema, "claim_flow"}.Sanitize()+
			"($1, 1, 'w', 30, 5, 1048576, NULL, false)", c.cfg.Queue).Scan(&cursor)
		require.NoError(t, tx.Rollback(ctx))
		require.NoErrorf(t, err, "claim %d", i)
	}
}
