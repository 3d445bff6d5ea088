package pgdispatch_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/claimer"
	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/testhook"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/timing"
	"github.com/pgdispatch/pgdispatch/internal/testkit/workertest"
	"github.com/pgdispatch/pgdispatch/migrations"
)

const (
	hour    = time.Hour
	waitFor = 20 * time.Second
)

type bundle struct {
	schema   string
	jobs     string // quoted jobs table
	registry *executors.Registry
	rec      *recorder
	watch    *pgtest.Watcher
}

func setup(t *testing.T) *bundle {
	t.Helper()
	b := setupUnwatched(t)
	b.watch = pgtest.Watch(t, b.schema)
	return b
}

// setupUnwatched is setup without the watcher, whose trigger notifies on
// every change to the jobs table.
func setupUnwatched(t *testing.T) *bundle {
	t.Helper()
	schema := pgtest.Schema(t)
	rec := newRecorder()
	reg := executors.NewRegistry()
	reg.Register("record", rec)
	return &bundle{
		schema:   schema,
		jobs:     pgx.Identifier{schema, "jobs"}.Sanitize(),
		registry: reg,
		rec:      rec,
	}
}

// config is a worker config for the test's schema with the fallback tick at
// an hour, so that nothing the test sees comes from polling.
func (b *bundle) config(t *testing.T, id string) pgdispatch.Config {
	return pgdispatch.Config{
		Pool:     pgtest.Pool(t),
		Schema:   b.schema,
		WorkerID: id,
		Registry: b.registry,
		Options:  claimer.Options{PollInterval: hour},
		Logger:   zaptest.NewLogger(t),
	}
}

// waitAsleep waits until the default queue's claimer of w sleeps, holding its
// sleep key, so that the next write notifies.
func (b *bundle) waitAsleep(t *testing.T, w *pgdispatch.Worker) {
	t.Helper()
	statesOf(w).waitAsleep(t, pgdispatch.DefaultQueue)
}

// start runs a worker until the test ends, once its listener is listening.
// It returns the worker, a graceful stop, and a channel that receives each
// time the listener (re)connects.
func start(t *testing.T, cfg pgdispatch.Config) (w *pgdispatch.Worker, stop func(), listening <-chan struct{}) {
	t.Helper()
	ch := make(chan struct{}, 16)
	cfg.OnListen = func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	s := newClaimerStates()
	w, stop = workertest.Run(testhook.With(context.Background(), s.hooks()), t, cfg)
	states.Store(w, s)
	t.Cleanup(func() { stop(); states.Delete(w) })
	waitListening(t, ch)
	return w, stop, ch
}

func waitListening(t *testing.T, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(waitFor):
		t.Fatal("listener did not connect")
	}
}

func (b *bundle) insert(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var id int64
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, sql, args...).Scan(&id))
	return id
}

func (b *bundle) row(t *testing.T, id int64) (status string, attempts int, lastError *string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx,
		"SELECT status, attempts, last_error FROM "+b.jobs+" WHERE id = $1", id).Scan(&status, &attempts, &lastError))
	return status, attempts, lastError
}

// recorder is an executor that records each start. Its behaviour per job is
// set by the payload: {"fail": N} fails the first N attempts, {"permanent":
// true} fails permanently, {"block": true} waits for its context.
type recorder struct {
	mu      sync.Mutex
	starts  map[int64]int
	started chan int64
	total   atomic.Int64
}

func newRecorder() *recorder {
	return &recorder{starts: map[int64]int{}, started: make(chan int64, 20000)}
}

func (r *recorder) Execute(ctx context.Context, job *executors.Job) error {
	r.mu.Lock()
	r.starts[job.ID]++
	r.mu.Unlock()
	r.total.Add(1)
	r.started <- job.ID
	var p struct {
		Fail      int  `json:"fail"`
		Permanent bool `json:"permanent"`
		Block     bool `json:"block"`
	}
	if err := json.Unmarshal(job.Payload, &p); err != nil {
		return executors.Permanent(err)
	}
	switch {
	case p.Permanent:
		return executors.Permanentf("refused for good")
	case p.Block:
		<-ctx.Done()
		return context.Cause(ctx)
	case job.Attempt <= p.Fail:
		return fmt.Errorf("failing attempt %d on purpose", job.Attempt)
	}
	return nil
}

func (r *recorder) startsOf(id int64) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.starts[id]
}

// waitStart waits for job id to start and returns when it did.
func (r *recorder) waitStart(t *testing.T, id int64, timeout time.Duration) time.Time {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case got := <-r.started:
			if got == id {
				return time.Now()
			}
		case <-deadline:
			t.Fatalf("job %d did not start within %s", id, timeout)
		}
	}
}

// retryDelays are the backoffs job id got at each retry, from the watcher.
func (b *bundle) retryDelays(id int64) []float64 {
	var delays []float64
	for _, h := range b.watch.History(id) {
		if h.Status == "pending" && h.Attempts > 0 {
			delays = append(delays, h.Delay)
		}
	}
	return delays
}

// waitStarts waits until n jobs have started, failing the test after two
// minutes.
func (r *recorder) waitStarts(t *testing.T, n int64) {
	t.Helper()
	deadline := time.After(2 * time.Minute)
	for r.total.Load() < n {
		select {
		case <-r.started:
		case <-deadline:
			t.Fatalf("only %d of %d jobs started", r.total.Load(), n)
		}
	}
}

// requireEachOnce checks that n jobs ran, each once.
func (r *recorder) requireEachOnce(t *testing.T, n int) {
	t.Helper()
	require.Equal(t, int64(n), r.total.Load(), "executions")
	r.mu.Lock()
	defer r.mu.Unlock()
	require.Len(t, r.starts, n)
	for id, c := range r.starts {
		require.Equal(t, 1, c, "job %d ran %d times", id, c)
	}
}

// A live worker's lease is renewed by the heartbeat, so the sweeper never
// takes a long job from it (river issue #1302).
func TestHeartbeatKeepsLongJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	slow := executors.Func(func(ctx context.Context, job *executors.Job) error {
		select {
		case <-time.After(2 * time.Second): // the job's work: four leases long
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	b.registry.Register("slow", slow)
	cfg := b.config(t, "w")
	cfg.Lease = 500 * time.Millisecond
	cfg.SweepInterval = 100 * time.Millisecond
	start(t, cfg)
	id := b.insert(t, "INSERT INTO "+b.jobs+" (kind) VALUES ('slow') RETURNING id")
	s := b.watch.Status(t, id, "done", waitFor)
	require.Equal(t, 1, s.Attempts)
	for _, h := range b.watch.History(id)[1:] { // after the insert
		require.NotEqual(t, "pending", h.Status, "the job was never given back: %+v", b.watch.History(id))
	}
}

// Acceptance 4: after pg_terminate_backend of the listener, a job inserted in
// the gap runs within the reconnect delay, not at the fallback tick.
func TestListenerReconnects(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config(t, "w")
	app := "pgdispatch-listener-" + b.schema
	cfg.ListenConnConfig = pgtest.Pool(t).Config().ConnConfig.Copy()
	cfg.ListenConnConfig.RuntimeParams["application_name"] = app
	cfg.ReconnectMin = 200 * time.Millisecond
	w, _, listening := start(t, cfg)
	b.waitAsleep(t, w)

	ctx := context.Background()
	var terminated bool
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx,
		"SELECT bool_and(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&terminated))
	require.True(t, terminated)
	id := b.insert(t, "INSERT INTO "+b.jobs+" (kind) VALUES ('record') RETURNING id")
	inserted := time.Now()
	waitListening(t, listening)
	startedAt := b.rec.waitStart(t, id, 10*time.Second)
	t.Logf("insert during the gap to start: %s", startedAt.Sub(inserted))
	b.watch.Status(t, id, "done", waitFor)
}

// An executor's panic fails that job alone; a payload timeout bounds it.
func TestPanicAndTimeout(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.registry.Register("panics", executors.Func(func(context.Context, *executors.Job) error { panic("boom") }))
	cfg := b.config(t, "w")
	start(t, cfg)
	panics := b.insert(t, `INSERT INTO `+b.jobs+` (kind, max_attempts) VALUES ('panics', 1) RETURNING id`)
	slow := b.insert(t, `INSERT INTO `+b.jobs+` (kind, payload, max_attempts) VALUES ('record', '{"block": true, "timeout": "200ms"}', 1) RETURNING id`)
	badTimeout := b.insert(t, `INSERT INTO `+b.jobs+` (kind, payload) VALUES ('record', '{"timeout": "soon"}') RETURNING id`)

	s := b.watch.Status(t, panics, "dead", waitFor)
	require.Contains(t, *s.Error, "executor panicked: boom")
	s = b.watch.Status(t, badTimeout, "dead", waitFor)
	require.Contains(t, *s.Error, "payload.timeout:")
	require.Equal(t, 1, s.Attempts)
	s = b.watch.Status(t, slow, "dead", waitFor)
	require.Contains(t, *s.Error, "timed out after 200ms")
}

// An executor that ignores its context loses its job, not its slot: the job
// is given up on a little after its timeout, and the worker goes on.
func TestExecutorIgnoringCancellation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	returned := make(chan struct{})
	b.registry.Register("stuck", executors.Func(func(context.Context, *executors.Job) error {
		defer close(returned)
		<-release // not ctx.Done()
		return nil
	}))
	cfg := b.config(t, "w")
	cfg.Concurrency = 1
	start(t, cfg)
	stuck := b.insert(t, `INSERT INTO `+b.jobs+` (kind, payload, max_attempts) VALUES ('stuck', '{"timeout": "100ms"}', 1) RETURNING id`)
	s := b.watch.Status(t, stuck, "dead", waitFor)
	require.Contains(t, *s.Error, "the executor did not return within 2s of the job's end (timeout 100ms): abandoned")

	// The only slot is free again.
	next := b.insert(t, `INSERT INTO `+b.jobs+` (kind) VALUES ('record') RETURNING id`)
	b.watch.Status(t, next, "done", waitFor)

	// When the executor returns at last, its result changes nothing.
	close(release)
	<-returned
	later := b.insert(t, `INSERT INTO `+b.jobs+` (kind) VALUES ('record') RETURNING id`)
	b.watch.Status(t, later, "done", waitFor)
	status, attempts, lastErr := b.row(t, stuck)
	require.Equal(t, "dead", status)
	require.Equal(t, 1, attempts)
	require.Contains(t, *lastErr, "abandoned")
}

// At shutdown, a job whose executor ignores the cancellation is given back
// without it, and the worker stops.
func TestShutdownGivesBackIgnoredCancellation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := make(chan struct{})
	defer close(release)
	started := make(chan struct{}, 1)
	b.registry.Register("stuck", executors.Func(func(context.Context, *executors.Job) error {
		started <- struct{}{}
		<-release // not ctx.Done()
		return nil
	}))
	cfg := b.config(t, "w")
	cfg.ShutdownTimeout = 50 * time.Millisecond
	_, stop, _ := start(t, cfg)
	id := b.insert(t, `INSERT INTO `+b.jobs+` (kind) VALUES ('stuck') RETURNING id`)
	<-started
	stop() // returns once the job is given back
	status, attempts, lastError := b.row(t, id)
	require.Equal(t, "pending", status)
	require.Equal(t, 0, attempts, "the interrupted attempt is given back")
	require.NotNil(t, lastError)
	require.Contains(t, *lastError, "interrupted by worker shutdown: the executor did not return after cancellation")
}

// The fallback tick claims jobs whose notification never came, and counts
// the ticks that found work.
func TestFallbackTickFindsMissedJobs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cfg := b.config(t, "w")
	cfg.PollInterval = 300 * time.Millisecond
	w, _, _ := start(t, cfg)

	// A first job, notified, uses up the wake-ups of the worker's start.
	first := b.insert(t, "INSERT INTO "+b.jobs+" (kind) VALUES ('record') RETURNING id")
	b.watch.Status(t, first, "done", waitFor)
	b.waitAsleep(t, w)
	notified := w.Listener().Notifications()
	require.Zero(t, w.Claimer(pgdispatch.DefaultQueue).Stats().TickHits)

	_, err := pgtest.Pool(t).Exec(ctx, "ALTER TABLE "+b.jobs+" DISABLE TRIGGER jobs_notify_insert")
	require.NoError(t, err)
	id := b.insert(t, "INSERT INTO "+b.jobs+" (kind) VALUES ('record') RETURNING id")
	b.watch.Status(t, id, "done", waitFor)
	stats := w.Claimer(pgdispatch.DefaultQueue).Stats()
	require.GreaterOrEqual(t, stats.Ticks, int64(1))
	require.Equal(t, int64(1), stats.TickHits)
	require.Equal(t, notified, w.Listener().Notifications(), "the trigger was off: no notification")
}

// Acceptance 6: one dedup_key makes one job, from SQL and from Go.
func TestDedupKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	pool := pgtest.Pool(t)
	fn := pgx.Identifier{b.schema, "enqueue"}.Sanitize()

	first := b.insert(t, "SELECT "+fn+"('record', '{\"a\": 1}', dedup_key => 'order-1')")
	again := b.insert(t, "SELECT "+fn+"('record', '{\"a\": 2}', dedup_key => 'order-1')")
	require.Equal(t, first, again)

	tag, err := pool.Exec(ctx, "INSERT INTO "+b.jobs+" (kind, dedup_key) VALUES ('record', 'order-1') "+
		"ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING")
	require.NoError(t, err)
	require.Zero(t, tag.RowsAffected())

	s := pgdispatch.Schema(b.schema)
	goID, err := s.Enqueue(ctx, pool, pgdispatch.Job{Kind: "record", DedupKey: "order-2", Payload: map[string]int{"a": 3}})
	require.NoError(t, err)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	goAgain, err := s.Enqueue(ctx, tx, pgdispatch.Job{Kind: "record", DedupKey: "order-2"})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, goID, goAgain)

	var count int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+b.jobs).Scan(&count))
	require.Equal(t, 2, count)

	// Inside a transaction that rolls back, the job goes with it.
	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	_, err = s.Enqueue(ctx, tx, pgdispatch.Job{Kind: "record", DedupKey: "order-3"})
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+b.jobs).Scan(&count))
	require.Equal(t, 2, count)
}

// Acceptance 7: a job due in 2 s runs at about 2 s, not at the tick.
func TestScheduledJobRunsWhenDue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	start(t, b.config(t, "w"))
	id := b.insert(t, `INSERT INTO `+b.jobs+` (kind, run_at) VALUES ('record', now() + interval '2 seconds') RETURNING id`)
	committed := time.Now()
	startedAt := b.rec.waitStart(t, id, 10*time.Second)
	took := startedAt.Sub(committed)
	require.Greater(t, took, 1900*time.Millisecond)
	timing.Below(t, "scheduled +2s, started", took, 3500*time.Millisecond)
}

// An operator's UPDATE that makes a job pending and due wakes a worker too.
func TestUpdateToPendingWakesWorker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, _, _ := start(t, b.config(t, "w"))
	id := b.insert(t, `INSERT INTO `+b.jobs+` (kind, status, finished_at) VALUES ('record', 'dead', now()) RETURNING id`)
	b.watch.Status(t, id, "dead", waitFor)
	b.waitAsleep(t, w)
	ctx := context.Background()
	_, err := pgtest.Pool(t).Exec(ctx, "UPDATE "+b.jobs+" SET status = 'pending', run_at = now() WHERE id = $1", id)
	require.NoError(t, err)
	b.watch.Status(t, id, "done", waitFor)
}

// Graceful shutdown in process: finished jobs are done, a job that outlives
// ShutdownTimeout is back to pending at once with its attempt given back.
func TestShutdownGivesBackUnfinishedJobs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config(t, "w")
	cfg.ShutdownTimeout = 300 * time.Millisecond
	_, stop, _ := start(t, cfg)
	quick := b.insert(t, "INSERT INTO "+b.jobs+" (kind) VALUES ('record') RETURNING id")
	long := b.insert(t, `INSERT INTO `+b.jobs+` (kind, payload) VALUES ('record', '{"block": true}') RETURNING id`)
	b.rec.waitStart(t, long, waitFor)
	b.watch.Status(t, quick, "done", waitFor)
	stop()
	status, attempts, lastError := b.row(t, long)
	require.Equal(t, "pending", status)
	require.Equal(t, 0, attempts)
	require.NotNil(t, lastError)
	require.Contains(t, *lastError, "interrupted by worker shutdown")
}

// RETAIN_DONE=0: done jobs are deleted at once.
func TestDeleteDone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config(t, "w")
	cfg.DeleteDone = true
	start(t, cfg)
	id := b.insert(t, "INSERT INTO "+b.jobs+" (kind) VALUES ('record') RETURNING id")
	b.watch.Until(t, waitFor, "job deleted", func(m map[int64]pgtest.JobState) bool { return m[id].Deleted })
}

// A worker refuses a schema that was never migrated.
func TestRunNeedsSchema(t *testing.T) {
	t.Parallel()
	schema := pgtest.EmptySchemaName(t)
	w, err := pgdispatch.NewWorker(pgdispatch.Config{Pool: pgtest.Pool(t), Schema: schema, WorkerID: "w"})
	require.NoError(t, err)
	err = w.Run(context.Background())
	require.Error(t, err)
	require.ErrorIs(t, err, migrations.ErrSchemaMissing)
}

// A worker asked to stop before its schema check is done stops cleanly,
// even when the schema is missing: nothing had started. (A test that ends
// at once used to fail its cleanup with "check schema: context canceled".)
func TestRunStoppedBeforeItStarts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, schema := range []string{b.schema, pgtest.EmptySchemaName(t)} {
		w, err := pgdispatch.NewWorker(pgdispatch.Config{Pool: pgtest.Pool(t), Schema: schema, WorkerID: "w"})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		require.NoError(t, w.Run(ctx), schema)
	}
}

// Three busy queues on a pool of two connections: the claims, outcomes,
// heartbeats and sweeps of every queue take turns, and each backlog drains,
// once per job.
func TestBusyQueuesShareASmallPool(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfgPool, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	cfgPool.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(context.Background(), cfgPool)
	require.NoError(t, err)
	t.Cleanup(pool.Close)

	cfg := b.config(t, "small-pool")
	cfg.Pool = pool
	cfg.Queues = []pgdispatch.Queue{{Name: "a"}, {Name: "b"}, {Name: "c"}}
	cfg.Concurrency = 20
	_, stop, _ := start(t, cfg)
	const n = 2000
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = pgtest.Pool(t).Exec(ctx, "INSERT INTO "+b.jobs+" (kind, queue) SELECT 'record', q FROM unnest(ARRAY['a', 'b', 'c']) q, generate_series(1, $1)", n)
	require.NoError(t, err)

	b.rec.waitStarts(t, 3*n)
	stop()
	b.rec.requireEachOnce(t, 3*n)
	var done int
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "SELECT count(*) FROM "+b.jobs+" WHERE status = 'done' AND attempts = 1").Scan(&done))
	require.Equal(t, 3*n, done)
}

// The default WorkerID is the hostname, the process id and a random
// suffix: two workers on one host, or in one process, are told apart in
// locked_by and the logs, and an operator still reads where each runs.
func TestDefaultWorkerIDIsUnique(t *testing.T) {
	t.Parallel()
	host, err := os.Hostname()
	require.NoError(t, err)
	form := regexp.MustCompile(`^` + regexp.QuoteMeta(host) + `-` + strconv.Itoa(os.Getpid()) + `-[0-9a-f]{6}$`)
	ids := map[string]bool{}
	for range 2 {
		w, err := pgdispatch.NewWorker(pgdispatch.Config{Pool: pgtest.Pool(t), Schema: pgtest.EmptySchemaName(t)})
		require.NoError(t, err)
		require.Regexp(t, form, w.ID())
		ids[w.ID()] = true
	}
	require.Len(t, ids, 2, "two workers of one process have IDs of their own")
}
