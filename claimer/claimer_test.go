package claimer

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgdispatch/pgdispatch/claimer/internal/machine"
	"github.com/pgdispatch/pgdispatch/claimer/internal/runners"
	"github.com/pgdispatch/pgdispatch/claimer/internal/runstate"
	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/testhook"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/wait"
)

// newTestClaimer is a claimer of the default queue of a schema of the test's
// own, on a pool of the test's own, claiming from the front; cfg sets its
// options. It returns the
// claimer, its pool and the quoted jobs table.
func newTestClaimer(ctx context.Context, t *testing.T, cfg Config) (*Claimer, *pgxpool.Pool, string) {
	t.Helper()
	return newTestClaimerIn(ctx, t, cfg, pgtest.Schema(t))
}

// newTestClaimerIn is newTestClaimer in schema.
func newTestClaimerIn(ctx context.Context, t *testing.T, cfg Config, schema string) (*Claimer, *pgxpool.Pool, string) {
	t.Helper()
	pool := newSizedPool(ctx, t, 10)
	cfg.Pool, cfg.Schema, cfg.SleepConnConfig = pool, schema, pool.Config().ConnConfig
	cfg.Queue, cfg.WorkerID = "default", "w"
	if cfg.Registry == nil {
		cfg.Registry = executors.NewRegistry()
	}
	c, err := New(cfg)
	require.NoError(t, err)
	// Every look from the front counts as quick, so that a loaded machine
	// does not send the claims to the cursor; the cursor's tests set it.
	c.cursor.Slow = time.Hour
	return c, pool, pgx.Identifier{schema, "jobs"}.Sanitize()
}

// newSizedPool is a pool of the test's own, of maxConns connections at most,
// closed when the test ends.
func newSizedPool(ctx context.Context, t *testing.T, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

func insertJobs(ctx context.Context, t *testing.T, pool *pgxpool.Pool, jobs string, n int) []int64 {
	t.Helper()
	rows, err := pool.Query(ctx, "INSERT INTO "+jobs+" (kind) SELECT 'noop' FROM generate_series(1, $1) RETURNING id", n)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	return ids
}

// lockJob holds job id locked, FOR UPDATE, in a transaction of pool's
// until the returned transaction ends (at the test's end at the latest).
func lockJob(ctx context.Context, t *testing.T, pool *pgxpool.Pool, jobs string, id int64) pgx.Tx {
	t.Helper()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.WithoutCancel(ctx)) })
	_, err = tx.Exec(ctx, "SELECT FROM "+jobs+" WHERE id = $1 FOR UPDATE", id)
	require.NoError(t, err)
	return tx
}

// runClaimer runs c until the returned stop is called, or the test ends;
// stop returns Run's error.
func runClaimer(ctx context.Context, t *testing.T, c *Claimer) (stop func() error) {
	t.Helper()
	runCtx, cancel := context.WithCancel(ctx)
	exited := make(chan error, 1)
	go func() { exited <- c.Run(runCtx) }()
	var (
		once sync.Once
		err  error
	)
	stop = func() error {
		once.Do(func() { cancel(); err = <-exited })
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

// claimNow claims up to limit jobs and returns the runs, without starting
// them: the runners are closed at once.
func claimNow(ctx context.Context, t *testing.T, c *Claimer, limit int) ([]*runstate.Run, machine.Result) {
	t.Helper()
	var (
		mu   sync.Mutex
		runs []*runstate.Run
	)
	jobs := runners.New(func(r *runstate.Run) { mu.Lock(); runs = append(runs, r); mu.Unlock() })
	r, claimed := c.claim(ctx, limit)
	start(jobs, claimed)
	<-jobs.Wait()
	jobs.Close(true)
	require.NoError(t, r.Err)
	return runs, r
}

// The claim asks for its generic plan with a transaction-local setting: it
// must claim as before, and the setting must not outlive the claim on the
// pooled connection, which other code shares.
func TestClaimKeepsPlanSettingToItself(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, _, jobs := newTestClaimer(ctx, t, Config{})
	pool := newSizedPool(ctx, t, 1) // every statement below runs on the claim's connection
	c.cfg.Pool = pool
	insertJobs(ctx, t, pool, jobs, 3)

	runs, r := claimNow(ctx, t, c, 2)
	require.Len(t, runs, 2)
	require.Equal(t, 2, r.Claimed)
	var running int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+jobs+" WHERE status = 'running' AND locked_by = 'w'").Scan(&running))
	require.Equal(t, 2, running)

	var mode string
	require.NoError(t, pool.QueryRow(ctx, "SELECT current_setting('plan_cache_mode')").Scan(&mode))
	require.Equal(t, "auto", mode)
}

// Each claimed job keeps its own payload: the rows are scanned into reused
// values, never a reused buffer.
func TestClaimedPayloadsAreTheirOwn(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, pool, jobs := newTestClaimer(ctx, t, Config{})
	_, err := pool.Exec(ctx, "INSERT INTO "+jobs+" (kind, payload) SELECT 'noop', jsonb_build_object('n', g) FROM generate_series(1, 6) g")
	require.NoError(t, err)
	runs, _ := claimNow(ctx, t, c, 6)
	require.Len(t, runs, 6)
	seen := map[string]bool{}
	for _, r := range runs {
		seen[string(r.Job.Payload)] = true
	}
	for i := 1; i <= 6; i++ {
		require.True(t, seen[fmt.Sprintf(`{"n": %d}`, i)], "payload of job %d", i)
	}
}

// A claim that finds nothing says when the next job is due, and whether it
// skipped due rows that another transaction held locked. One that takes
// jobs, fewer than asked, says neither (Untold): the look after it does.
func TestClaimReportsNextAndStranded(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, pool, jobs := newTestClaimer(ctx, t, Config{})
	ids := insertJobs(ctx, t, pool, jobs, 2)
	_, err := pool.Exec(ctx, "INSERT INTO "+jobs+" (kind, run_at) VALUES ('noop', now() + interval '1 hour')")
	require.NoError(t, err)
	tx := lockJob(ctx, t, pool, jobs, ids[0])

	runs, r := claimNow(ctx, t, c, 5)
	require.Len(t, runs, 1)
	require.Equal(t, ids[1], runs[0].Job.ID)
	require.True(t, r.Untold, "a claim that took a job reads neither")
	require.False(t, r.Stranded)
	require.Nil(t, r.Next)

	runs, r = claimNow(ctx, t, c, 5)
	require.Empty(t, runs)
	require.False(t, r.Untold)
	require.True(t, r.Stranded, "the locked job was skipped")
	require.NotNil(t, r.Next)
	require.InDelta(t, time.Hour.Seconds(), r.Next.Seconds(), 5)

	require.NoError(t, tx.Rollback(ctx))
	runs, r = claimNow(ctx, t, c, 5)
	require.Len(t, runs, 1)
	require.Equal(t, ids[0], runs[0].Job.ID)
	require.False(t, r.Stranded)
	runs, r = claimNow(ctx, t, c, 5)
	require.Empty(t, runs)
	require.False(t, r.Stranded, "nothing due is left")
	require.NotNil(t, r.Next)

	// A full claim reports neither.
	insertJobs(ctx, t, pool, jobs, 3)
	_, r = claimNow(ctx, t, c, 2)
	require.Equal(t, 2, r.Claimed)
	require.Nil(t, r.Next)
	require.False(t, r.Stranded)
	require.False(t, r.Untold)
}

// A claim that expects few jobs (a notification starts it, or the claim
// before came up short) is lean: it takes the jobs of the first priority
// only, and when it takes nothing, it says when the next job is due, in the
// one statement, unless a job is due: then the full claim follows, so that
// the claimer still takes the jobs due at later priorities and learns
// whether it skipped locked ones.
func TestWokenClaimTellsAsTheFullClaim(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, pool, jobs := newTestClaimer(ctx, t, Config{})
	sent := 0
	c.claimSent = func(string) { sent++ }
	woken := func(limit int) ([]*runstate.Run, machine.Result) {
		t.Helper()
		c.quiet, sent = true, 0
		return claimNow(ctx, t, c, limit)
	}
	runs, r := woken(5)
	require.Empty(t, runs)
	require.Nil(t, r.Next, "an empty queue")
	require.False(t, r.Stranded)
	require.Equal(t, 1, sent, "the lean claim alone")
	_, err := pool.Exec(ctx, "INSERT INTO "+jobs+" (kind, run_at) VALUES ('noop', now() + interval '1 hour')")
	require.NoError(t, err)
	runs, r = woken(5)
	require.Empty(t, runs)
	require.NotNil(t, r.Next, "the lean claim said when the job is due")
	require.InDelta(t, time.Hour.Seconds(), r.Next.Seconds(), 5)
	require.False(t, r.Untold)
	require.False(t, r.Stranded)
	require.Equal(t, 1, sent, "the lean claim alone")

	ids := insertJobs(ctx, t, pool, jobs, 2)
	tx := lockJob(ctx, t, pool, jobs, ids[0])
	runs, r = woken(5)
	require.Len(t, runs, 1)
	require.Equal(t, ids[1], runs[0].Job.ID)
	require.True(t, r.Untold, "a claim that took a job reads neither")
	runs, r = woken(5)
	require.Empty(t, runs)
	require.True(t, r.Stranded, "the locked job was skipped")
	require.NotNil(t, r.Next)
	require.Equal(t, 2, sent, "the full claim followed the lean one")
	require.NoError(t, tx.Rollback(ctx))
	runs, _ = woken(5)
	require.Len(t, runs, 1)

	// Due jobs at 3 priorities: the lean claim takes the first priority's,
	// and the look that follows the rest, in order.
	_, err = pool.Exec(ctx, "DELETE FROM "+jobs+" WHERE status = 'pending'")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "INSERT INTO "+jobs+" (kind, priority) SELECT 'noop', p FROM generate_series(1, 3) p, generate_series(1, 2)")
	require.NoError(t, err)
	runs, r = woken(100)
	require.Len(t, runs, 2)
	require.True(t, r.Untold, "the look that follows finds the rest")
	for _, run := range runs {
		require.Equal(t, int16(1), run.Job.Priority)
	}
	c.quiet = false
	runs, _ = claimNow(ctx, t, c, 100)
	var priorities []int
	for _, run := range runs { // in the order they ran
		priorities = append(priorities, int(run.Job.Priority))
	}
	slices.Sort(priorities)
	require.Equal(t, []int{2, 2, 3, 3}, priorities)

	// Not due at the first priority, due at the next.
	_, err = pool.Exec(ctx, `INSERT INTO `+jobs+` (kind, priority, run_at) VALUES
		('noop', 1, now() + interval '1 hour'), ('noop', 2, now())`)
	require.NoError(t, err)
	runs, r = woken(100)
	require.Len(t, runs, 1, "the full claim followed the lean one, which took nothing")
	require.Equal(t, int16(2), runs[0].Job.Priority)
	require.True(t, r.Untold)
	require.Equal(t, 2, sent)
}

// A stream of jobs at the first priority, each claim finding another, does
// not keep a due job of a later priority waiting while slots are free: the
// claim after two that took jobs is full, and takes it.
func TestStreamAtFirstPriorityLetsLaterPrioritiesRun(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, pool, jobs := newTestClaimer(ctx, t, Config{Options: Options{Concurrency: 10}})
	insert := func(priority int) int64 {
		var id int64
		if err := pool.QueryRow(ctx, "INSERT INTO "+jobs+" (kind, priority) VALUES ('noop', $1) RETURNING id", priority).Scan(&id); err != nil {
			t.Error(err)
		}
		return id
	}
	const stream = 40
	var (
		claims, inserted int
		later            int64
		tookAt           atomic.Int32
	)
	took := make(chan struct{})
	insert(1)
	hooks := &testhook.Hooks{
		ClaimSent: func(string) { claims++ },
		// On the claim loop, before the next claim is sent: each job taken
		// is followed by another at the first priority, so that every
		// claim finds one, and the first by a job at the second.
		ClaimReturned: func(_ string, id int64) {
			if id == later {
				tookAt.Store(int32(claims))
				close(took)
			}
			if later == 0 {
				later = insert(2)
			}
			if inserted < stream {
				inserted++
				insert(1)
			}
		},
	}
	stop := runClaimer(testhook.With(ctx, hooks), t, c)
	select {
	case <-took:
	case <-ctx.Done():
		t.Fatal("the second priority's job was not taken")
	}
	require.NoError(t, stop())
	require.LessOrEqual(t, tookAt.Load(), int32(3), "taken by the third claim at the latest, while the stream went on")
}

// Flow limits declared between a lean claim that took nothing while a job
// was due (locked by another transaction) and the full claim after it: the
// full claim finds them and claim_flow claims, so that the claimer still
// learns when the next job is due.
func TestWokenClaimWhileFlowLimitsBeginTellsAsTheFlowClaim(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, pool, jobs := newTestClaimer(ctx, t, Config{})
	var id int64
	require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+jobs+" (kind, flow_key) VALUES ('noop', 'a') RETURNING id").Scan(&id))
	lockJob(ctx, t, pool, jobs, id)
	_, err := pool.Exec(ctx, "INSERT INTO "+jobs+" (kind, run_at, flow_key) VALUES ('noop', now() + interval '1 hour', 'a')")
	require.NoError(t, err)
	sent := 0
	c.claimSent = func(string) {
		if sent++; sent == 1 { // the lean claim is on its way: the limits begin
			setLimit(ctx, t, c, pool, "a", 1, false, 0, 0)
		}
	}
	c.quiet = true
	runs, r := claimNow(ctx, t, c, 5)
	require.Empty(t, runs)
	require.Equal(t, 3, sent, "the lean claim, the full one, then claim_flow")
	require.True(t, c.flow.limited)
	require.NotNil(t, r.Next, "claim_flow said when the job is due")
	require.InDelta(t, time.Hour.Seconds(), r.Next.Seconds(), 5)
}

// A claim stops adding jobs once their payloads pass ClaimBytes, and takes
// one at least, however large.
func TestClaimBytesBoundAClaim(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, pool, jobs := newTestClaimer(ctx, t, Config{Options: Options{ClaimBytes: 250_000}})
	// 100 kB payloads of random hex: they do not compress.
	_, err := pool.Exec(ctx, `INSERT INTO `+jobs+` (kind, payload)
		SELECT 'noop', jsonb_build_object('pad', string_agg(md5(random()::text), ''))
		FROM generate_series(1, 5) j, generate_series(1, 3125) g GROUP BY j`)
	require.NoError(t, err)
	runs, r := claimNow(ctx, t, c, 100)
	require.Len(t, runs, 3, "100 kB, 200 kB, then past 250 kB")
	require.True(t, r.Untold, "the rest are due: the claimer looks again soon, lingering")

	c.cfg.ClaimBytes = 1
	runs, _ = claimNow(ctx, t, c, 100)
	require.Len(t, runs, 1)

	// Payloads stored compressed count at their size decompressed: twenty
	// of 1 MB that compress well, read from a table, as a writer's INSERT
	// ... SELECT would bring them.
	_, err = pool.Exec(ctx, "DELETE FROM "+jobs)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `CREATE TEMP TABLE p AS SELECT jsonb_build_object('pad', repeat('abcdefgh', 124000)) AS payload;
		INSERT INTO `+jobs+` (kind, payload) SELECT 'noop', payload FROM p, generate_series(1, 20)`)
	require.NoError(t, err)
	var stored int
	require.NoError(t, pool.QueryRow(ctx, "SELECT max(pg_column_size(payload)) FROM "+jobs).Scan(&stored))
	require.Less(t, stored, 100_000, "stored compressed")
	c.cfg.ClaimBytes = 2_500_000
	runs, _ = claimNow(ctx, t, c, 100)
	require.Len(t, runs, 3, "1 MB, 2 MB, then past 2.5 MB")
}

// No row the table accepts can make the claim fail: attempts stops at the
// constraint's bound.
func TestClaimSurvivesAttemptsAtTheBound(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, pool, jobs := newTestClaimer(ctx, t, Config{})
	_, err := pool.Exec(ctx, "INSERT INTO "+jobs+" (kind, attempts, max_attempts) VALUES ('noop', 1000000, 1000000), ('noop', 0, NULL)")
	require.NoError(t, err)
	runs, _ := claimNow(ctx, t, c, 10)
	require.Len(t, runs, 2)
	attempts := map[int]bool{runs[0].Job.Attempt: true, runs[1].Job.Attempt: true}
	require.Equal(t, map[int]bool{1000000: true, 1: true}, attempts)
}

// While a job runs, its row says so: running, locked by this worker, its
// attempt counted, under a lease. Checked by every tenth job of a drain
// from inside its executor, and from outside by a reader that samples every
// row again and again while the drain goes on.
func TestRowTellsTheTruthDuringADrain(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const n = 3000
	var (
		seen    atomic.Int64
		checked atomic.Int64
		failure atomic.Value
		all     = make(chan struct{})
	)
	registry := executors.NewRegistry()
	var jobs string
	registry.Register("noop", executors.Func(func(ctx context.Context, job *executors.Job) error {
		if job.ID%10 == 0 {
			var (
				status, lockedBy string
				attempts         int
				leased           bool
			)
			err := pgtest.Pool(t).QueryRow(ctx, "SELECT status, locked_by, attempts, locked_until > now() FROM "+jobs+" WHERE id = $1",
				job.ID).Scan(&status, &lockedBy, &attempts, &leased)
			if err != nil || status != "running" || lockedBy != "w" || attempts != job.Attempt || !leased {
				failure.CompareAndSwap(nil, fmt.Sprintf("job %d while it ran: %s %q attempts %d leased %v (err %v)",
					job.ID, status, lockedBy, attempts, leased, err))
			}
			checked.Add(1)
		}
		if seen.Add(1) == n {
			close(all)
		}
		return nil
	}))
	c, pool, table := newTestClaimer(ctx, t, Config{Registry: registry, Options: Options{Concurrency: 50}})
	jobs = table
	insertJobs(ctx, t, pool, jobs, n)

	samples := 0
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for ctx.Err() == nil {
			select {
			case <-all:
				return
			default:
			}
			var bad int
			err := pgtest.Pool(t).QueryRow(ctx, `SELECT count(*) FROM `+jobs+` WHERE NOT (
				(status = 'pending' AND attempts = 0 AND locked_by IS NULL) OR
				(status = 'running' AND attempts = 1 AND locked_by = 'w' AND locked_until IS NOT NULL) OR
				(status = 'done' AND attempts = 1 AND locked_by IS NULL AND finished_at IS NOT NULL))`).Scan(&bad)
			if err != nil || bad > 0 {
				failure.CompareAndSwap(nil, fmt.Sprintf("sample %d: %d rows out of line (err %v)", samples, bad, err))
			}
			samples++
		}
	}()
	stop := runClaimer(ctx, t, c)
	select {
	case <-all:
	case <-ctx.Done():
		t.Fatal("the drain did not finish")
	}
	<-sampled
	require.NoError(t, stop())
	require.Nil(t, failure.Load())
	require.Equal(t, int64(n/10), checked.Load())
	require.Greater(t, samples, 3, "the reader sampled the table while the jobs ran")
	var done int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+jobs+" WHERE status = 'done' AND attempts = 1").Scan(&done))
	require.Equal(t, n, done)
	t.Logf("%d samples of the whole table during the drain", samples)
}

// After every connection of its pool was terminated (a failover, a proxy
// restarted), the claimer and the completer go through the dead connections
// the pool still holds without backing off: a claim or a write that fails
// on one is tried again at once, on the next.
func TestDeadConnectionsAreSkippedAtOnce(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schema := pgtest.Schema(t)
	const poolSize = 6
	pool, app := pgtest.UnpingedPool(ctx, t, poolSize)

	ran := make(chan int64, 1)
	registry := executors.NewRegistry()
	registry.Register("noop", executors.Func(func(_ context.Context, job *executors.Job) error {
		ran <- job.ID
		return nil
	}))
	core, logs := observer.New(zap.WarnLevel)
	c, err := New(Config{
		Pool: pool, Schema: schema, SleepConnConfig: pool.Config().ConnConfig, Queue: "default", WorkerID: "w",
		Registry: registry, Logger: zap.New(core),
	})
	require.NoError(t, err)
	stop := runClaimer(ctx, t, c)

	pgtest.FillPool(ctx, t, pool)
	require.Equal(t, poolSize, pgtest.TerminateApp(ctx, t, app))

	ids := insertJobs(ctx, t, pgtest.Pool(t), pgx.Identifier{schema, "jobs"}.Sanitize(), 1)
	c.Wake()
	select {
	case id := <-ran:
		require.Equal(t, ids[0], id)
	case <-ctx.Done():
		t.Fatal("the job never ran")
	}
	require.NoError(t, stop())

	failed := logs.FilterMessage("claim failed").All()
	require.NotEmpty(t, failed, "no claim met a dead connection: the test did not exercise it")
	for _, e := range append(failed, logs.FilterMessage("writing outcomes failed").All()...) {
		require.Equal(t, time.Duration(0), e.ContextMap()["retry_in"], "%s: %v", e.Message, e.ContextMap())
	}
	var status string
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "SELECT status FROM "+pgx.Identifier{schema, "jobs"}.Sanitize()+" WHERE id = $1", ids[0]).Scan(&status))
	require.Equal(t, "done", status)
}

// While every slot is busy with a long job, the heartbeat is the only user
// of the pool. After every connection was terminated, it goes through the
// dead ones at its next tick and renews the leases before they lapse.
func TestHeartbeatSkipsDeadConnections(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schema := pgtest.Schema(t)
	const poolSize = 6
	pool, app := pgtest.UnpingedPool(ctx, t, poolSize)

	started := make(chan int64, 1)
	release := make(chan struct{})
	registry := executors.NewRegistry()
	registry.Register("noop", executors.Func(func(ctx context.Context, job *executors.Job) error {
		started <- job.ID
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}))
	core, logs := observer.New(zap.WarnLevel)
	// A heartbeat every 2 s; a renewal that connects anew on a loaded
	// machine can take a second or two, and the lease leaves it room.
	const lease = 6 * time.Second
	c, err := New(Config{
		Pool: pool, Schema: schema, SleepConnConfig: pool.Config().ConnConfig, Queue: "default", WorkerID: "w",
		Registry: registry, Logger: zap.New(core), Options: Options{Concurrency: 1, Lease: lease},
	})
	require.NoError(t, err)
	stop := runClaimer(ctx, t, c)

	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	ids := insertJobs(ctx, t, pgtest.Pool(t), jobs, 1)
	c.Wake()
	select {
	case id := <-started:
		require.Equal(t, ids[0], id)
	case <-ctx.Done():
		t.Fatal("the job never started")
	}
	pgtest.FillPool(ctx, t, pool)
	lockedUntil := func() time.Time {
		var until time.Time
		require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "SELECT locked_until FROM "+jobs+" WHERE id = $1", ids[0]).Scan(&until))
		return until
	}
	require.Equal(t, poolSize, pgtest.TerminateApp(ctx, t, app))
	// Read after the termination: a heartbeat that ran between the two
	// would otherwise pass for one that got through the dead connections.
	until := lockedUntil()

	var renewed time.Time
	wait.For(t, 20*time.Second, "a heartbeat to renew the lease", func() bool {
		renewed = lockedUntil()
		return renewed.After(until)
	})
	require.True(t, renewed.Add(-lease).Before(until),
		"the lease lapsed at %s, before the heartbeat renewed it at %s", until, renewed.Add(-lease))
	failed := logs.FilterMessage("heartbeat failed").All()
	require.NotEmpty(t, failed, "no heartbeat met a dead connection: the test did not exercise it")
	for _, e := range failed {
		require.Equal(t, true, e.ContextMap()["retry_now"], "%v", e.ContextMap())
	}

	close(release)
	require.NoError(t, stop())
	var status string
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "SELECT status FROM "+jobs+" WHERE id = $1", ids[0]).Scan(&status))
	require.Equal(t, "done", status)
}

// A payload that asks for a timeout past MaxJobTimeout is dead at once, with
// an error that names the setting.
func TestPayloadTimeoutIsCapped(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ran := make(chan struct{}, 1)
	registry := executors.NewRegistry()
	registry.Register("noop", executors.Func(func(context.Context, *executors.Job) error { ran <- struct{}{}; return nil }))
	c, pool, jobs := newTestClaimer(ctx, t, Config{Registry: registry, Options: Options{JobTimeout: time.Second, MaxJobTimeout: time.Minute}})
	var id int64
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+jobs+` (kind, payload) VALUES ('noop', '{"timeout": "100000h"}') RETURNING id`).Scan(&id))
	stop := runClaimer(ctx, t, c)
	var (
		status  string
		lastErr *string
	)
	wait.For(t, 20*time.Second, "the job to be dead", func() bool {
		require.NoError(t, pool.QueryRow(ctx, "SELECT status, last_error FROM "+jobs+" WHERE id = $1", id).Scan(&status, &lastErr))
		return status == "dead"
	})
	require.NoError(t, stop())
	require.Contains(t, *lastErr, "MAX_JOB_TIMEOUT")
	require.Empty(t, ran, "the executor never ran")
}

// At shutdown, an attempt that ran for less than JobTimeout is given back
// uncounted; one that ran longer counts, so that a job that hangs at every
// restart still uses up its attempts.
func TestShutdownCountsLongAttempts(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	started := make(chan int64, 2)
	registry := executors.NewRegistry()
	registry.Register("noop", executors.Func(func(ctx context.Context, job *executors.Job) error {
		started <- job.ID
		<-ctx.Done()
		return ctx.Err()
	}))
	c, pool, jobs := newTestClaimer(ctx, t, Config{
		Registry: registry, Options: Options{JobTimeout: 300 * time.Millisecond, ShutdownTimeout: time.Nanosecond},
	})
	var long, short int64
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+jobs+` (kind, payload) VALUES ('noop', '{"timeout": "1h"}') RETURNING id`).Scan(&long))
	stop := runClaimer(ctx, t, c)
	require.Equal(t, long, <-started)
	<-time.After(400 * time.Millisecond) // the scenario: the long job runs past JobTimeout
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+jobs+` (kind, payload) VALUES ('noop', '{"timeout": "1h"}') RETURNING id`).Scan(&short))
	c.Wake()
	require.Equal(t, short, <-started)
	require.NoError(t, stop())

	row := func(id int64) (status string, attempts int, lastErr string) {
		require.NoError(t, pool.QueryRow(ctx, "SELECT status, attempts, last_error FROM "+jobs+" WHERE id = $1", id).Scan(&status, &attempts, &lastErr))
		return
	}
	status, attempts, lastErr := row(long)
	require.Equal(t, "pending", status)
	require.Equal(t, 1, attempts, "the long attempt counts")
	require.Contains(t, lastErr, "longer than JOB_TIMEOUT", lastErr)
	status, attempts, lastErr = row(short)
	require.Equal(t, "pending", status)
	require.Equal(t, 0, attempts, "the short attempt is given back")
	require.Contains(t, lastErr, "interrupted by worker shutdown")
}

// slowConn delays each read: a reply on its way over a slow network.
type slowConn struct {
	net.Conn
	delay *atomic.Int64
}

func (c *slowConn) Read(b []byte) (int, error) {
	if d := c.delay.Load(); d > 0 {
		<-time.After(time.Duration(d)) // the scenario: the reply is late
	}
	return c.Conn.Read(b)
}

// A shutdown while a claim's reply is on its way: the server has committed
// the claim, so its jobs run (or are given back) rather than stay running,
// unrun, until their leases lapse and the sweeper counts an attempt that
// never ran.
func TestShutdownDuringAClaimKeepsItsJobs(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var delay atomic.Int64
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	dialer := &net.Dialer{}
	cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &slowConn{Conn: conn, delay: &delay}, nil
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	ran := make(chan int64, 1)
	registry := executors.NewRegistry()
	registry.Register("noop", executors.Func(func(_ context.Context, job *executors.Job) error { ran <- job.ID; return nil }))
	schema := pgtest.Schema(t)
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	c, err := New(Config{
		Pool: pool, Schema: schema, SleepConnConfig: pgtest.Pool(t).Config().ConnConfig,
		Queue: "default", WorkerID: "w", Registry: registry,
	})
	require.NoError(t, err)
	asleep := make(chan struct{}, 16)
	stop := runClaimer(testhook.With(ctx, &testhook.Hooks{ClaimerState: func(_, _, to string) {
		if to == "asleep" {
			asleep <- struct{}{}
		}
	}}), t, c)
	<-asleep

	delay.Store(int64(500 * time.Millisecond))
	var id int64
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "INSERT INTO "+jobs+" (kind, max_attempts) VALUES ('noop', 1) RETURNING id").Scan(&id))
	c.Wake()
	// The claim has committed on the server: read on a pool of its own, as
	// the claimer's replies are held back.
	pgtest.WaitSQL(t, 20*time.Second, "the claim to commit", "SELECT status = 'running' FROM "+jobs+" WHERE id = $1", id)
	require.NoError(t, stop())
	select {
	case got := <-ran:
		require.Equal(t, id, got)
	case <-time.After(10 * time.Second):
		t.Fatal("the claimed job never ran")
	}
	var status string
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "SELECT status FROM "+jobs+" WHERE id = $1", id).Scan(&status))
	require.Equal(t, "done", status)
}

// A claim lost in a server crash (it commits without waiting for its WAL
// flush) leaves the row as before it, here undone by hand, while the job's
// run goes on. The same worker claims it again, with the same attempt
// number: the first run's outcome must not be written over the second run.
func TestLostClaimKeepsItsOutcomeApart(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type start struct {
		attempt int
		finish  chan error
	}
	starts := make(chan start, 4)
	registry := executors.NewRegistry()
	registry.Register("noop", executors.Func(func(_ context.Context, job *executors.Job) error {
		s := start{job.Attempt, make(chan error, 1)}
		starts <- s
		return <-s.finish
	}))
	c, pool, jobs := newTestClaimer(ctx, t, Config{Registry: registry})
	var id int64
	require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+jobs+" (kind) VALUES ('noop') RETURNING id").Scan(&id))
	stop := runClaimer(ctx, t, c)
	run1 := <-starts
	_, err := pool.Exec(ctx, "UPDATE "+jobs+" SET status = 'pending', attempts = 0, locked_by = NULL, locked_until = NULL WHERE id = $1", id)
	require.NoError(t, err)
	c.Wake()
	run2 := <-starts
	require.Equal(t, run1.attempt, run2.attempt)

	run1.finish <- nil
	wait.For(t, 20*time.Second, "run 1's outcome to be written, or refused", func() bool { return c.Stats().Completed >= 1 })
	var status string
	require.NoError(t, pool.QueryRow(ctx, "SELECT status FROM "+jobs+" WHERE id = $1", id).Scan(&status))
	require.Equal(t, "running", status, "the row while run 2 runs")
	run2.finish <- nil
	require.NoError(t, stop())
	require.NoError(t, pool.QueryRow(ctx, "SELECT status FROM "+jobs+" WHERE id = $1", id).Scan(&status))
	require.Equal(t, "done", status)
}

// A notification that finds the queue's flow limits gone switches to the
// plain claim, which is lean: when it takes nothing, the full claim must
// still follow, so that the claimer learns when the next job is due and
// whether it skipped locked ones, rather than sleeping until the tick.
func TestWokenClaimAfterFlowLimitsEndTellsAsTheFullClaim(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, pool, jobs := newTestClaimer(ctx, t, Config{})
	setLimit(ctx, t, c, pool, "a", 1, false, 0, 0)
	runs, _ := claimNow(ctx, t, c, 10)
	require.Empty(t, runs)
	require.True(t, c.flow.limited)
	_, err := pool.Exec(ctx, "SELECT "+pgx.Identifier{c.cfg.Schema, "clear_flow_limit"}.Sanitize()+"($1, $2)", c.cfg.Queue, "a")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "INSERT INTO "+jobs+" (kind, run_at) VALUES ('noop', now() + interval '1 hour')")
	require.NoError(t, err)
	c.quiet = true
	runs, r := claimNow(ctx, t, c, 5)
	require.Empty(t, runs)
	require.False(t, c.flow.limited)
	require.NotNil(t, r.Next, "the full claim followed, and said when the job is due")
	require.InDelta(t, time.Hour.Seconds(), r.Next.Seconds(), 5)

	// The same with a due job another transaction holds locked: stranded.
	ids := insertJobs(ctx, t, pool, jobs, 1)
	setLimit(ctx, t, c, pool, "a", 1, false, 0, 0)
	c.quiet = false
	_, _ = claimNow(ctx, t, c, 1) // takes the job: claimed without limits
	require.True(t, c.flow.limited)
	_, err = pool.Exec(ctx, "UPDATE "+jobs+" SET status = 'pending' WHERE id = $1", ids[0])
	require.NoError(t, err)
	lockJob(ctx, t, pool, jobs, ids[0])
	_, err = pool.Exec(ctx, "SELECT "+pgx.Identifier{c.cfg.Schema, "clear_flow_limit"}.Sanitize()+"($1, $2)", c.cfg.Queue, "a")
	require.NoError(t, err)
	c.quiet = true
	runs, r = claimNow(ctx, t, c, 5)
	require.Empty(t, runs)
	require.False(t, c.flow.limited)
	require.True(t, r.Stranded, "the locked job was skipped")
}
