package claimer

import (
	"context"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/claimer/internal/runstate"
	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/testhook"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

// gatedRegistry runs noop jobs one at a time as the test lets them: each
// start sends the job's id on started and waits for a value on release.
func gatedRegistry(started chan<- int64, release <-chan struct{}) *executors.Registry {
	registry := executors.NewRegistry()
	registry.Register("noop", executors.Func(func(ctx context.Context, job *executors.Job) error {
		started <- job.ID
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}))
	return registry
}

// nextStarted is the id of the next job that starts, within a guard of
// several seconds.
func nextStarted(t *testing.T, started <-chan int64, what string) int64 {
	t.Helper()
	select {
	case id := <-started:
		return id
	case <-time.After(10 * time.Second):
		t.Fatalf("%s never started", what)
		return 0
	}
}

// A higher-priority job and a job with an earlier run_at, inserted behind
// the cursor (the last job taken) while the claimer is busy, are claimed
// before the jobs after the cursor once a claim looks from the front: the
// first claim after the fallback tick does.
func TestClaimCursorTakesEarlierJobsFirst(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	started, release := make(chan int64, 8), make(chan struct{})
	c, pool, jobs := newTestClaimer(ctx, t, Config{
		Registry: gatedRegistry(started, release),
		Options:  Options{Concurrency: 1, PollInterval: 50 * time.Millisecond, ShutdownTimeout: time.Second},
	})
	ids := insertJobs(ctx, t, pool, jobs, 4)
	runClaimer(ctx, t, c)
	require.Equal(t, ids[0], nextStarted(t, started, "the first job"))

	var high, early int64
	require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+jobs+" (kind, priority) VALUES ('noop', -1) RETURNING id").Scan(&high))
	require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+jobs+" (kind, run_at) SELECT 'noop', run_at - interval '1 hour' FROM "+
		jobs+" WHERE id = $1 RETURNING id", ids[0]).Scan(&early))
	ticks := c.Stats().Ticks
	require.Eventually(t, func() bool { return c.Stats().Ticks > ticks }, 10*time.Second, time.Millisecond, "a tick")

	var order []int64
	for range 5 {
		release <- struct{}{}
		order = append(order, nextStarted(t, started, "the next job"))
	}
	require.Equal(t, []int64{high, early, ids[1], ids[2], ids[3]}, order)
	close(release)
}

// A notification whose claim from the cursor finds nothing means the row
// that notified is behind the cursor: the claimer looks from the front at
// once, and does not wait for the tick.
func TestClaimCursorLooksFromTheFrontWhenWokenForNothing(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	started, release := make(chan int64, 8), make(chan struct{})
	defer close(release)
	c, pool, jobs := newTestClaimer(ctx, t, Config{
		Registry: gatedRegistry(started, release),
		Options:  Options{PollInterval: time.Hour, ShutdownTimeout: time.Second},
	})
	// A cursor past every job, whose look from the front is not due for an
	// hour of claims.
	c.cursor = cursor{set: true, priority: math.MaxInt16, runAt: time.Now().Add(time.Hour), id: math.MaxInt64, frontCost: time.Hour}
	asleep := make(chan struct{}, 16)
	runClaimer(testhook.With(ctx, &testhook.Hooks{ClaimerState: func(_, _, to string) {
		if to == "asleep" {
			asleep <- struct{}{}
		}
	}}), t, c)
	<-asleep
	id := insertJobs(ctx, t, pool, jobs, 1)[0]
	c.Wake()
	require.Equal(t, id, nextStarted(t, started, "the job behind the cursor"))
}

// Once two looks from the front in a row took frontDear or more, the look
// before a sleep starts sleepWindow before the cursor's run_at, in its
// priority; one cheap look from the front makes it look from the front
// again.
func TestClaimCursorLooksBeforeASleep(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	run := func(id int64, priority int16, runAt time.Time) *runstate.Run {
		return &runstate.Run{Job: &executors.Job{ID: id, Priority: priority, RunAt: runAt}}
	}
	var k cursor
	require.True(t, k.fromFront(), "no cursor yet")
	k.claimed(true, frontDear, []*runstate.Run{run(3, 0, at), run(1, 0, at), run(2, 0, at)}, true, false)
	require.Equal(t, cursor{set: true, priority: 0, runAt: at, id: 3, frontCost: frontDear, last: true, dear: 1}, k)
	require.False(t, k.fromFront())
	k.beforeSleep()
	require.True(t, k.fromFront(), "one dear look is not enough")
	k.claimed(true, frontDear, nil, false, false)
	k.beforeSleep()
	require.False(t, k.fromFront())
	p, ts, id := k.args(false)
	require.Equal(t, int16(0), p)
	require.Equal(t, at.Add(-sleepWindow), ts.Time)
	require.Equal(t, int64(math.MinInt64), id)

	// A late job inside the window: the cursor goes back to it.
	k.claimed(false, time.Millisecond, []*runstate.Run{run(9, 0, at.Add(-time.Millisecond))}, false, false)
	require.Equal(t, int64(9), k.id)
	_, ts, id = k.args(false)
	require.Equal(t, at.Add(-time.Millisecond), ts.Time)
	require.Equal(t, int64(9), id)

	// The claims from the cursor that took every free slot have taken
	// frontShare times the last look from the front: the next looks from
	// the front. Claims that came up short do not count.
	k.claimed(false, frontShare*frontDear, nil, false, false)
	require.False(t, k.fromFront())
	k.claimed(false, frontShare*frontDear, []*runstate.Run{run(10, 0, at)}, true, false)
	require.True(t, k.fromFront())
	k.claimed(true, time.Millisecond, nil, false, true)
	require.Zero(t, k.dear)
	require.True(t, k.fromFront(), "it skipped locked rows")
}

// A drain while another transaction holds the oldest snapshot: the claims
// go from the cursor, and every job runs once, those that land behind the
// cursor meanwhile (a run_at in the past, a higher priority) included.
func TestClaimCursorDrainsUnderAHeldSnapshot(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const n = 3000
	var ran atomic.Int64
	registry := executors.NewRegistry()
	registry.Register("noop", executors.Func(func(context.Context, *executors.Job) error { ran.Add(1); return nil }))
	c, pool, jobs := newTestClaimer(ctx, t, Config{Registry: registry, Options: Options{Concurrency: 20, PollInterval: 100 * time.Millisecond}})
	hold, err := pgtest.Conn(t).Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = hold.Rollback(context.WithoutCancel(ctx)) }()
	_, err = hold.Exec(ctx, "SELECT txid_current()")
	require.NoError(t, err)

	insertJobs(ctx, t, pool, jobs, n)
	runClaimer(ctx, t, c)
	require.Eventually(t, func() bool { return ran.Load() >= n/2 }, time.Minute, time.Millisecond)
	_, err = pool.Exec(ctx, "INSERT INTO "+jobs+" (kind, run_at, priority) SELECT 'noop', now() - interval '1 hour', 0 FROM generate_series(1, 5)")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "INSERT INTO "+jobs+" (kind, priority) SELECT 'noop', -1 FROM generate_series(1, 5)")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var done int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+jobs+" WHERE status = 'done'").Scan(&done))
		return done == n+10
	}, time.Minute, 5*time.Millisecond)
	var twice int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+jobs+" WHERE attempts <> 1").Scan(&twice))
	require.Zero(t, twice)
	s := c.Stats()
	t.Logf("%d claims, %d from the front, %d ticks", s.Claims, s.Fronts, s.Ticks)
	require.Less(t, s.Fronts, s.Claims)
}
