package claimer

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/claimer/internal/completer"
	"github.com/pgdispatch/pgdispatch/claimer/internal/cursor"
	"github.com/pgdispatch/pgdispatch/claimer/internal/giveback"
	"github.com/pgdispatch/pgdispatch/claimer/internal/lease"
	"github.com/pgdispatch/pgdispatch/claimer/internal/pinned"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/wait"
)

func TestMain(m *testing.M) { pgtest.MainNoLeaks(m) }

// The batch statements must find their rows by key whatever the statistics
// said when their generic plan was made, for the plan is then kept for the
// connection's life:
//   - Statistics taken while every job was pending once made the planner
//     drive a 1,000-row completion from a scan for running rows, in a nested
//     loop with a join filter: quadratic, about 1 s a batch.
//   - A plan made while the table was empty scanned the whole table at every
//     completion, and kept doing so as the table grew.
//
// This plans each statement under pinned.PlanSQL, as the claimer does, then
// fills the table and reads the plan the connection kept. It checks the
// plans' shape, not their speed.
func TestBatchPlansUseTheKey(t *testing.T) {
	t.Parallel()
	for name, setup := range map[string][]string{
		"planned on an empty table": nil,
		"planned on stale statistics": {
			"INSERT INTO {jobs} (kind) SELECT 'noop' FROM generate_series(1, 20000)",
			"ANALYZE {jobs}",
		},
		// Analyzed once a burst had drained, before vacuum removed its
		// rows (or while a transaction held vacuum back): the table's pages
		// and the claim index's entries are there, and the statistics say
		// no row is. The claim from the cursor scanned jobs_schedule_idx
		// from the cursor's run_at and sorted what it found; the heartbeat
		// and the outcomes scanned the table for each row of their batch.
		"planned after a drain": {
			"INSERT INTO {jobs} (kind) SELECT 'noop' FROM generate_series(1, 50000)",
			"VACUUM ANALYZE {jobs}",
			"UPDATE {jobs} SET status = 'running', attempts = 1, locked_by = 'w', locked_until = now() + interval '1 minute'",
			"DELETE FROM {jobs}",
			"ANALYZE {jobs}",
		},
		// The claim's UPDATE goes by ctid: a server that turned TID scans off
		// must not make it scan the table.
		"planned with TID scans off": {"SET enable_tidscan = off"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			checkPlans(t, setup)
		})
	}
}

func checkPlans(t *testing.T, setup []string) {
	t.Helper()
	ctx := context.Background()
	schema := pgtest.FreshSchema(t) // a table never analyzed, as after a migration
	conn, err := pgtest.Pool(t).Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	exec := func(sql string) {
		t.Helper()
		_, err := conn.Exec(ctx, pinned.WithSchema(sql, schema))
		require.NoError(t, err, sql)
	}
	defer exec("RESET enable_tidscan") // the connection goes back to the pool
	for _, sql := range setup {
		exec(sql)
	}

	ids := make([]string, 1000)
	for i := range ids {
		ids[i] = fmt.Sprint(i + 1)
	}
	idArray := "'{" + strings.Join(ids, ",") + "}'"
	statements := map[string]struct{ sql, types, args, settings string }{
		"claim":      {claimSQL, "text, int, text, float8, int, bigint", "'default', 1000, 'w', 30, 5, 16000000", pinned.ClaimPlanSQL},
		"claim_lean": {leanClaimSQL, "text, int, text, float8, int, bigint", "'default', 1000, 'w', 30, 5, 16000000", pinned.ClaimPlanSQL},
		"claim_cursor": {
			cursor.SQL(claimSQL), "text, int, text, float8, int, bigint, smallint, timestamptz, bigint",
			"'default', 1000, 'w', 30, 5, 16000000, 0, now() - interval '1 minute', 100", pinned.ClaimPlanSQL,
		},
		"look":        {cursor.LookSQL, "text", "'default'", pinned.ScanPlanSQL},
		"heartbeat":   {lease.SQL, "bigint[], timestamptz[], text, float8", idArray + ", array_fill(now(), ARRAY[1000]), 'w', 30", pinned.PlanSQL},
		"give_back":   {giveback.SQL, "text, text, float8, bigint[], int4[]", "'default', 'w', 30, " + idArray + ", '{1}'", pinned.PlanSQL},
		"delete_done": {completer.DeleteDoneSQL, "bigint[], timestamptz[], text", idArray + ", array_fill(now(), ARRAY[1000]), 'w'", pinned.PlanSQL},
		"complete": {
			completer.CompleteSQL, "bigint[], timestamptz[], text[], float8[], text[], bool[], text[], text[], timestamptz[], text",
			idArray + ", array_fill(now(), ARRAY[1000]), array_fill('done'::text, ARRAY[1000]), array_fill(0::float8, ARRAY[1000]), " +
				"array_fill(NULL::text, ARRAY[1000]), array_fill(false, ARRAY[1000]), array_fill(NULL::text, ARRAY[1000]), " +
				"array_fill(NULL::text, ARRAY[1000]), array_fill(NULL::timestamptz, ARRAY[1000]), 'w'", pinned.OutcomePlanSQL,
		},
	}
	explain := func(name string) string {
		t.Helper()
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck
		_, err = tx.Exec(ctx, statements[name].settings)
		require.NoError(t, err)
		rows, err := tx.Query(ctx, "EXPLAIN EXECUTE plan_"+name+"("+statements[name].args+")")
		require.NoError(t, err, name)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err, name)
		return strings.Join(lines, "\n")
	}
	check := func(name, plan string) {
		t.Helper()
		// A disabled node's cost (the claim's sort of what it took) must
		// not have the server compile the statement at every call.
		for _, bad := range []string{"Join Filter", "Seq Scan on jobs", "Hash Join", "Merge Join", "JIT"} {
			require.NotContains(t, plan, bad, "%s plan:\n%s", name, plan)
		}
		switch name {
		case "claim_lean":
			require.Contains(t, plan, "Tid Scan on jobs", "%s plan:\n%s", name, plan)
			// The first priority's due jobs, in one range of the claim index.
			require.Regexp(t, `Index Scan using jobs_claim_idx on jobs[^\n]*\n\s+Index Cond: \(\(queue = \$1\) AND \(priority = \$\d+\) `+
				`AND \(run_at <= now\(\)\)\)`, plan, "%s plan:\n%s", name, plan)
			// The queue's first run_at, when it takes nothing: one entry of
			// the schedule index.
			require.Regexp(t, `Index Only Scan using jobs_schedule_idx on jobs[^\n]*\n\s+Index Cond: \(\(queue = \$1\) AND \(run_at IS NOT NULL\)\)`,
				plan, "%s plan:\n%s", name, plan)
		case "claim", "claim_cursor":
			require.Contains(t, plan, "Tid Scan on jobs", "%s plan:\n%s", name, plan)
			// Each priority's due jobs, from its first pending job (or, from
			// the cursor, the first after it) to its first job not due.
			require.Regexp(t, `Index Scan using jobs_claim_idx on jobs[^\n]*\n\s+Index Cond: \(\(queue = \$1\) AND \(priority = pr\S*\.priority\) `+
				`AND \(ROW\(run_at, id\) >= ROW\(pr\S*\.run_at, pr\S*\.id\)\) AND \(run_at <= now\(\)\)\)`, plan, "%s plan:\n%s", name, plan)
		case "look":
			// The claim's scan, in the claim index: the first due row is
			// the first the index gives, with no sort.
			require.Regexp(t, `Index (Only )?Scan using jobs_claim_idx on jobs`, plan, "look plan:\n%s", plan)
			require.NotContains(t, plan, "Sort", "look plan:\n%s", plan)
		case "give_back":
			// The running rows by their lease, then each by its key.
			require.Contains(t, plan, "jobs_lease_idx", "give_back plan:\n%s", plan)
			require.Regexp(t, "Index Scan (using|on) jobs_pkey", plan, "give_back plan:\n%s", plan)
		default:
			// Driven by the arrays, which are in id order: the rows are
			// locked in id order.
			fn, idx := strings.Index(plan, "Function Scan on "), strings.Index(plan, "Index Scan using jobs_pkey")
			require.True(t, fn >= 0 && idx > fn, "%s plan:\n%s", name, plan)
		}
	}
	// The generic plan is made at the first EXPLAIN, and kept. It is checked
	// then, and again once the table has filled. The second look should see
	// the kept plan, but beside other tests it was at times a plan made anew
	// on the filled table (the first was invalidated meanwhile), so only the
	// first look is sure to see a plan made on the empty or stale table.
	defer func() { // a failed check leaves its statements on a connection of the pool
		for name := range statements {
			_, _ = conn.Exec(ctx, "DEALLOCATE plan_"+name)
		}
	}()
	for name, st := range statements {
		exec("PREPARE plan_" + name + "(" + st.types + ") AS " + st.sql)
		check(name, explain(name))
	}
	exec("INSERT INTO {jobs} (kind) SELECT 'noop' FROM generate_series(1, 20000)")
	exec("UPDATE {jobs} SET status = 'running', attempts = 1, locked_by = 'w', locked_until = now() + interval '1 minute' WHERE id <= 3000")
	for name := range statements {
		check(name, explain(name))
	}
}

// A claim and a look read the due jobs of each priority and stop at the
// first that is not due: the jobs waiting for a later run_at (scheduled
// ahead, retrying, held by an open endpoint's breaker) are not read,
// however many. A scan of the claim index from the front in (priority,
// run_at, id) order read each of them, at every claim that came up short
// and every look that found nothing due: 100,000 jobs scheduled ahead made
// each such claim read their 900 index pages.
func TestClaimsDoNotReadJobsScheduledAhead(t *testing.T) {
	t.Parallel()
	// Ahead at three priorities, in two queues; in one, two due jobs at the
	// last priority.
	claimPages(t, `INSERT INTO {jobs} (kind, queue, priority, run_at)
SELECT 'noop', CASE WHEN g % 4 = 0 THEN 'later' ELSE 'default' END, (g % 3)::smallint, now() + interval '1 day' + g * interval '1 second'
FROM generate_series(1, 100000) g`, 200)
}

// A writer who schedules ahead one job at each of the 65,536 priorities
// does not make every short claim and look walk them one by one: a walk
// priority by priority took an index descent or two at each, 262,000
// pages and half a second a claim, where one scan in (priority, run_at,
// id) order read the 330 pages of their index entries. The walk goes
// priority by priority through the first 16 only, and on in one scan.
func TestClaimsDoNotWalkEveryPriority(t *testing.T) {
	t.Parallel()
	claimPages(t, `INSERT INTO {jobs} (kind, queue, priority, run_at)
SELECT 'noop', q, p::smallint, now() + interval '1 day' + p * interval '1 second'
FROM generate_series(-32768, 32767) p, (VALUES ('default'), ('later')) v(q)`, 1000)
}

// A transaction that holds due jobs locked at every one of the 65,536
// priorities (an operator's bulk UPDATE of a queue's pending jobs, left
// open) does not make each claim walk to them one by one: the claim takes
// the jobs past the 16 walked priorities in one scan, which passes over
// each locked row at its index entry and heap page, about 2.6 pages a
// job. A walk whose steps past the 16th went to each next priority with a
// due job made two index descents at each locked one: 642,000 pages and
// half a second a claim, where the one scan read 169,000 in 57 ms.
func TestClaimsPassLockedJobsInOneScan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.FreshSchema(t)
	pool := pgtest.Pool(t)
	sql := func(s string) string { return pinned.WithSchema(s, schema) }
	_, err := pool.Exec(ctx, sql(`INSERT INTO {jobs} (kind, priority, run_at)
SELECT 'noop', p::smallint, now() - interval '1 hour' FROM generate_series(-32768, 32767) p`))
	require.NoError(t, err)
	_, err = pool.Exec(ctx, sql("VACUUM ANALYZE {jobs}"))
	require.NoError(t, err)
	other, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer other.Rollback(ctx) //nolint:errcheck
	_, err = other.Exec(ctx, sql("SELECT FROM {jobs} WHERE status = 'pending' FOR UPDATE"))
	require.NoError(t, err)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, pinned.ClaimPlanSQL)
	require.NoError(t, err)
	rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) "+sql(claimSQL), "default", 100, "w", 30.0, 5, int64(16000000))
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	plan := strings.Join(lines, "\n")
	pages := planPages(t, plan)
	t.Logf("claim: %d pages", pages)
	require.Less(t, pages, 4*65536, "the claim walked to each locked job:\n%s", plan)
}

// claimPages prepares the claims and looks on an empty table, fills it
// with fill and two due jobs at priority 2 of the default queue, and
// requires each to read fewer than bound pages.
func claimPages(t *testing.T, fill string, bound int) {
	t.Helper()
	ctx := context.Background()
	schema := pgtest.FreshSchema(t) // a table never analyzed, as after a migration
	conn, err := pgtest.Pool(t).Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	exec := func(sql string) {
		t.Helper()
		_, err := conn.Exec(ctx, pinned.WithSchema(sql, schema))
		require.NoError(t, err, sql)
	}
	statements := []struct{ name, sql, types, args string }{
		{"claim", claimSQL, "text, int, text, float8, int, bigint", "'default', 100, 'w', 30, 5, 16000000"},
		{"claim_none_due", claimSQL, "text, int, text, float8, int, bigint", "'later', 100, 'w', 30, 5, 16000000"},
		{"claim_lean", leanClaimSQL, "text, int, text, float8, int, bigint", "'default', 100, 'w', 30, 5, 16000000"},
		{
			"claim_cursor", cursor.SQL(claimSQL), "text, int, text, float8, int, bigint, smallint, timestamptz, bigint",
			"'default', 100, 'w', 30, 5, 16000000, 2, now() - interval '30 minutes', 0",
		},
		{
			"claim_cursor_none_due", cursor.SQL(claimSQL), "text, int, text, float8, int, bigint, smallint, timestamptz, bigint",
			"'default', 100, 'w', 30, 5, 16000000, 2, now(), 0",
		},
		{"look", cursor.LookSQL, "text", "'default'"},
		{"look_none_due", cursor.LookSQL, "text", "'later'"},
	}
	explain := func(name, args, options string) string {
		t.Helper()
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck
		_, err = tx.Exec(ctx, pinned.ClaimPlanSQL)
		require.NoError(t, err)
		rows, err := tx.Query(ctx, "EXPLAIN "+options+" EXECUTE ahead_"+name+"("+args+")")
		require.NoError(t, err, name)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err, name)
		return strings.Join(lines, "\n")
	}
	// Each plan is made on the empty table, as a worker that starts on a
	// new queue makes it, and kept.
	for _, st := range statements {
		exec("PREPARE ahead_" + st.name + "(" + st.types + ") AS " + st.sql)
		explain(st.name, st.args, "")
	}
	defer func() {
		for _, st := range statements {
			exec("DEALLOCATE ahead_" + st.name)
		}
	}()
	exec(fill)
	exec("INSERT INTO {jobs} (kind, priority, run_at) VALUES ('noop', 2, now() - interval '1 hour'), ('noop', 2, now() - interval '1 minute')")

	for _, st := range statements {
		plan := explain(st.name, st.args, "(ANALYZE, BUFFERS, COSTS OFF)")
		pages := planPages(t, plan)
		t.Logf("%s: %d pages", st.name, pages)
		require.Less(t, pages, bound, "%s read the jobs scheduled ahead:\n%s", st.name, plan)
	}
}

// planPages is the pages an EXPLAIN (ANALYZE, BUFFERS) read: its top
// node's, the whole statement's.
func planPages(t *testing.T, plan string) int {
	t.Helper()
	m := regexp.MustCompile(`Buffers: shared hit=(\d+)(?: read=(\d+))?`).FindStringSubmatch(plan)
	require.NotNil(t, m, "plan:\n%s", plan)
	pages := 0
	for _, n := range m[1:] {
		if n != "" {
			k, err := strconv.Atoi(n)
			require.NoError(t, err)
			pages += k
		}
	}
	return pages
}

// An outcome batch that waits for the lock of a row the heartbeat is
// renewing writes it once the heartbeat commits: the row is found again
// by its key (id = ANY(ARRAY[v.id]), an index condition of the batch's
// plan) and its guard checked on the version the heartbeat wrote, which
// is still this worker's attempt. One whose row was cancelled meanwhile
// leaves it. The batch is planned after a drain, as in
// TestBatchPlansUseTheKey.
func TestOutcomesWaitingForTheHeartbeatWriteTheirRows(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schema := pgtest.FreshSchema(t)
	pool := newSizedPool(ctx, t, 4)
	sql := func(s string) string { return pinned.WithSchema(s, schema) }
	for _, s := range []string{
		"INSERT INTO {jobs} (kind) SELECT 'noop' FROM generate_series(1, 5000)",
		"VACUUM ANALYZE {jobs}",
		"DELETE FROM {jobs}",
		"ANALYZE {jobs}",
		`INSERT INTO {jobs} (kind, status, attempts, locked_by, locked_until, updated_at)
		 SELECT 'noop', 'running', 1, 'w', now() + interval '1 minute', '2026-01-01' FROM generate_series(1, 4)`,
	} {
		_, err := pool.Exec(ctx, sql(s))
		require.NoError(t, err, s)
	}
	var ids []int64
	rows, err := pool.Query(ctx, sql("SELECT id FROM {jobs} ORDER BY id"))
	require.NoError(t, err)
	ids, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	claimedAt := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	claims := []time.Time{claimedAt, claimedAt, claimedAt, claimedAt}

	// The heartbeat renews the second row, and another transaction
	// cancels the third; both hold their locks.
	heartbeat, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer heartbeat.Rollback(ctx) //nolint:errcheck
	_, err = heartbeat.Exec(ctx, pinned.PlanSQL)
	require.NoError(t, err)
	hb, err := heartbeat.Query(ctx, sql(lease.SQL), ids[1:2], claims[1:2], "w", 30.0)
	require.NoError(t, err)
	renewed, err := pgx.CollectRows(hb, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Equal(t, []int64{1}, renewed)
	canceller, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer canceller.Rollback(ctx) //nolint:errcheck
	_, err = canceller.Exec(ctx, sql("UPDATE {jobs} SET status = 'cancelled', locked_by = NULL, updated_at = now() WHERE id = $1"), ids[2])
	require.NoError(t, err)

	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	var pid int32
	require.NoError(t, conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
	type result struct {
		n   int64
		err error
	}
	done := make(chan result, 1)
	go func() {
		n := len(ids)
		fill := func(v any) []any {
			out := make([]any, n)
			for i := range out {
				out[i] = v
			}
			return out
		}
		results := pinned.Send(ctx, conn, pinned.OutcomePlanSQL, sql(completer.CompleteSQL), ids, claims,
			fill("done"), fill(0.0), fill(nil), fill(false), fill(nil), fill(nil), fill(nil), "w")
		_, err := results.Exec()
		var n2 int64
		if err == nil {
			var tag pgconn.CommandTag
			tag, err = results.Exec()
			n2 = tag.RowsAffected()
		}
		if closeErr := results.Close(); err == nil {
			err = closeErr
		}
		done <- result{n2, err}
	}()
	wait.For(t, 20*time.Second, "the outcomes to wait for a row's lock", func() bool {
		var waiting bool
		require.NoError(t, pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock')", pid).Scan(&waiting))
		return waiting
	})
	// The cancelled row is left whether the outcomes wait for its lock or
	// meet the cancellation committed.
	require.NoError(t, heartbeat.Commit(ctx))
	require.NoError(t, canceller.Commit(ctx))
	r := <-done
	require.NoError(t, r.err)
	require.Equal(t, int64(3), r.n, "the outcomes wrote the rows still this worker's, the renewed one among them")
	var statuses []string
	rows, err = pool.Query(ctx, sql("SELECT status FROM {jobs} ORDER BY id"))
	require.NoError(t, err)
	statuses, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"done", "done", "cancelled", "done"}, statuses)
}
