package claimer

import (
	"context"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
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

// Past the 16 priorities the claim walks one by one, it claims in
// (priority, run_at, id) order still, from the front and from the cursor,
// and a due job that another transaction holds locked there is reported
// as skipped (stranded).
func TestClaimPastTheWalkedPriorities(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.Schema(t)
	pool := pgtest.Pool(t)
	sql := func(s string) string { return pinned.WithSchema(s, schema) }
	// Ahead at priorities 0 to 39; due at 20 to 39, two each, inserted in
	// reverse.
	_, err := pool.Exec(ctx, sql(`INSERT INTO {jobs} (kind, priority, run_at)
SELECT 'noop', p, now() + interval '1 hour' FROM generate_series(0, 39) p;
INSERT INTO {jobs} (kind, priority, run_at)
SELECT 'noop', p, now() - g * interval '1 second' FROM generate_series(39, 20, -1) p, generate_series(1, 2) g`))
	require.NoError(t, err)
	var want []int64
	rows, err := pool.Query(ctx, sql("SELECT id FROM {jobs} WHERE run_at <= now() ORDER BY priority, run_at, id"))
	require.NoError(t, err)
	for rows.Next() {
		var id int64
		require.NoError(t, rows.Scan(&id))
		want = append(want, id)
	}
	require.NoError(t, rows.Err())
	require.Len(t, want, 40)
	type row struct {
		id       *int64
		priority *int16
		runAt    *time.Time
		stranded *bool
	}
	claim := func(tx pgx.Tx, limit int, k *cursor.Cursor) []row {
		t.Helper()
		q, args := claimSQL, []any{"default", limit, "w", 30.0, 5, int64(16000000)}
		if k != nil {
			q, args = cursor.SQL(claimSQL), append(args, k.Priority, k.RunAt, k.ID)
		}
		rows, err := tx.Query(ctx, sql(q), args...)
		require.NoError(t, err)
		var got []row
		for rows.Next() {
			vals, err := rows.Values()
			require.NoError(t, err)
			var r row
			if id, ok := vals[0].(int64); ok {
				p, at := vals[3].(int16), vals[6].(time.Time)
				r.id, r.priority, r.runAt = &id, &p, &at
			}
			if s, ok := vals[10].(bool); ok {
				r.stranded = &s
			}
			got = append(got, r)
		}
		require.NoError(t, rows.Err())
		return got
	}
	// ids are the ids of the claimed rows in (priority, run_at, id) order,
	// their place in want: the claim returns them in no order.
	ids := func(rs []row) []int64 {
		var out []int64
		for _, r := range rs {
			if r.id != nil {
				out = append(out, *r.id)
			}
		}
		slices.SortFunc(out, func(a, b int64) int { return slices.Index(want, a) - slices.Index(want, b) })
		return out
	}
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.Equal(t, want, ids(claim(tx, 100, nil)), "from the front")
	require.NoError(t, tx.Rollback(ctx))
	// Five at a time from the cursor, after the first claim from the front.
	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	got := claim(tx, 5, nil)
	var all []int64
	for len(got) > 0 && got[0].id != nil {
		require.Less(t, len(all), len(want), "the claims from the cursor go on: %v", all)
		all = append(all, ids(got)...)
		last := slices.MaxFunc(got, func(a, b row) int { return slices.Index(want, *a.id) - slices.Index(want, *b.id) })
		got = claim(tx, 5, &cursor.Cursor{Set: true, Priority: *last.priority, RunAt: *last.runAt, ID: *last.id})
	}
	require.Equal(t, want, all, "from the cursor")
	require.NoError(t, tx.Rollback(ctx))
	// The last due job locked by another transaction, the others taken.
	other, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer other.Rollback(ctx) //nolint:errcheck
	_, err = other.Exec(ctx, sql("SELECT FROM {jobs} WHERE id = $1 FOR UPDATE"), want[len(want)-1])
	require.NoError(t, err)
	_, err = pool.Exec(ctx, sql("UPDATE {jobs} SET status = 'done' WHERE run_at <= now() AND id <> $1"), want[len(want)-1])
	require.NoError(t, err)
	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	got = claim(tx, 10, nil)
	require.Len(t, got, 1)
	require.Nil(t, got[0].id)
	require.NotNil(t, got[0].stranded)
	require.True(t, *got[0].stranded, "the locked job past the walked priorities is skipped")
}
