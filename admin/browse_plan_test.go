package admin

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
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

// Pending jobs of a kind by run_at are read from jobs_kind_idx a queue at a
// time, and those of a kind and a queue from one range of it: a page, the
// first or a later one, either way, reads a page's worth of rows from each
// of the kind's queues, however many pending jobs the others hold; a page
// of a rare kind reads its few jobs, not every pending one. So in the plan
// the server picks for the statement's first runs and in the generic one
// it may keep after them.
func TestPagePendingOfAKindByRunAtReadsAPagePerQueue(t *testing.T) {
	t.Parallel()
	schema := pgtest.FreshSchema(t) // for the planner's statistics
	pool := pgtest.Pool(t)
	a := New(pool, schema, 30*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Two kinds in every queue, half of their jobs due at the same time,
	// and a rare kind of 5 pending jobs in one queue.
	const queues, perQueue, limit = 4, 5000, 10
	_, err := pool.Exec(ctx, a.sql(`INSERT INTO {jobs} (queue, kind, status, run_at, finished_at)
		SELECT 'q' || (i % $1), CASE WHEN i % 5000 = 1 THEN 'rare' WHEN (i / $1) % 2 = 0 THEN 'a' ELSE 'b' END,
		       CASE WHEN i % 5 = 0 THEN 'done' ELSE 'pending' END,
		       CASE WHEN i % 2 = 0 THEN timestamptz '2026-02-01' ELSE timestamptz '2026-01-01' + i * interval '1 second' END,
		       CASE WHEN i % 5 = 0 THEN timestamptz '2026-01-01' END
		FROM generate_series(1, $2::int) i`), queues, queues*perQueue*5/4)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `ANALYZE `+pgx.Identifier{schema, "jobs"}.Sanitize())
	require.NoError(t, err)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()

	for _, c := range []struct {
		f     JobFilter
		lanes int
	}{
		{JobFilter{Kind: "a"}, queues},
		{JobFilter{Kind: "a", Queue: "q1"}, 1},
		{JobFilter{Kind: "rare"}, 1},
	} {
		for _, asc := range []bool{true, false} {
			f := c.f
			f.Sort, f.Asc, f.Limit = "run_at", asc, limit
			first, next, err := a.Page(ctx, f)
			require.NoError(t, err)
			if f.Kind == "rare" {
				require.Len(t, first, 5)
				require.Nil(t, next)
			} else {
				require.Len(t, first, limit)
				require.NotNil(t, next)
			}
			cursors := []*Cursor{nil}
			if next != nil {
				cursors = append(cursors, next)
			}
			for _, after := range cursors {
				f.After = after
				stmt, args, err := f.page()
				require.NoError(t, err)
				for _, mode := range []string{"auto", "force_generic_plan"} {
					_, err := conn.Exec(ctx, "SELECT set_config('plan_cache_mode', $1, false)", mode)
					require.NoError(t, err)
					_, err = conn.Exec(ctx, `PREPARE page AS `+a.sql(stmt))
					require.NoError(t, err)
					params := make([]string, len(args))
					for i, arg := range args {
						params[i] = literal(t, arg)
					}
					var plan []map[string]any
					err = conn.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE page(`+strings.Join(params, ", ")+`)`).Scan(&plan)
					_, derr := conn.Exec(ctx, `DEALLOCATE page`)
					require.NoError(t, err)
					require.NoError(t, derr)
					read := rowsRead(plan[0]["Plan"].(map[string]any))
					t.Logf("kind %s, queue %q, asc %v, after %v, %s: %v rows read of %d pending", c.f.Kind, c.f.Queue, asc, after != nil, mode, read, queues*perQueue)
					require.LessOrEqual(t, read, float64(2*c.lanes*(limit+1)),
						"kind %s, queue %q, asc %v, after %v, %s: a page reads a page's worth from each of the kind's %d queues", c.f.Kind, c.f.Queue, asc, after != nil, mode, c.lanes)
					js, err := json.Marshal(plan)
					require.NoError(t, err)
					require.Contains(t, string(js), `"Index Name":"jobs_kind_idx"`)
				}
			}
		}
	}
}

// literal writes a page's argument as an SQL literal, for EXECUTE, which
// takes no bound parameters.
func literal(t *testing.T, arg any) string {
	switch v := arg.(type) {
	case string:
		return "'" + strings.ReplaceAll(v, "'", "''") + "'"
	case time.Time:
		return "'" + v.Format(time.RFC3339Nano) + "'"
	case int:
		return strconv.Itoa(v)
	case int64:
		return strconv.FormatInt(v, 10)
	}
	t.Fatalf("no literal for %T", arg)
	return ""
}
