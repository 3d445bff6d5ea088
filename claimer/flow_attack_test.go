package claimer

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/claimer/internal/pinned"
	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/testhook"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/wait"
	"github.com/pgdispatch/pgdispatch/sweeper"
)

// A claim of a limited queue that skips a due job another transaction
// holds locked says it was stranded, as the plain claim does
// (TestClaimReportsNextAndStranded): when that transaction ends without
// changing status, run_at or queue, no trigger notifies, and only the
// claimer's own look finds the job again.
func TestFlowClaimSaysStrandedForALockedJob(t *testing.T) {
	t.Parallel()
	for _, key := range []string{"a", ""} {
		name := map[string]string{"a": "keyed", "": "without a key"}[key]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c, pool, jobs := newTestClaimer(ctx, t, Config{})
			setLimit(ctx, t, c, pool, "", 2, false, 0, 0)
			var id int64
			if key != "" {
				id = insertKeyed(ctx, t, pool, jobs, key, 1)[0]
			} else {
				id = insertJobs(ctx, t, pool, jobs, 1)[0]
			}
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
			_, err = tx.Exec(ctx, "SELECT FROM "+jobs+" WHERE id = $1 FOR UPDATE", id)
			require.NoError(t, err)
			runs, r := claimNow(ctx, t, c, 10)
			require.True(t, c.flow.limited)
			require.Empty(t, runs)
			require.True(t, r.Stranded, "the due job was skipped, locked: the claimer must look again by itself")
			require.NoError(t, tx.Rollback(ctx))
			runs, _ = claimNow(ctx, t, c, 10)
			require.Len(t, runs, 1)
		})
	}
}

// A claim of a limited queue holds the advisory lock of every limited key
// it walked until it commits. Keys that give nothing (at their limit, or
// with no job due yet) make it walk on, and lock, every key of the queue.
// The locks come from the server's shared lock table, of
// max_locks_per_transaction × (max_connections + max_prepared_transactions)
// entries for the whole cluster (6,400 by default): with more such keys
// than that, every claim of the queue fails with "out of shared memory",
// and while a claim holds thousands of locks, other sessions of the
// cluster may fail to take theirs. A claim should hold a bounded number of
// key locks, about what it takes.
func TestFlowClaimHoldsFewKeyLocks(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, pool, jobs := newTestClaimer(ctx, t, Config{})
	setLimit(ctx, t, c, pool, "", 1, false, 0, 0)
	const keys = 1000
	// Half the keys are at their limit (a job running, another due), half
	// have only a job due in an hour.
	_, err := pool.Exec(ctx, `INSERT INTO `+jobs+` (kind, flow_key, status, attempts, locked_by, locked_until)
		SELECT 'noop', 'held' || g, 'running', 1, 'ghost', now() + interval '1 hour' FROM generate_series(1, $1) g`, keys/2)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+jobs+` (kind, flow_key) SELECT 'noop', 'held' || g FROM generate_series(1, $1) g`, keys/2)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+jobs+` (kind, flow_key, run_at)
		SELECT 'noop', 'later' || g, now() + interval '1 hour' FROM generate_series(1, $1) g`, keys/2)
	require.NoError(t, err)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var claimed int
	require.NoError(t, tx.QueryRow(ctx, "SELECT count(id) FROM "+pgx.Identifier{c.cfg.Schema, "claim_flow"}.Sanitize()+
		"($1, 10, 'w', 30, 5, 1048576, NULL, true)", c.cfg.Queue).Scan(&claimed))
	require.Zero(t, claimed)
	var locks int
	require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND pid = pg_backend_pid()`).Scan(&locks))
	require.LessOrEqual(t, locks, 100, "a claim of 10 jobs that took none holds %d advisory locks, one per key of the queue", locks)
}

// listenFor wakes c at each notification on its schema's channel that
// names its queue, as the worker's listener does.
func listenFor(ctx context.Context, t *testing.T, c *Claimer) {
	t.Helper()
	conn, err := pgx.Connect(ctx, pgtest.URL())
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{c.cfg.Schema}.Sanitize())
	require.NoError(t, err)
	done := make(chan struct{})
	lctx, stop := context.WithCancel(ctx)
	go func() {
		defer close(done)
		for {
			n, err := conn.WaitForNotification(lctx)
			if err != nil {
				return
			}
			if n.Payload == c.cfg.Queue {
				c.Wake()
			}
		}
	}()
	t.Cleanup(func() { stop(); <-done; _ = conn.Close(context.Background()) })
}

// heldAndAsleep runs c under hooks that keep its state, and waits until it
// sleeps. A listener wakes it when its queue is notified.
func heldAndAsleep(ctx context.Context, t *testing.T, c *Claimer) {
	t.Helper()
	listenFor(ctx, t, c)
	var state atomic.Value
	state.Store("")
	runClaimer(testhook.With(ctx, &testhook.Hooks{ClaimerState: func(_, _, to string) { state.Store(to) }}), t, c)
	wait.For(t, 30*time.Second, "the claimer to sleep", func() bool { return state.Load() == "asleep" })
}

// A key at its concurrency limit whose running job is another worker's
// starts its next job when that job ends, without the fallback tick, also
// when that worker no longer claims: it is shutting down (a rolling
// deploy) and lets its running job finish. The job's end notifies no one,
// and the held worker, asleep, looks again only when a slot of its own
// frees.
func TestFlowHeldKeyStartsWhenAStoppingWorkersJobEnds(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var ids []int64
	release := make(chan struct{})
	started := make(chan int64, 10)
	registry := executors.NewRegistry()
	registry.Register("noop", executors.Func(func(ctx context.Context, job *executors.Job) error {
		started <- job.ID
		if job.ID == ids[0] {
			<-release
		}
		return nil
	}))
	opts := Options{Concurrency: 4, PollInterval: time.Hour}
	c1, pool, jobs := newTestClaimer(ctx, t, Config{Registry: registry, Options: opts})
	cfg2 := c1.cfg
	cfg2.WorkerID = "w2"
	c2, err := New(cfg2)
	require.NoError(t, err)
	setLimit(ctx, t, c1, pool, "", 1, false, 0, 0)
	ids = insertKeyed(ctx, t, pool, jobs, "k", 2)

	var stopping atomic.Bool
	stop1 := runClaimer(testhook.With(ctx, &testhook.Hooks{ClaimerState: func(_, _, to string) {
		if to == "stopping" {
			stopping.Store(true)
		}
	}}), t, c1)
	require.Equal(t, ids[0], <-started)
	stopped := make(chan error, 1)
	go func() { stopped <- stop1() }() // waits for the running job
	wait.For(t, 30*time.Second, "worker 1 to stop claiming", stopping.Load)

	heldAndAsleep(ctx, t, c2) // k is held: its job runs on worker 1
	close(release)
	require.NoError(t, <-stopped)
	var status string
	require.NoError(t, pool.QueryRow(ctx, "SELECT status FROM "+jobs+" WHERE id = $1", ids[0]).Scan(&status))
	require.Equal(t, "done", status)
	select {
	case id := <-started:
		require.Equal(t, ids[1], id)
	case <-ctx.Done():
		t.Fatal("k's running job ended, and its next job did not start: worker 2 sleeps until its fallback tick")
	}
}

// A key at its concurrency limit whose running job ends outside any
// worker (the sweeper kills it when its lease expires with its attempts
// used up; an operator cancels it) starts its next job without the
// fallback tick.
func TestFlowHeldKeyStartsWhenItsJobEndsOutsideAWorker(t *testing.T) {
	t.Parallel()
	for _, end := range []string{"sweeper", "cancel"} {
		t.Run(end, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			started := make(chan int64, 10)
			registry := executors.NewRegistry()
			registry.Register("noop", executors.Func(func(ctx context.Context, job *executors.Job) error {
				started <- job.ID
				return nil
			}))
			c, pool, jobs := newTestClaimer(ctx, t, Config{Registry: registry, Options: Options{Concurrency: 4, PollInterval: time.Hour}})
			setLimit(ctx, t, c, pool, "", 1, false, 0, 0)
			// The running job of a worker that died: its lease has expired
			// and it has no attempt left.
			var running int64
			require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+jobs+` (kind, flow_key, status, attempts, max_attempts, locked_by, locked_until)
				VALUES ('noop', 'k', 'running', 1, 1, 'ghost', now() - interval '1 second') RETURNING id`).Scan(&running))
			next := insertKeyed(ctx, t, pool, jobs, "k", 1)[0]

			heldAndAsleep(ctx, t, c)
			switch end {
			case "sweeper":
				s, err := sweeper.New(sweeper.Config{Pool: pool, Schema: c.cfg.Schema})
				require.NoError(t, err)
				res, err := s.Sweep(ctx)
				require.NoError(t, err)
				require.EqualValues(t, 1, res.Killed)
			case "cancel":
				_, err := pool.Exec(ctx, "SELECT * FROM "+pgx.Identifier{c.cfg.Schema, "cancel"}.Sanitize()+"($1)", running)
				require.NoError(t, err)
			}
			select {
			case id := <-started:
				require.Equal(t, next, id)
			case <-ctx.Done():
				t.Fatalf("k's running job ended (%s), and its next job did not start: the claimer sleeps until its fallback tick", end)
			}
		})
	}
}

// claim_flow's statements are planned once per connection, generic plans
// kept for its life, like the claimer's own (plan_test.go): planned while
// the table was empty, or on statistics taken then, they must still find
// a key's jobs by the key (jobs_flow_pending_idx), not read every pending
// job of the queue once per claim or once per key.
func TestFlowPlansFindJobsByKey(t *testing.T) {
	t.Parallel()
	for _, setup := range []string{"planned on an empty table", "planned on stale statistics"} {
		t.Run(setup, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			// A schema of its own, never used: a reused one, emptied by DELETE,
			// keeps dead rows that a stale ANALYZE then counts otherwise.
			c, pool, jobs := newTestClaimerIn(ctx, t, Config{}, pgtest.FreshSchema(t))
			setLimit(ctx, t, c, pool, "", 0, true, 0, 0)
			conn, err := pool.Acquire(ctx) // one connection: the plans are its own
			require.NoError(t, err)
			defer conn.Release()
			claim := func() (claimed int, fetched int64) {
				tx, err := conn.Begin(ctx)
				require.NoError(t, err)
				defer func() { _ = tx.Rollback(ctx) }()
				_, err = tx.Exec(ctx, pinned.FlowPlanSQL)
				require.NoError(t, err)
				require.NoError(t, tx.QueryRow(ctx, "SELECT count(id) FROM "+pgx.Identifier{c.cfg.Schema, "claim_flow"}.Sanitize()+
					"($1, 10, 'w', 30, 5, 1048576, NULL, true)", c.cfg.Queue).Scan(&claimed))
				require.NoError(t, tx.QueryRow(ctx, `SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)
					FROM pg_stat_xact_user_tables WHERE relid = $1::regclass`, jobs).Scan(&fetched))
				return claimed, fetched
			}
			if setup == "planned on an empty table" {
				claim()
			} else {
				// The statistics stay those of the empty table: an autoanalyze
				// of the filled one, which a loaded machine's autovacuum may
				// run at any moment, is another test's premise.
				_, err = pool.Exec(ctx, "ALTER TABLE "+jobs+" SET (autovacuum_enabled = false)")
				require.NoError(t, err)
				t.Cleanup(func() {
					_, _ = pgtest.Pool(t).Exec(context.Background(), "ALTER TABLE "+jobs+" RESET (autovacuum_enabled)")
				})
				_, err = pool.Exec(ctx, "ANALYZE "+jobs)
				require.NoError(t, err)
			}
			_, err = pool.Exec(ctx, `INSERT INTO `+jobs+` (kind, flow_key) SELECT 'noop', 'k' || (g % 2000) FROM generate_series(1, 20000) g`)
			require.NoError(t, err)
			claimed, fetched := claim()
			require.Equal(t, 10, claimed)
			require.Less(t, fetched, int64(2000), "a claim of 10 jobs of a queue of 20,000 read %d rows of jobs", fetched)
		})
	}
}

// claim_flow's plans made once a burst had drained and the table was
// analyzed (its pages and index entries there, no row live), as a worker's
// new connection makes them, hold: its look for the jobs without a key,
// which every claim that walks past the last key makes, reads each
// priority's due jobs in jobs_claim_idx from its first one, as many as it
// needs. Planned after such a drain without incremental sorts turned off, it
// read jobs_schedule_idx from the priority's first job and sorted every due
// job of the queue, at every such claim (20,000 rows here; 47 ms a claim
// with 200,000 due jobs, against 6).
func TestFlowClaimPlannedAfterADrain(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, pool, jobs := newTestClaimerIn(ctx, t, Config{}, pgtest.FreshSchema(t))
	setLimit(ctx, t, c, pool, "", 1, false, 0, 0)
	// The statistics stay those of the drained table: an autoanalyze of the
	// filled one would plan on the truth.
	_, err := pool.Exec(ctx, "ALTER TABLE "+jobs+" SET (autovacuum_enabled = false)")
	require.NoError(t, err)
	for _, sql := range []string{
		// another queue's burst, whose dead entries no claim of this one
		// reads (a snapshot held elsewhere on the server keeps them)
		"INSERT INTO " + jobs + " (kind, queue, flow_key) SELECT 'noop', 'burst', 'k' || (g % 2000) FROM generate_series(1, 50000) g",
		"VACUUM ANALYZE " + jobs,
		"UPDATE " + jobs + " SET status = 'running', attempts = 1, locked_by = 'w', locked_until = now() + interval '1 minute'",
		"DELETE FROM " + jobs,
		"ANALYZE " + jobs,
		// 20 keys, each of which gives one job to a claim of 30: every claim
		// walks past the last key, to the jobs without a key
		"INSERT INTO " + jobs + " (kind, flow_key) SELECT 'noop', 'k' || (g % 20) FROM generate_series(1, 20000) g",
	} {
		_, err := pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	conn, err := pool.Acquire(ctx) // one connection: the plans are its own
	require.NoError(t, err)
	defer conn.Release()
	claim := func() (claimed int, fetched int64) {
		t.Helper()
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		// the counts not yet reported of the connection's transactions,
		// the setup's among them: the claim's are what it adds
		read := func() (n int64) {
			require.NoError(t, tx.QueryRow(ctx, `SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0)
				FROM pg_stat_xact_user_tables WHERE relid = $1::regclass`, jobs).Scan(&n))
			return n
		}
		before := read()
		_, err = tx.Exec(ctx, pinned.FlowPlanSQL)
		require.NoError(t, err)
		require.NoError(t, tx.QueryRow(ctx, "SELECT count(id) FROM "+pgx.Identifier{c.cfg.Schema, "claim_flow"}.Sanitize()+
			"($1, 30, 'w', 30, 5, 1048576, NULL, true)", c.cfg.Queue).Scan(&claimed))
		return claimed, read() - before
	}
	claim() // the plans
	claimed, fetched := claim()
	require.Equal(t, 20, claimed)
	require.Less(t, fetched, int64(2000), "a claim of 20 jobs of a queue of 20,000 read %d rows of jobs", fetched)
}

// A limited queue whose jobs mostly wait for later (retries in their
// backoff, jobs scheduled ahead: 2,000 keys with only such jobs, and
// twice as many jobs without a key) gives its due jobs to one claim, walking only
// the keys that have one, and reads neither the keys nor the jobs ahead
// of them. Its plans are made on the empty table, as a worker that starts
// on a new queue makes them, and kept: one taking a job by its id reads no
// other job, for the jobs without a key and for a strict key's head.
// And a key whose due job another transaction holds is passed, the
// others' taken.
func TestFlowClaimsDoNotReadJobsScheduledAhead(t *testing.T) {
	t.Parallel()
	// 20,000 jobs of 2,000 keys and 40,000 without a key, all a day ahead
	const ahead = `SELECT 'noop', CASE WHEN g % 3 = 0 THEN 'k' || lpad((g % 2000)::text, 4, '0') END,
		now() + interval '1 day' + g * interval '1 second' FROM generate_series(1, 60000) g`
	for _, tc := range []struct {
		name   string
		strict bool
		fill   string // the rest of the queue, after the plans are made
		held   bool   // another transaction holds key w's due job
	}{
		{name: "concurrency", fill: ahead},
		{name: "strict", strict: true, fill: ahead},
		// due jobs at every key but after those taken, 40,000 of them
		{name: "a due job held", held: true, fill: `SELECT 'noop', 'zz' || lpad((g % 4000)::text, 4, '0'),
			now() - interval '1 second' FROM generate_series(1, 40000) g`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			flowClaimPages(t, tc.strict, tc.fill, tc.held)
		})
	}
}

func flowClaimPages(t *testing.T, strict bool, fill string, held bool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, pool, jobs := newTestClaimerIn(ctx, t, Config{}, pgtest.FreshSchema(t))
	concurrency := 1
	if strict {
		concurrency = 0
	}
	setLimit(ctx, t, c, pool, "", concurrency, strict, 0, 0)
	conn, err := pool.Acquire(ctx) // one connection: the plans are its own
	require.NoError(t, err)
	defer conn.Release()
	claim := func(want string) int {
		t.Helper()
		return explainFlowClaim(ctx, t, conn, c, 3, func(tx pgx.Tx) {
			var claimed string
			require.NoError(t, tx.QueryRow(ctx, "SELECT string_agg(coalesce(flow_key, '-'), ' ' ORDER BY flow_key NULLS FIRST) FROM "+jobs+
				" WHERE status = 'running'").Scan(&claimed))
			require.Equal(t, want, claimed, "the jobs the claim takes, by key")
		})
	}
	_, err = pool.Exec(ctx, `INSERT INTO `+jobs+` (kind, flow_key, run_at) VALUES
		('noop', 'w', now() - interval '1 minute'), ('noop', 'x', now() - interval '1 minute'),
		('noop', 'y', now() - interval '1 minute'), ('noop', NULL, now() - interval '1 minute')`)
	require.NoError(t, err)
	// w, before the keys of the due jobs, is held by another transaction
	// throughout, or waits for later
	other, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = other.Rollback(ctx) }()
	_, err = other.Exec(ctx, "SELECT FROM "+jobs+" WHERE flow_key = 'w' FOR UPDATE")
	require.NoError(t, err)
	if !held {
		require.NoError(t, other.Rollback(ctx))
		_, err = pool.Exec(ctx, "UPDATE "+jobs+" SET run_at = now() + interval '1 hour' WHERE flow_key = 'w'")
		require.NoError(t, err)
	}
	claim("- x y") // the plans, made on the empty table and kept
	_, err = pool.Exec(ctx, `INSERT INTO `+jobs+` (kind, flow_key, run_at) `+fill)
	require.NoError(t, err)
	want := "- x y" // one claim takes the three due jobs
	if held {
		want = "x y zz0000" // the keys first, then the jobs without a key
	}
	pages := claim(want)
	// About 300 pages: the walk passes over the 20,000 entries of the keys
	// ahead, about 170 pages of jobs_flow_pending_idx. The bound leaves room
	// for the catalog reads that other tests' schemas cause; a look for the
	// jobs without a key in one scan read 570 pages, and a take by id in
	// jobs_kind_idx 1,700 and more.
	require.Less(t, pages, 450, "the claim read %d pages", pages)
}

// explainFlowClaim makes a claim of up to limit jobs with c's claim_flow on
// conn, in a transaction of the claimer's settings for it (FlowPlanSQL), under EXPLAIN (ANALYZE,
// BUFFERS); runs check in the same transaction; rolls it back, and returns
// the pages the claim read.
func explainFlowClaim(ctx context.Context, t *testing.T, conn *pgxpool.Conn, c *Claimer, limit int, check func(pgx.Tx)) int {
	t.Helper()
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, pinned.FlowPlanSQL)
	require.NoError(t, err)
	rows, err := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) SELECT count(id) FROM "+
		pgx.Identifier{c.cfg.Schema, "claim_flow"}.Sanitize()+"($1, $2, 'w', 30, 5, 1048576, NULL, true)", c.cfg.Queue, limit)
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	pages := planPages(t, strings.Join(lines, "\n"))
	t.Logf("the claim read %d pages", pages)
	check(tx)
	return pages
}

// A claim of a limited queue whose keyed jobs mostly wait for later reads
// about as much with 200,000 of them as with 50,000: with no job due (a
// claim woken by a job scheduled ahead, a timer, the tick) it walks no key,
// and with a few due it walks their keys, not the entries of the jobs
// ahead between them.
func TestFlowClaimCostDoesNotGrowWithKeyedJobsAhead(t *testing.T) {
	t.Parallel()
	for _, due := range []bool{false, true} {
		t.Run(map[bool]string{false: "none due", true: "three due"}[due], func(t *testing.T) {
			t.Parallel()
			flowClaimGrowth(t, due)
		})
	}
}

func flowClaimGrowth(t *testing.T, due bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, pool, jobs := newTestClaimerIn(ctx, t, Config{}, pgtest.FreshSchema(t))
	setLimit(ctx, t, c, pool, "", 1, false, 0, 0)
	conn, err := pool.Acquire(ctx) // one connection: the plans are its own
	require.NoError(t, err)
	defer conn.Release()
	claim := func() (pages int, nextIn *float64, claimed int) {
		pages = explainFlowClaim(ctx, t, conn, c, 10, func(tx pgx.Tx) {
			require.NoError(t, tx.QueryRow(ctx, "SELECT count(*) FROM "+jobs+" WHERE status = 'running'").Scan(&claimed))
			// a claim again, for what it says beside its jobs: with none due,
			// what the first said
			require.NoError(t, tx.QueryRow(ctx, "SELECT min(next_in) FROM "+pgx.Identifier{c.cfg.Schema, "claim_flow"}.Sanitize()+
				"($1, 10, 'w', 30, 5, 1048576, NULL, true)", c.cfg.Queue).Scan(&nextIn))
		})
		return pages, nextIn, claimed
	}
	fill := func(from, to int) {
		t.Helper()
		_, err := pool.Exec(ctx, `INSERT INTO `+jobs+` (kind, flow_key, run_at)
			SELECT 'noop', 'k' || lpad((g % 20000)::text, 5, '0'), now() + interval '1 day' + g * interval '1 ms'
			FROM generate_series($1::int, $2::int) g`, from, to)
		require.NoError(t, err)
	}
	want := 0
	if due { // keys before those of the jobs ahead
		_, err := pool.Exec(ctx, `INSERT INTO `+jobs+` (kind, flow_key, run_at) VALUES
			('noop', 'a', now() - interval '1 minute'), ('noop', 'b', now() - interval '1 minute'), ('noop', 'c', now() - interval '1 minute')`)
		require.NoError(t, err)
		want = 3
	}
	fill(1, 1)
	claim() // the plans, made on a nearly empty table
	fill(2, 50000)
	small, _, claimed := claim()
	require.Equal(t, want, claimed)
	fill(50001, 200000)
	large, nextIn, claimed := claim()
	require.Equal(t, want, claimed)
	t.Logf("a claim read %d pages with 50,000 keyed jobs ahead, %d with 200,000", small, large)
	require.Less(t, large, 2*small+100, "the claim's cost grows with the keyed jobs scheduled ahead")
	if !due {
		require.NotNil(t, nextIn)
		require.InDelta(t, 86400, *nextIn, 60, "it says when the first job is due")
	}
}

// A claimer asleep on a limited queue, its timer set for a job due later,
// is woken by the clearing of the queue's last limit: the claim that
// follows must still tell when the job is due, and the job runs then, not
// at the fallback tick.
func TestFlowLimitsClearedWhileAsleepKeepTheTimer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ran := make(chan int64, 1)
	registry := executors.NewRegistry()
	registry.Register("noop", executors.Func(func(_ context.Context, job *executors.Job) error { ran <- job.ID; return nil }))
	c, pool, jobs := newTestClaimer(ctx, t, Config{Registry: registry, Options: Options{PollInterval: time.Hour}})
	setLimit(ctx, t, c, pool, "a", 1, false, 0, 0)
	var id int64
	require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+jobs+" (kind, run_at) VALUES ('noop', now() + interval '3 seconds') RETURNING id").Scan(&id))
	heldAndAsleep(ctx, t, c)
	require.True(t, c.limited.Load(), "the claimer claims under the limits")
	_, err := pool.Exec(ctx, "SELECT "+pgx.Identifier{c.cfg.Schema, "clear_flow_limit"}.Sanitize()+"($1, $2)", c.cfg.Queue, "a")
	require.NoError(t, err)
	select {
	case got := <-ran:
		require.Equal(t, id, got)
	case <-time.After(15 * time.Second):
		t.Fatal("the job due in 3 s did not run: the claimer's timer was lost")
	}
}
