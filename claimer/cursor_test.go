package claimer

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch/claimer/internal/cursor"
	"github.com/pgdispatch/pgdispatch/claimer/internal/runstate"
	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/testhook"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/wait"
)

func ids(runs []*runstate.Run) []int64 {
	out := make([]int64, len(runs))
	for i, r := range runs {
		out[i] = r.Job.ID
	}
	return out
}

// While looks from the front are slow, a claim sets the cursor at its
// last job and the next claim starts there; a higher-priority job and one
// with an earlier run_at, inserted behind the cursor, are claimed first
// once a look from the front has found them, before the jobs still ahead
// of the cursor.
func TestCursorJobsBehindItAreClaimedFirstAfterALook(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, pool, jobs := newTestClaimer(ctx, t, Config{})
	c.cursor.Slow = -1 // every look from the front counts as slow: the cursor is used
	ahead := insertJobs(ctx, t, pool, jobs, 5)
	runs, _ := claimNow(ctx, t, c, 2)
	require.ElementsMatch(t, ahead[:2], ids(runs), "the first claim is from the front")
	require.True(t, c.cursor.Set)
	require.Equal(t, ahead[1], c.cursor.ID, "the cursor is at the claim's last job")

	var urgent, early int64
	require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+jobs+" (kind, priority) VALUES ('noop', -1) RETURNING id").Scan(&urgent))
	require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+jobs+" (kind, run_at) VALUES ('noop', now() - interval '1 hour') RETURNING id").Scan(&early))

	runs, _ = claimNow(ctx, t, c, 1)
	require.Equal(t, ahead[2:3], ids(runs), "a claim from the cursor takes the next job ahead of it")
	require.EqualValues(t, 1, c.fronts.Load())

	look := c.looker.Look(ctx)
	require.NoError(t, look.Err)
	require.Equal(t, urgent, look.ID, "the look finds the first due job")
	c.looker.Deliver(look)
	runs, r := claimNow(ctx, t, c, 2)
	require.ElementsMatch(t, []int64{urgent, early}, ids(runs), "the claim after the look takes the jobs behind the cursor first")
	require.Equal(t, 2, r.Claimed)
	require.EqualValues(t, 1, c.fronts.Load(), "from the cursor, moved back")
	runs, _ = claimNow(ctx, t, c, 5)
	require.ElementsMatch(t, ahead[3:], ids(runs))
}

// The claim after this claimer gave back a lost claim's jobs, and after a
// failed claim, is from the front.
func TestCursorResetByGiveBackAndFailure(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, pool, jobs := newTestClaimer(ctx, t, Config{})
	c.cursor.Slow = -1
	insertJobs(ctx, t, pool, jobs, 3)
	claimNow(ctx, t, c, 1)
	require.True(t, c.cursor.Set)
	c.lost.Note(0) // a session that is gone: nothing to wait for
	fronts := c.fronts.Load()
	claimNow(ctx, t, c, 1)
	require.Equal(t, fronts+1, c.fronts.Load(), "after a give-back, from the front")

	require.True(t, c.cursor.Set)
	canceled, cancelNow := context.WithCancel(ctx)
	cancelNow()
	r, _ := c.claim(canceled, 1)
	require.Error(t, r.Err)
	require.False(t, c.cursor.Set, "after a failed claim, from the front")
}

// A worker started while something holds back vacuum finds its queue
// empty with a slow claim from the front: its next claims start at that
// claim's time, past the dead entries, and take the jobs inserted since.
func TestCursorAfterAnEmptyClaimFromTheFront(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, pool, jobs := newTestClaimer(ctx, t, Config{})
	c.cursor.Slow = -1
	_, r := claimNow(ctx, t, c, 5)
	require.Zero(t, r.Claimed)
	require.True(t, c.cursor.Set)
	require.Zero(t, c.cursor.ID)
	inserted := insertJobs(ctx, t, pool, jobs, 2)
	runs, _ := claimNow(ctx, t, c, 5)
	require.ElementsMatch(t, inserted, ids(runs))
	require.EqualValues(t, 1, c.fronts.Load(), "the second claim is from the cursor")
}

// A claimer that claims from its cursor has looks from the front beside
// its claims; a job that lands behind the cursor (here a higher priority)
// runs at the first claim after a look has found it, not after the
// backlog ahead of the cursor. The second job's executor inserts it; the
// third's waits for a look to find it, so that the next claim, if not the
// third, takes the job behind the cursor. Every claim but the first is
// from the cursor.
func TestCursorLooksFindJobsBehindItWhileTheClaimerRuns(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var (
		mu     sync.Mutex
		order  []int64
		urgent atomic.Int64
		pool   *pgxpool.Pool
		jobs   string
		found  = make(chan struct{})
		once   sync.Once
		// looked holds the ids the looks found, so that a look that finds
		// the urgent job before its insert has returned its id counts.
		lookMu sync.Mutex
		looked = map[int64]bool{}
	)
	reg := executors.NewRegistry()
	reg.Register("noop", executors.Func(func(ctx context.Context, job *executors.Job) error {
		mu.Lock()
		order = append(order, job.ID)
		n := len(order)
		mu.Unlock()
		switch n {
		case 2: // the cursor is set: behind it, a job of a higher priority
			var id int64
			if err := pool.QueryRow(ctx, "INSERT INTO "+jobs+" (kind, priority) VALUES ('noop', -1) RETURNING id").Scan(&id); err != nil {
				return err
			}
			lookMu.Lock()
			urgent.Store(id)
			if looked[id] {
				once.Do(func() { close(found) })
			}
			lookMu.Unlock()
		case 3: // claimed after the insert: the look it asked for finds the job
			select {
			case <-found:
			case <-ctx.Done():
			}
		}
		return nil
	}))
	c, p, j := newTestClaimer(ctx, t, Config{Registry: reg, Options: Options{Concurrency: 1, PollInterval: time.Hour}})
	pool, jobs = p, j
	c.cursor.Slow = -1
	c.looker.Every = time.Millisecond
	hooks := &testhook.Hooks{Looked: func(_ string, id int64) {
		lookMu.Lock()
		defer lookMu.Unlock()
		looked[id] = true
		if id != 0 && id == urgent.Load() {
			once.Do(func() { close(found) })
		}
	}}
	const backlog = 20
	insertJobs(ctx, t, pool, jobs, backlog)
	runClaimer(testhook.With(ctx, hooks), t, c)
	wait.For(t, 20*time.Second, "every job to run", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(order) == backlog+1
	})
	mu.Lock()
	defer mu.Unlock()
	at := slices.Index(order, urgent.Load())
	require.True(t, at == 2 || at == 3,
		"the job behind the cursor runs at the claim after the look that found it (the look the second or the third claim asked for): %v", order)
	require.EqualValues(t, 1, c.Stats().Fronts, "every claim but the first is from the cursor")
}

// A claim from the cursor asks for a look from the front, but not one that
// found the queue paused: a paused queue with due jobs behind the cursor
// would otherwise have a look and a claim every second, each look finding
// them and waking the claimer to find the queue still paused.
func TestCursorPausedClaimAsksForNoLook(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, pool, jobs := newTestClaimer(ctx, t, Config{})
	c.cursor.Slow = -1
	c.cursor.Set, c.cursor.Held = true, true // at the front, every job ahead: claims from the cursor
	insertJobs(ctx, t, pool, jobs, 3)
	callQueue(ctx, t, c, pool, "pause_queue")
	_, r := claimNow(ctx, t, c, 1)
	require.True(t, r.Paused)
	require.False(t, c.looker.Wanted(), "no look for a paused queue")
	callQueue(ctx, t, c, pool, "resume_queue")
	runs, _ := claimNow(ctx, t, c, 1)
	require.Len(t, runs, 1)
	require.True(t, c.looker.Wanted(), "a claim from the cursor asks for a look")
}

// A job that lands behind the cursor of a claimer that has gone to sleep
// runs: the notification wakes the claimer, whose claim from the cursor
// misses the job, and the look from the front that claim asks for finds
// it and wakes the claimer again. The fallback tick is an hour away, and
// the test stands in for the worker's listener.
func TestCursorLookFindsAJobBehindASleepingClaimersCursor(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, pool, jobs, ran := newLookingClaimer(ctx, t)
	asleep, hooks := sleepHook()
	first := insertJobs(ctx, t, pool, jobs, 1)
	runClaimer(testhook.With(ctx, hooks), t, c)
	require.Equal(t, first[0], receive(ctx, t, ran))
	select {
	case <-asleep:
	case <-ctx.Done():
		t.Fatal("the claimer did not go to sleep")
	}
	var behind int64
	require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+jobs+" (kind, priority) VALUES ('noop', -1) RETURNING id").Scan(&behind))
	c.Wake() // the insert's notification, as the worker's listener hears it
	require.Equal(t, behind, receive(ctx, t, ran))
	require.EqualValues(t, 1, c.Stats().Fronts, "every claim but the first is from the cursor")
}

// newLookingClaimer is a claimer of two slots that claims from its cursor
// after its first claim, looks from the front a millisecond apart, ticks
// once an hour, and sends on ran the id of each job it runs.
func newLookingClaimer(ctx context.Context, t *testing.T) (c *Claimer, pool *pgxpool.Pool, jobs string, ran chan int64) {
	t.Helper()
	ran = make(chan int64, 10)
	reg := executors.NewRegistry()
	reg.Register("noop", executors.Func(func(_ context.Context, job *executors.Job) error { ran <- job.ID; return nil }))
	c, pool, jobs = newTestClaimer(ctx, t, Config{Registry: reg, Options: Options{Concurrency: 2, PollInterval: time.Hour}})
	c.cursor.Slow = -1
	c.looker.Every = time.Millisecond
	return c, pool, jobs, ran
}

// sleepHook is hooks that signal asleep each time a claimer goes to sleep.
func sleepHook() (asleep chan struct{}, hooks *testhook.Hooks) {
	asleep = make(chan struct{}, 100)
	return asleep, &testhook.Hooks{ClaimerState: func(_, _, to string) {
		if to == "asleep" {
			asleep <- struct{}{}
		}
	}}
}

// callQueue calls the schema's function fn (pause_queue, resume_queue) on
// c's queue.
func callQueue(ctx context.Context, t *testing.T, c *Claimer, pool *pgxpool.Pool, fn string) {
	t.Helper()
	_, err := pool.Exec(ctx, "SELECT "+pgx.Identifier{c.cfg.Schema, fn}.Sanitize()+"($1)", c.cfg.Queue)
	require.NoError(t, err)
}

func receive(ctx context.Context, t *testing.T, ch <-chan int64) int64 {
	t.Helper()
	select {
	case id := <-ch:
		return id
	case <-ctx.Done():
		t.Fatal("no job ran")
		return 0
	}
}

// A saturated claimer claims only as slots free. While its looks from the
// front are quick, each claim is from the front, and a freed slot goes to
// the due job of the highest priority. While they are slow (a hold), a
// slot that frees before a look from the front has found a due job of a
// higher priority behind the cursor goes to the next job ahead of the
// cursor, which holds the slot while it runs; the job behind the cursor
// is claimed at the first slot freed after the look. Two slots, four slow
// jobs of priority 5 that run until the test lets them end, and one of
// priority 0 inserted behind the cursor; the looks beside the claims come
// an hour apart, and the test hands the claim loop one of its own.
func TestCursorSlotFreedGoesAheadOfTheCursorOnlyWhileLooksFromTheFrontAreSlow(t *testing.T) {
	t.Parallel()
	t.Run("quick", func(t *testing.T) { t.Parallel(); testSlotFreed(t, false) })
	t.Run("slow", func(t *testing.T) { t.Parallel(); testSlotFreed(t, true) })
}

func testSlotFreed(t *testing.T, slowFronts bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var (
		mu      sync.Mutex
		started []int64
		release = map[int64]chan struct{}{}
		changed = make(chan struct{}, 1)
	)
	reg := executors.NewRegistry()
	reg.Register("slow", executors.Func(func(ctx context.Context, job *executors.Job) error {
		mu.Lock()
		started = append(started, job.ID)
		done := release[job.ID]
		mu.Unlock()
		select {
		case changed <- struct{}{}:
		default:
		}
		select {
		case <-done:
		case <-ctx.Done():
		}
		return nil
	}))
	c, pool, jobs := newTestClaimer(ctx, t, Config{Registry: reg, Options: Options{Concurrency: 2, PollInterval: time.Hour}})
	c.looker.Every = time.Hour
	if slowFronts {
		c.cursor.Slow = -1
	}
	insert := func(priority int) int64 {
		t.Helper()
		var id int64
		require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+jobs+" (kind, priority) VALUES ('slow', $1) RETURNING id", priority).Scan(&id))
		mu.Lock()
		release[id] = make(chan struct{})
		mu.Unlock()
		return id
	}
	startedN := func(n int) func() (bool, <-chan struct{}) {
		return func() (bool, <-chan struct{}) {
			mu.Lock()
			defer mu.Unlock()
			return len(started) >= n, changed
		}
	}
	end := func(id int64) {
		mu.Lock()
		defer mu.Unlock()
		close(release[id])
	}
	var slow []int64
	for range 4 {
		slow = append(slow, insert(5))
	}
	looked := make(chan struct{}, 10)
	hooks := &testhook.Hooks{Looked: func(string, int64) { looked <- struct{}{} }}
	runClaimer(testhook.With(ctx, hooks), t, c)
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, ch := range release {
			select {
			case <-ch:
			default:
				close(ch)
			}
		}
	}()
	snapshot := func() []int64 {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(started)
	}
	wait.On(t, 20*time.Second, "the first claim's two jobs to start", startedN(2))
	if slowFronts {
		select { // the look the first claim asked for, before the job behind the cursor is there
		case <-looked:
		case <-ctx.Done():
			t.Fatal("no look")
		}
	}
	urgent := insert(0)
	end(slow[0])
	wait.On(t, 20*time.Second, "the freed slot's job to start", startedN(3))
	if !slowFronts {
		require.Equal(t, urgent, snapshot()[2], "looks from the front are quick: the freed slot goes to the due job of the highest priority: %v", snapshot())
		return
	}
	require.Equal(t, slow[2], snapshot()[2], "before a look, the freed slot goes to the next job ahead of the cursor: %v", snapshot())
	look := c.looker.Look(ctx)
	require.Equal(t, urgent, look.ID)
	c.looker.Deliver(look)
	end(slow[1])
	wait.On(t, 20*time.Second, "the next freed slot's job to start", startedN(4))
	require.Equal(t, urgent, snapshot()[3], "the first slot freed after the look goes to the job behind the cursor: %v", snapshot())
}

// A look from the front that fails is tried again. Only claims from the
// cursor ask for looks, so the look the last claim of a claimer going to
// sleep asked for is the only one it has: were a failed look (a
// connection lost in a restart, a pool with none free, a statement
// timeout) not tried again, a job behind the cursor committed before the
// claimer took its sleep key would notify no one, and no look would find
// it until the fallback tick. Here the first look's connection fails, and
// no claim follows it.
func TestCursorFailedLookIsTriedAgain(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, pool, jobs := newTestClaimer(ctx, t, Config{})
	c.cursor.Slow = -1
	var fail atomic.Bool
	failed := make(chan struct{}, 1)
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	cfg.PrepareConn = func(context.Context, *pgx.Conn) (bool, error) {
		if fail.CompareAndSwap(true, false) {
			failed <- struct{}{}
			return false, errors.New("the look's connection failed")
		}
		return true, nil
	}
	lookPool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(lookPool.Close)
	c.looker = cursor.NewLooker(lookPool, c.cfg.Schema, c.cfg.Queue, c.cfg.StatementTimeout, zap.NewNop())
	c.looker.Every = time.Millisecond

	first := insertJobs(ctx, t, pool, jobs, 1)
	runs, _ := claimNow(ctx, t, c, 1)
	require.Equal(t, first, ids(runs), "from the front: the cursor is at the first job")
	found := make(chan struct{}, 1)
	looks, stopLooks := context.WithCancel(ctx)
	lookerDone := make(chan struct{})
	go func() {
		defer close(lookerDone)
		c.looker.Run(looks, func() { runstate.Signal(found) })
	}()
	defer func() { stopLooks(); <-lookerDone }()

	var behind int64
	require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+jobs+" (kind, priority) VALUES ('noop', -1) RETURNING id").Scan(&behind))
	fail.Store(true)
	runs, _ = claimNow(ctx, t, c, 1)
	require.Empty(t, runs, "from the cursor: the job behind it is missed")
	select {
	case <-failed:
	case <-ctx.Done():
		t.Fatal("the claim from the cursor asked for no look")
	}
	wait := time.NewTimer(10 * time.Second)
	defer wait.Stop()
	select {
	case <-found:
	case <-wait.C:
		t.Fatal("the look that failed was not tried again: the job behind the cursor waits for the next claim")
	}
	runs, _ = claimNow(ctx, t, c, 1)
	require.Equal(t, []int64{behind}, ids(runs))
}

// A claim from the front that finds the queue paused looked at no job: it
// must not set the cursor at its time, as one that found the queue empty
// does (every due job before then was taken), or, once the queue is
// resumed, the jobs due before the pause would be behind the cursor and a
// claim from it would take a job of a lower priority first.
func TestCursorPausedClaimFromTheFrontLeavesTheCursor(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, pool, jobs := newTestClaimer(ctx, t, Config{})
	c.cursor.Slow = -1
	callQueue(ctx, t, c, pool, "pause_queue")
	var urgent, later int64
	require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+jobs+" (kind, priority, run_at) VALUES ('noop', 0, now() - interval '1 hour') RETURNING id").Scan(&urgent))
	require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+jobs+" (kind, priority) VALUES ('noop', 1) RETURNING id").Scan(&later))
	_, r := claimNow(ctx, t, c, 1)
	require.True(t, r.Paused)
	callQueue(ctx, t, c, pool, "resume_queue")
	runs, _ := claimNow(ctx, t, c, 1)
	require.Equal(t, []int64{urgent}, ids(runs), "the job of the highest priority first")
	runs, _ = claimNow(ctx, t, c, 1)
	require.Equal(t, []int64{later}, ids(runs))
}

// A look times the front of the queue on the server, not its wait for a
// connection of the pool's nor the round trip: with many queues, jobs that
// use the pool, or a database far away, either can pass SlowFront while
// the front is quick, and would keep the claims on the cursor, out of
// strict order, and the looks going. The pool here makes each acquire
// wait 10 ms, as a busy pool would.
func TestCursorLookTimesTheFrontOnTheServer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, _, _ := newTestClaimer(ctx, t, Config{})
	var acquired atomic.Int64 // when the last acquire ended, in ns since start
	start := time.Now()
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	cfg.PrepareConn = func(ctx context.Context, _ *pgx.Conn) (bool, error) {
		select {
		case <-time.After(10 * time.Millisecond): // a pool whose connections are busy
		case <-ctx.Done():
			return true, ctx.Err()
		}
		acquired.Store(int64(time.Since(start)))
		return true, nil
	}
	lookPool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(lookPool.Close)
	looker := cursor.NewLooker(lookPool, c.cfg.Schema, c.cfg.Queue, c.cfg.StatementTimeout, zap.NewNop())
	look := looker.Look(ctx)
	returned := time.Since(start)
	require.NoError(t, look.Err)
	require.LessOrEqual(t, look.Took, returned-time.Duration(acquired.Load()),
		"the look's time is the server's, after the connection was had")
}

// A job of a higher priority whose run_at arrives while the claimer
// sleeps lands behind its cursor: the claim its timer makes misses it, and
// the look from the front that claim asks for finds it and wakes the
// claimer. No writer notifies, and the fallback tick is an hour away.
func TestCursorJobDueBehindTheCursorOfASleepingClaimerRuns(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, pool, jobs, ran := newLookingClaimer(ctx, t)
	var first, later int64
	require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+jobs+" (kind, priority) VALUES ('noop', 5) RETURNING id").Scan(&first))
	require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+jobs+" (kind, priority, run_at) VALUES ('noop', 0, now() + interval '2 seconds') RETURNING id").Scan(&later))
	runClaimer(ctx, t, c)
	require.Equal(t, first, receive(ctx, t, ran))
	require.Equal(t, later, receive(ctx, t, ran))
	require.EqualValues(t, 1, c.Stats().Fronts, "every claim but the first is from the cursor")
}

// A due row that another transaction holds locked as a claim passes it is
// behind the cursor, and its lock may end with no write that notifies:
// the looks from the front find it, the cursor goes back before it, and
// the claim after its lock ended takes it, the claimer asleep meanwhile.
func TestCursorLockedRowBehindTheCursorRunsOnceUnlocked(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, pool, jobs, ran := newLookingClaimer(ctx, t)
	asleep, hooks := sleepHook()
	var first, locked int64
	require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+jobs+" (kind, priority) VALUES ('noop', 5) RETURNING id").Scan(&first))
	require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+jobs+" (kind, priority) VALUES ('noop', 0) RETURNING id").Scan(&locked))
	tx := lockJob(ctx, t, pool, jobs, locked)
	runClaimer(testhook.With(ctx, hooks), t, c)
	require.Equal(t, first, receive(ctx, t, ran))
	select {
	case <-asleep:
	case <-ctx.Done():
		t.Fatal("the claimer did not go to sleep")
	}
	require.NoError(t, tx.Rollback(ctx))
	require.Equal(t, locked, receive(ctx, t, ran))
}

// A look that fails keeps the time it ran, on the client: the next look,
// retried, waits LookShare times as long, as after a look that succeeded.
// A look over millions of dead entries that runs into its statement
// timeout would otherwise be tried again a second later, again and again,
// and the looks would keep a connection and a server process busy walking
// the dead entries, not a fifth of one. Here a lock on the jobs table
// holds the look until its timeout.
func TestCursorFailedLookKeepsItsTime(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, pool, jobs := newTestClaimer(ctx, t, Config{})
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, "LOCK TABLE "+jobs+" IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)
	const timeout = 200 * time.Millisecond
	looker := cursor.NewLooker(pool, c.cfg.Schema, c.cfg.Queue, timeout, zap.NewNop())
	look := looker.Look(ctx)
	require.Error(t, look.Err, "the look waits for the lock until its timeout")
	require.GreaterOrEqual(t, look.Took, timeout, "a failed look took as long as it ran")
}
