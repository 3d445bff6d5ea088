package claimer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgdispatch/pgdispatch/admin"
	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/pgtest"
)

type heldRow struct {
	Status    string
	Attempts  int
	LockedBy  *string
	LastError *string
	Future    bool // run_at is after now()
}

func newHeldClaimer(t *testing.T, cfg Config) (*Claimer, *pgxpool.Pool, string) {
	t.Helper()
	schema := pgtest.Schema(t)
	pool := pgtest.Pool(t)
	cfg.Pool, cfg.Schema, cfg.SleepConnConfig = pool, schema, pool.Config().ConnConfig
	cfg.Queue, cfg.WorkerID = "default", "held-test"
	if cfg.Registry == nil {
		cfg.Registry = executors.NewRegistry()
	}
	c, err := New(cfg)
	require.NoError(t, err)
	return c, pool, pgx.Identifier{schema, "jobs"}.Sanitize()
}

func insertJobs(ctx context.Context, t *testing.T, pool *pgxpool.Pool, jobs string, n int) []int64 {
	t.Helper()
	rows, err := pool.Query(ctx, "INSERT INTO "+jobs+" (kind) SELECT 'noop' FROM generate_series(1, $1) RETURNING id", n)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	return ids
}

func readRow(ctx context.Context, t *testing.T, pool *pgxpool.Pool, jobs string, id int64) (heldRow, bool) {
	t.Helper()
	var r heldRow
	err := pool.QueryRow(ctx, "SELECT status, attempts, locked_by, last_error, run_at > now() FROM "+jobs+" WHERE id = $1", id).
		Scan(&r.Status, &r.Attempts, &r.LockedBy, &r.LastError, &r.Future)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false
	}
	require.NoError(t, err)
	return r, true
}

// lockable reports how many of the jobs another transaction could claim now.
func lockable(ctx context.Context, t *testing.T, pool *pgxpool.Pool, jobs string) int {
	t.Helper()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	var n int
	require.NoError(t, tx.QueryRow(ctx, "SELECT count(*) FROM (SELECT id FROM "+jobs+" WHERE status = 'pending' FOR UPDATE SKIP LOCKED) l").Scan(&n))
	return n
}

// lockRow locks job id in a transaction of its own, as a claim would.
func lockRow(ctx context.Context, t *testing.T, pool *pgxpool.Pool, jobs string, id int64) pgx.Tx {
	t.Helper()
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) }) // on a failure, before the schema is dropped
	_, err = tx.Exec(ctx, "SELECT id FROM "+jobs+" WHERE id = $1 FOR UPDATE", id)
	require.NoError(t, err)
	return tx
}

// claimHeldNow claims up to limit jobs in a held batch from from (nil: the
// front), after taking a place in the claimer's HeldLimit as mayHold does.
func claimHeldNow(ctx context.Context, t *testing.T, c *Claimer, limit int, from *claimKey) ([]*running, *time.Duration, error) {
	t.Helper()
	require.True(t, c.cfg.HeldLimit.tryAcquire(), "the HeldLimit is full")
	return c.claimHeld(ctx, limit, from)
}

// mustClaimHeld claims up to limit jobs in a held batch and wants n of them.
func mustClaimHeld(ctx context.Context, t *testing.T, c *Claimer, limit, n int) []*running {
	t.Helper()
	runs, _, err := claimHeldNow(ctx, t, c, limit, nil)
	require.NoError(t, err)
	require.Len(t, runs, n)
	return runs
}

// finishHeld reports every run done, in its claimed attempt, and waits for
// the held batches to end.
func finishHeld(c *Claimer, runs ...*running) {
	for _, r := range runs {
		c.report(r, outcome{id: r.job.ID, attempt: r.job.Attempt, status: "done"})
	}
	c.heldWG.Wait()
}

// killHeldConn terminates the backend of b's transaction and waits for it
// to end.
func killHeldConn(ctx context.Context, t *testing.T, pool *pgxpool.Pool, b *heldBatch) {
	t.Helper()
	var killed bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT pg_terminate_backend($1, 5000)", b.conn.Conn().PgConn().PID()).Scan(&killed))
	require.True(t, killed)
}

// stallUpdates makes every UPDATE of jobs wait, in a trigger, for an
// advisory lock that the test holds until it calls the returned release: a
// held batch's commit then stalls at its first write.
func stallUpdates(ctx context.Context, t *testing.T, c *Claimer, pool *pgxpool.Pool, jobs string) (release func()) {
	t.Helper()
	schema := pgx.Identifier{c.cfg.Schema}.Sanitize()
	_, err := pool.Exec(ctx, `CREATE FUNCTION `+schema+`.stall() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM pg_advisory_xact_lock(hashtext(TG_TABLE_SCHEMA)); RETURN NEW; END $$;
		CREATE TRIGGER stall BEFORE UPDATE ON `+jobs+` FOR EACH ROW EXECUTE FUNCTION `+schema+`.stall()`)
	require.NoError(t, err)
	gate, err := pool.Acquire(ctx)
	require.NoError(t, err)
	_, err = gate.Exec(ctx, "SELECT pg_advisory_lock(hashtext($1))", c.cfg.Schema)
	require.NoError(t, err)
	var once sync.Once
	release = func() {
		once.Do(func() {
			_, err := gate.Exec(context.Background(), "SELECT pg_advisory_unlock_all()")
			gate.Release()
			require.NoError(t, err)
		})
	}
	t.Cleanup(release)
	return release
}

// stalledPID waits until a statement waits at stallUpdates' trigger and
// returns its backend's pid.
func stalledPID(ctx context.Context, t *testing.T, c *Claimer, pool *pgxpool.Pool) uint32 {
	t.Helper()
	var pid uint32
	require.Eventually(t, func() bool {
		return pool.QueryRow(ctx, `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
			AND objid = hashtext($1)::oid`, c.cfg.Schema).Scan(&pid) == nil
	}, 10*time.Second, 5*time.Millisecond)
	return pid
}

// A held claim writes nothing until its jobs report: their rows stay
// pending, with no attempt counted, and locked against every other claimer.
// Then one transaction records each outcome with its attempt.
func TestHeldBatchRecordsOutcomesInItsClaim(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, pool, jobs := newHeldClaimer(t, Config{Hold: maxHold, DeleteDone: false})
	ids := insertJobs(ctx, t, pool, jobs, 4)

	runs := mustClaimHeld(ctx, t, c, 10, 4)
	for i, r := range runs {
		require.Equal(t, ids[i], r.job.ID, "claimed in (priority, run_at, id) order")
		require.Equal(t, 1, r.job.Attempt)
		require.Equal(t, defaultMaxAttempts, r.job.MaxAttempts)
		row, ok := readRow(ctx, t, pool, jobs, r.job.ID)
		require.True(t, ok)
		require.Equal(t, heldRow{Status: "pending"}, row, "a held job's row is not written at its claim")
	}
	require.Zero(t, lockable(ctx, t, pool, jobs), "another claimer must skip held jobs")
	require.Equal(t, int64(1), c.Stats().Held)

	msg := "boom"
	c.report(runs[0], outcome{id: runs[0].job.ID, attempt: 1, status: "done"})
	c.report(runs[1], outcome{id: runs[1].job.ID, attempt: 1, status: "pending", delay: time.Hour, err: &msg})
	c.report(runs[2], outcome{id: runs[2].job.ID, attempt: 1, status: "dead", err: &msg})
	shutdownMsg := "interrupted by worker shutdown"
	c.report(runs[3], outcome{id: runs[3].job.ID, attempt: 1, status: "pending", err: &shutdownMsg, release: true})
	c.heldWG.Wait() // the last report ends the hold before Hold (10s)

	done, _ := readRow(ctx, t, pool, jobs, ids[0])
	require.Equal(t, heldRow{Status: "done", Attempts: 1}, done)
	retry, _ := readRow(ctx, t, pool, jobs, ids[1])
	require.Equal(t, heldRow{Status: "pending", Attempts: 1, LastError: &msg, Future: true}, retry)
	dead, _ := readRow(ctx, t, pool, jobs, ids[2])
	require.Equal(t, heldRow{Status: "dead", Attempts: 1, LastError: &msg}, dead)
	released, _ := readRow(ctx, t, pool, jobs, ids[3])
	require.Equal(t, heldRow{Status: "pending", Attempts: 0, LastError: &shutdownMsg}, released, "a job given back keeps its attempt")

	var maxAttempts int
	require.NoError(t, pool.QueryRow(ctx, "SELECT max_attempts FROM "+jobs+" WHERE id = $1", ids[0]).Scan(&maxAttempts))
	require.Equal(t, defaultMaxAttempts, maxAttempts, "the worker's MAX_ATTEMPTS is fixed on the row, as the leased claim does")
	require.Equal(t, int64(4), c.Stats().Completed)
	require.Zero(t, c.Running())
	require.Empty(t, c.inflightIDs())
	require.Equal(t, 0, c.held)

	again := mustClaimHeld(ctx, t, c, 10, 1)
	require.Equal(t, ids[3], again[0].job.ID)
	require.Equal(t, 1, again[0].job.Attempt, "a batch that committed leaves no lost mark")
	require.NotNil(t, again[0].held)
	c.report(again[0], outcome{id: ids[3], attempt: 1, status: "done"})
	c.heldWG.Wait()
}

// Claimers that share a HeldLimit (a worker's queues) never hold more
// batches together than it allows. A claim that opens no batch gives its
// place back at once, and a batch when it ends.
func TestHeldLimitIsShared(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, pool, jobs := newHeldClaimer(t, Config{Hold: maxHold, HeldLimit: NewHeldLimit(2)})
	cfg := a.cfg
	cfg.Queue = "other"
	b, err := New(cfg)
	require.NoError(t, err)
	insertJobs(ctx, t, pool, jobs, 2)
	_, err = pool.Exec(ctx, "INSERT INTO "+jobs+" (kind, queue) VALUES ('noop', 'other')")
	require.NoError(t, err)
	claim := func(c *Claimer, n int) []*running {
		t.Helper()
		hold, _ := c.mayHold()
		require.True(t, hold, "queue %s may hold", c.cfg.Queue)
		runs, _, err := c.claimHeld(ctx, 1, nil)
		require.NoError(t, err)
		require.Len(t, runs, n)
		return runs
	}

	first := claim(a, 1)
	other := claim(b, 1)
	hold, open := a.mayHold()
	require.False(t, hold, "two batches are open: the limit is full")
	require.True(t, open)

	finishHeld(b, other...)
	claim(b, 0) // its queue is empty: the place is given back
	second := claim(a, 1)
	require.Equal(t, 2, a.held, "one queue may take the whole limit")
	hold, _ = b.mayHold()
	require.False(t, hold)
	finishHeld(a, append(first, second...)...)
	for range 2 {
		require.True(t, a.cfg.HeldLimit.tryAcquire(), "every place is back")
	}
}

// The admin commands tell the jobs a held claim runs from those that wait,
// though both rows read pending: a held batch's rows are held while it is
// open, and not after it committed or its connection was lost.
func TestAdminSeesHeldJobs(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, pool, jobs := newHeldClaimer(t, Config{Hold: maxHold, DeleteDone: false})
	ids := insertJobs(ctx, t, pool, jobs, 3)
	a := admin.New(pool, c.cfg.Schema, 0)
	stats := func() admin.QueueStats {
		t.Helper()
		s, _, err := a.Stats(ctx, 0)
		require.NoError(t, err)
		require.Len(t, s, 1)
		return s[0]
	}
	held := func(id int64) bool {
		t.Helper()
		j, err := a.Get(ctx, id)
		require.NoError(t, err)
		return j.Held
	}

	runs := mustClaimHeld(ctx, t, c, 2, 2)
	s := stats()
	require.Equal(t, [4]int64{1, 1, 2, 0}, [4]int64{s.Pending, s.Due, s.Held, s.Running}, "pending, due, held, running")
	require.Equal(t, []bool{true, true, false}, []bool{held(ids[0]), held(ids[1]), held(ids[2])})
	listed, err := a.List(ctx, admin.Filter{Statuses: []string{"pending"}})
	require.NoError(t, err)
	require.Len(t, listed, 3)
	require.Equal(t, []bool{false, true, true}, []bool{listed[0].Held, listed[1].Held, listed[2].Held}, "newest first")

	finishHeld(c, runs...)
	s = stats()
	require.Equal(t, [4]int64{1, 1, 0, 0}, [4]int64{s.Pending, s.Due, s.Held, s.Running})
	require.Equal(t, int64(2), *s.Done)
	require.False(t, held(ids[0]), "a committed claim's mark on a row is not a hold")

	// A lost held claim's rows are pending and not held.
	lost := mustClaimHeld(ctx, t, c, 1, 1)
	require.True(t, held(ids[2]))
	killHeldConn(ctx, t, pgtest.Pool(t), lost[0].held)
	require.False(t, held(ids[2]), "a lost claim's mark is not a hold")
	s = stats()
	require.Equal(t, [3]int64{1, 1, 0}, [3]int64{s.Pending, s.Due, s.Held})
	c.report(lost[0], outcome{id: ids[2], attempt: 1, status: "done"})
	c.heldWG.Wait()
}

// With DeleteDone, a held job that is done is deleted in its claim's
// transaction: its row is never written.
func TestHeldBatchDeletesDoneJobs(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, pool, jobs := newHeldClaimer(t, Config{Hold: maxHold, DeleteDone: true})
	ids := insertJobs(ctx, t, pool, jobs, 2)

	runs := mustClaimHeld(ctx, t, c, 10, 2)
	finishHeld(c, runs...)
	for _, id := range ids {
		_, ok := readRow(ctx, t, pool, jobs, id)
		require.False(t, ok, "job %d: done and deleted", id)
	}
}

// A job still running when Hold ends is leased as a leased claim would have
// done, in the same transaction that records the outcomes in so far; the
// heartbeat then renews it and the completer records it.
func TestHeldJobOutlivingHoldIsLeased(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, pool, jobs := newHeldClaimer(t, Config{Hold: 20 * time.Millisecond, DeleteDone: true})
	ids := insertJobs(ctx, t, pool, jobs, 2)

	runs := mustClaimHeld(ctx, t, c, 10, 2)
	require.Empty(t, c.inflightIDs(), "held jobs need no heartbeat")
	c.report(runs[0], outcome{id: ids[0], attempt: 1, status: "done"})
	c.heldWG.Wait() // Hold ends with runs[1] still running

	_, ok := readRow(ctx, t, pool, jobs, ids[0])
	require.False(t, ok, "the job done within Hold is deleted")
	row, ok := readRow(ctx, t, pool, jobs, ids[1])
	require.True(t, ok)
	worker := "held-test"
	require.Equal(t, heldRow{Status: "running", Attempts: 1, LockedBy: &worker}, row)
	var leaseLeft float64
	require.NoError(t, pool.QueryRow(ctx, "SELECT extract(epoch FROM locked_until - now()) FROM "+jobs+" WHERE id = $1", ids[1]).Scan(&leaseLeft))
	require.InDelta(t, defaultLease.Seconds(), leaseLeft, 5)
	require.Equal(t, []int64{ids[1]}, c.inflightIDs(), "the leased job is the heartbeat's now")
	require.Equal(t, int64(1), c.Stats().Leased)

	c.report(runs[1], outcome{id: ids[1], attempt: 1, status: "done"})
	require.Len(t, c.pending, 1, "its outcome goes to the completer")
	c.flushPending(ctx)
	_, ok = readRow(ctx, t, pool, jobs, ids[1])
	require.False(t, ok, "the completer recorded the leased job")
}

// A held batch whose connection dies loses its claim, not its jobs: the
// server rolls the transaction back and the jobs are due again at once. The
// outcomes that came too late change nothing, and the next claim counts the
// lost attempt (the jobs may have run), leased or held alike: a held claim
// that meets such a row leases its batch before any of it runs.
func TestHeldBatchLostConnectionGivesJobsBack(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, pool, jobs := newHeldClaimer(t, Config{Hold: maxHold, DeleteDone: true, MaxAttempts: 2})
	ids := insertJobs(ctx, t, pool, jobs, 3)

	runs := mustClaimHeld(ctx, t, c, 10, 3)
	killHeldConn(ctx, t, pool, runs[0].held)

	finishHeld(c, runs...)
	for _, id := range ids {
		row, ok := readRow(ctx, t, pool, jobs, id)
		require.True(t, ok)
		require.Equal(t, heldRow{Status: "pending"}, row, "job %d runs again", id)
	}
	require.Zero(t, c.Stats().Completed)

	worker := "held-test"
	held, _, err := claimHeldNow(ctx, t, c, 2, nil)
	require.NoError(t, err)
	require.Len(t, held, 2, "the pool replaced the dead connection")
	leased, _, err := c.claim(ctx, 10)
	require.NoError(t, err)
	require.Len(t, leased, 1)
	for _, r := range append(held, leased...) {
		require.Nil(t, r.held, "job %d: leased at once", r.job.ID)
		require.Equal(t, 2, r.job.Attempt, "job %d: the lost attempt counts", r.job.ID)
		row, _ := readRow(ctx, t, pool, jobs, r.job.ID)
		require.Equal(t, heldRow{Status: "running", Attempts: 2, LockedBy: &worker}, row)
	}
	require.Equal(t, 0, c.held)

	// With two attempts allowed (MaxAttempts), the lost one and this one, a
	// failure now is the last: a job that kept killing its worker ends dead.
	r := leased[0]
	require.Equal(t, 2, r.job.MaxAttempts)
	o := c.classify(c.jobLogger(r.job), r.job, errors.New("boom"), false)
	require.Equal(t, "dead", o.status)
	require.True(t, c.report(r, o))
	c.flushPending(ctx)
	row, _ := readRow(ctx, t, pool, jobs, r.job.ID)
	require.Equal(t, "dead", row.Status)
	require.Equal(t, 2, row.Attempts)
}

// Through Run: a backlog is drained by held claims, each job is recorded
// once, with its attempt, and nothing is left held or running.
func TestBacklogDrainsThroughHeldClaims(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	registry := executors.NewRegistry()
	const n = 3000
	ran := make(chan int64, n)
	registry.Register("noop", executors.Func(func(_ context.Context, job *executors.Job) error {
		ran <- job.ID
		return nil
	}))
	c, pool, jobs := newHeldClaimer(t, Config{Registry: registry, Concurrency: 50, Logger: zaptest.NewLogger(t)})
	insertJobs(ctx, t, pool, jobs, n)

	stop := runClaimer(ctx, t, c)
	seen := map[int64]bool{}
	for len(seen) < n {
		select {
		case id := <-ran:
			require.False(t, seen[id], "job %d ran twice", id)
			seen[id] = true
		case <-ctx.Done():
			t.Fatalf("%d of %d jobs ran", len(seen), n)
		}
	}
	require.NoError(t, stop())

	var doneJobs, attempts int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*), coalesce(sum(attempts), 0) FROM "+jobs+" WHERE status = 'done' AND locked_by IS NULL").Scan(&doneJobs, &attempts))
	require.Equal(t, n, doneJobs)
	require.Equal(t, n, attempts, "one attempt each")
	stats := c.Stats()
	require.Positive(t, stats.Held, "a backlog is claimed by held claims")
	require.Less(t, stats.Held, stats.Claims, "the first claim, after an idle start, leases")
	require.Equal(t, int64(n), stats.Completed)
}

// Each claimed job keeps its own payload: the rows are scanned into reused
// values, never a reused buffer.
func TestClaimedPayloadsAreTheirOwn(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, pool, jobs := newHeldClaimer(t, Config{})
	_, err := pool.Exec(ctx, "INSERT INTO "+jobs+" (kind, payload) SELECT 'noop', jsonb_build_object('n', g) FROM generate_series(1, 6) g")
	require.NoError(t, err)
	leased, _, err := c.claim(ctx, 3)
	require.NoError(t, err)
	held, _, err := claimHeldNow(ctx, t, c, 3, nil)
	require.NoError(t, err)
	for i, r := range append(leased, held...) {
		require.JSONEq(t, fmt.Sprintf(`{"n": %d}`, i+1), string(r.job.Payload))
	}
	finishHeld(c, held...)
}

// The lost mark is read before the claim tries the row's lock, so a locker
// still in progress then must count: it may let go of the row (its
// connection closed) before the lock is tried, and the claim gets a row
// whose last attempt was never written. A committed locker leaves no mark.
func TestLostMarkCountsALockerInProgress(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, pool, jobs := newHeldClaimer(t, Config{})
	id := insertJobs(ctx, t, pool, jobs, 1)[0]
	lost := func() bool {
		t.Helper()
		var v bool
		require.NoError(t, pool.QueryRow(ctx, withTable("SELECT {lost} FROM {jobs} WHERE id = $1", jobs), id).Scan(&v))
		return v
	}

	require.False(t, lost(), "a new row")
	tx := lockRow(ctx, t, pool, jobs, id)
	require.True(t, lost(), "locked by a transaction in progress")
	require.NoError(t, tx.Commit(ctx))
	require.False(t, lost(), "its locker committed")
	tx = lockRow(ctx, t, pool, jobs, id)
	require.NoError(t, tx.Rollback(ctx))
	require.True(t, lost(), "its locker rolled back")
}

// An outcome or a heartbeat for a job that is no longer this worker's must
// not lock its row: the lock would replace a lost held claim's mark with a
// committed transaction's, and the next claim would not count the lost
// attempt. A held batch whose commit failed leaves exactly such jobs: their
// runs go on, and report to the completer.
func TestOthersJobsKeepTheLostMark(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, pool, jobs := newHeldClaimer(t, Config{})
	id := insertJobs(ctx, t, pool, jobs, 1)[0]
	require.NoError(t, lockRow(ctx, t, pool, jobs, id).Rollback(ctx))

	require.NoError(t, c.complete(ctx, []outcome{{id: id, attempt: 1, status: "done"}}))
	_, err := c.execPinned(ctx, c.heartbeatSQL, []int64{id}, c.cfg.WorkerID, c.cfg.Lease.Seconds())
	require.NoError(t, err)

	runs, _, err := c.claim(ctx, 10)
	require.NoError(t, err)
	require.Len(t, runs, 1)
	require.Equal(t, 2, runs[0].job.Attempt, "the lost attempt counts")
}

// An outcome that comes while its batch commits waits for the commit: sent
// to the completer at once, it would find its row still pending, not yet
// leased, and be dropped, and the job would wait for the sweeper. The commit
// is stalled here by a trigger that waits for an advisory lock the test
// holds.
func TestOutcomeDuringHeldCommitIsRecorded(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, pool, jobs := newHeldClaimer(t, Config{Hold: 20 * time.Millisecond, DeleteDone: false})
	ids := insertJobs(ctx, t, pool, jobs, 2)
	release := stallUpdates(ctx, t, c, pool, jobs)

	runs := mustClaimHeld(ctx, t, c, 10, 2)
	c.report(runs[0], outcome{id: ids[0], attempt: 1, status: "done"})
	// Hold has ended; the commit waits at the trigger.
	require.Equal(t, runs[0].held.conn.Conn().PgConn().PID(), stalledPID(ctx, t, c, pool))

	c.report(runs[1], outcome{id: ids[1], attempt: 1, status: "done"})
	c.flushPending(ctx) // what the completer would do now
	release()
	c.heldWG.Wait()
	c.flushPending(ctx)

	for _, id := range ids {
		row, _ := readRow(ctx, t, pool, jobs, id)
		require.Equal(t, heldRow{Status: "done", Attempts: 1}, row, "job %d", id)
	}
	require.Empty(t, c.inflightIDs())
	require.Equal(t, int64(2), c.Stats().Completed)
}

// Once a held batch's commit has failed, its jobs are pending again and
// anyone's to claim. The outcomes of the ones still running go to the
// completer, as after a commit (which may have happened, its answer lost),
// and the completer and the heartbeat, finding the rows not this worker's,
// leave them alone: the next claim still counts the lost attempt.
func TestOutcomesAfterAFailedHeldCommitChangeNothing(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, pool, jobs := newHeldClaimer(t, Config{Hold: 20 * time.Millisecond, DeleteDone: true})
	ids := insertJobs(ctx, t, pool, jobs, 2)

	release := stallUpdates(ctx, t, c, pool, jobs)
	runs := mustClaimHeld(ctx, t, c, 10, 2)
	// Hold has ended with both running, and the lease waits at the trigger:
	// the connection dies before it can commit.
	require.Equal(t, runs[0].held.conn.Conn().PgConn().PID(), stalledPID(ctx, t, c, pool))
	killHeldConn(ctx, t, pool, runs[0].held)
	release()
	c.heldWG.Wait() // the lease failed

	_, err := c.execPinned(ctx, c.heartbeatSQL, c.heartbeatArgs(c.inflightIDs())...)
	require.NoError(t, err)
	for _, r := range runs {
		require.True(t, c.report(r, outcome{id: r.job.ID, attempt: 1, status: "done"}))
	}
	require.Len(t, c.pending, 2)
	c.flushPending(ctx)
	for _, id := range ids {
		row, ok := readRow(ctx, t, pool, jobs, id)
		require.True(t, ok, "job %d: not deleted", id)
		require.Equal(t, heldRow{Status: "pending"}, row, "job %d", id)
	}
	require.Empty(t, c.inflight)
	require.Zero(t, c.Running())

	again, _, err := c.claim(ctx, 10)
	require.NoError(t, err)
	require.Len(t, again, 2)
	for _, r := range again {
		require.Equal(t, 2, r.job.Attempt, "job %d: the lost attempt counts", r.job.ID)
	}
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
	pool, app := pgtest.UnpingedPool(ctx, t, 6)

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

	warmed := int32(min(maxHeld, HeldLimitFor(6, 1).n) + 2)
	require.Eventually(t, func() bool { return pool.Stat().IdleConns() >= warmed }, 30*time.Second, 10*time.Millisecond)
	require.GreaterOrEqual(t, pgtest.TerminateApp(ctx, t, app), int(warmed))

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
// dead ones at its next tick and renews the leases before they lapse; it
// used to meet one dead connection per tick, and with six in the pool the
// lease (three ticks) lapsed before a renewal got through.
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
	// A heartbeat every 2 s. A renewal that connects anew on a loaded
	// machine can take a second or two (one did, under two CPU hogs and the
	// other packages' tests), so the lease leaves it room; the old
	// heartbeat, one dead connection a tick, needed six ticks: 12 s.
	const lease = 6 * time.Second
	c, err := New(Config{
		Pool: pool, Schema: schema, SleepConnConfig: pool.Config().ConnConfig, Queue: "default", WorkerID: "w",
		Registry: registry, Logger: zap.New(core), Concurrency: 1, Lease: lease, Hold: -1,
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
	require.Eventually(t, func() bool {
		renewed = lockedUntil()
		return renewed.After(until)
	}, 20*time.Second, 20*time.Millisecond, "no heartbeat renewed the lease")
	require.True(t, renewed.Add(-lease).Before(until),
		"the lease lapsed at %s, before the heartbeat renewed it at %s", until, renewed.Add(-lease))
	failed := logs.FilterMessage("heartbeat failed").All()
	require.NotEmpty(t, failed, "no heartbeat met a dead connection: the test did not exercise it")
	for _, e := range failed {
		require.Equal(t, true, e.ContextMap()["retry_now"], "%v", e.ContextMap())
	}

	close(release)
	require.NoError(t, stop())
	row, ok := readRow(ctx, t, pgtest.Pool(t), jobs, ids[0])
	require.True(t, ok)
	require.Equal(t, "done", row.Status)
}

// A held claim past a row starts its scan there: it takes the rows after
// it, and leaves those before it, here a job of a higher priority enqueued
// after the first batch, to the next claim from the front.
func TestHeldClaimPastARow(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, pool, jobs := newHeldClaimer(t, Config{Hold: maxHold})
	ids := insertJobs(ctx, t, pool, jobs, 6)

	first := mustClaimHeld(ctx, t, c, 3, 3)
	var urgent int64
	require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+jobs+" (kind, priority) VALUES ('noop', -1) RETURNING id").Scan(&urgent))
	last := first[2].job
	past, _, err := claimHeldNow(ctx, t, c, 3, &claimKey{priority: last.Priority, runAt: last.RunAt, id: last.ID})
	require.NoError(t, err)
	require.Equal(t, ids[3:], jobIDs(past), "the rows after the first batch's last")

	front := mustClaimHeld(ctx, t, c, 3, 1)
	require.Equal(t, urgent, front[0].job.ID, "a claim from the front takes the job it passed over")

	finishHeld(c, append(append(first, past...), front...)...)
	var left int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+jobs+" WHERE status <> 'done'").Scan(&left))
	require.Zero(t, left)
}

func jobIDs(runs []*running) []int64 {
	ids := make([]int64, len(runs))
	for i, r := range runs {
		ids[i] = r.job.ID
	}
	return ids
}

// In a backlog, held claims start past the rows the claimer's open batches
// hold, and pass over a job of a higher priority enqueued meanwhile; a
// claim from the front, at least every resumeFront, takes it. It runs among
// the next jobs, not after the backlog. Each job takes a millisecond, so
// that a batch's commit is done before the claim after next and the
// claimer never has maxHeld batches open: every claim is held, and only the
// resumeFront bound brings one back to the front (a leased claim would
// start there).
func TestUrgentJobIsNotLeftBehindABacklog(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var (
		mu      sync.Mutex
		order   []int64
		started = make(chan struct{})
		done    = make(chan struct{})
	)
	const backlog, before = 2000, 200
	registry := executors.NewRegistry()
	registry.Register("noop", executors.Func(func(_ context.Context, job *executors.Job) error {
		time.Sleep(time.Millisecond) // the job's work
		mu.Lock()
		defer mu.Unlock()
		order = append(order, job.ID)
		switch len(order) {
		case before:
			close(started)
		case backlog + 1:
			close(done)
		}
		return nil
	}))
	c, pool, jobs := newHeldClaimer(t, Config{Registry: registry, Concurrency: 20, DeleteDone: true})
	insertJobs(ctx, t, pool, jobs, backlog)
	stop := runClaimer(ctx, t, c)

	select {
	case <-started:
	case <-ctx.Done():
		t.Fatal("the backlog did not start")
	}
	var urgent int64
	require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+jobs+" (kind, priority) VALUES ('noop', -1) RETURNING id").Scan(&urgent))
	mu.Lock()
	enqueuedAt := len(order)
	mu.Unlock()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("the jobs did not all run")
	}
	require.NoError(t, stop())

	ranAt := slices.Index(order, urgent)
	require.GreaterOrEqual(t, ranAt, 0)
	require.Positive(t, c.pastClaims.Load(), "no claim started past a row: the test did not exercise it")
	t.Logf("the urgent job ran %d jobs after it was enqueued; %d claims started past a row", ranAt-enqueuedAt, c.pastClaims.Load())
	require.Less(t, ranAt-enqueuedAt, 1000,
		"the urgent job ran %d jobs after it was enqueued, with %d of the backlog left then", ranAt-enqueuedAt, backlog-enqueuedAt)
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
