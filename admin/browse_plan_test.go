package admin

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

// rowsRead sums, over a plan's nodes that read the jobs table or its
// indexes, the rows each returned in all its loops.
func rowsRead(node map[string]any) float64 {
	var n float64
	if node["Relation Name"] == "jobs" {
		n += node["Actual Rows"].(float64) * node["Actual Loops"].(float64)
	}
	if kids, ok := node["Plans"].([]any); ok {
		for _, k := range kids {
			n += rowsRead(k.(map[string]any))
		}
	}
	return n
}

// Pending jobs by run_at are read from jobs_claim_idx a queue and a
// priority at a time: a page, the first or a later one, either way, reads
// a page's worth of rows from each queue, however many pending jobs they
// hold and however many share a run_at, rather than sorting them all.
func TestPagePendingByRunAtReadsAPagePerQueue(t *testing.T) {
	t.Parallel()
	schema := pgtest.FreshSchema(t) // for the planner's statistics
	pool := pgtest.Pool(t)
	a := New(pool, schema, 30*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Half of the pending jobs are due at the same time, the latest, as a
	// batch enqueued at once for later.
	const queues, perQueue, limit = 4, 5000, 10
	_, err := pool.Exec(ctx, a.sql(`INSERT INTO {jobs} (queue, kind, status, run_at, finished_at)
		SELECT 'q' || (i % $1), 'k', CASE WHEN i % 5 = 0 THEN 'done' ELSE 'pending' END,
		       CASE WHEN i % 2 = 0 THEN timestamptz '2026-02-01' ELSE timestamptz '2026-01-01' + i * interval '1 second' END,
		       CASE WHEN i % 5 = 0 THEN timestamptz '2026-01-01' END
		FROM generate_series(1, $2::int) i`), queues, queues*perQueue*5/4)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE `+pgx.Identifier{schema, "jobs"}.Sanitize())
	require.NoError(t, err)

	for _, asc := range []bool{true, false} {
		f := JobFilter{Sort: "run_at", Asc: asc, Limit: limit}
		first, next, err := a.Page(ctx, f)
		require.NoError(t, err)
		require.Len(t, first, limit)
		require.NotNil(t, next)
		for _, after := range []*Cursor{nil, next} {
			f.After = after
			stmt, args, err := f.page()
			require.NoError(t, err)
			var plan []map[string]any
			require.NoError(t, pool.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+a.sql(stmt), args...).Scan(&plan))
			read := rowsRead(plan[0]["Plan"].(map[string]any))
			t.Logf("asc %v, after %v: %v rows read of %d pending", asc, after != nil, read, queues*perQueue)
			require.LessOrEqual(t, read, float64(2*queues*(limit+1)),
				"asc %v, after %v: a page reads a page's worth from each of the %d queues", asc, after != nil, queues)
		}
	}
}
