package claimer

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/claimer/internal/cursor"
	"github.com/pgdispatch/pgdispatch/claimer/internal/pinned"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

// A claim from a cursor at the largest id, a job a writer inserted with
// OVERRIDING SYSTEM VALUE, claims the jobs after it rather than failing on
// the id's successor; and a look that finds the smallest id puts the
// cursor just before it, not after every job.
func TestClaimFromCursorAtTheEndsOfTheIDs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.Schema(t)
	pool := pgtest.Pool(t)
	sql := func(s string) string { return pinned.WithSchema(s, schema) }
	var at time.Time
	require.NoError(t, pool.QueryRow(ctx, sql(`INSERT INTO {jobs} (id, kind, run_at) OVERRIDING SYSTEM VALUE
VALUES (9223372036854775807, 'noop', now() - interval '1 minute'), (-9223372036854775808, 'noop', now() - interval '1 second')
RETURNING (SELECT now() - interval '1 minute')`)).Scan(&at))
	claim := func(k cursor.Cursor) []int64 {
		t.Helper()
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck
		rows, err := tx.Query(ctx, sql(cursor.SQL(claimSQL)), "default", 10, "w", 30.0, 5, int64(16000000), k.Priority, k.RunAt, k.ID)
		require.NoError(t, err)
		var ids []int64
		for rows.Next() {
			vals, err := rows.Values()
			require.NoError(t, err)
			if id, ok := vals[0].(int64); ok { // the one row of a claim that found nothing has a NULL
				ids = append(ids, id)
			}
		}
		err = rows.Err()
		require.NoError(t, err, "the claim from the cursor (%d, %s, %d)", k.Priority, k.RunAt, k.ID)
		return ids
	}
	// The cursor at the first job: the second is after it.
	require.Equal(t, []int64{math.MinInt64}, claim(cursor.Cursor{Set: true, RunAt: at, ID: math.MaxInt64}))
	// A look finds the job of the smallest id behind the cursor.
	var first time.Time
	require.NoError(t, pool.QueryRow(ctx, sql("SELECT run_at FROM {jobs} WHERE id = -9223372036854775808")).Scan(&first))
	k := cursor.Cursor{Set: true, RunAt: first.Add(time.Hour), ID: 5}
	k.Looked(cursor.Look{Found: true, RunAt: first, ID: math.MinInt64})
	require.Equal(t, []int64{math.MinInt64}, claim(k))
}
