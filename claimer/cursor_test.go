package claimer

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/claimer/internal/cursor"
	"github.com/pgdispatch/pgdispatch/claimer/internal/machine"
	"github.com/pgdispatch/pgdispatch/claimer/internal/runstate"
	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/testhook"
	"github.com/pgdispatch/pgdispatch/internal/testkit/wait"
)

func ids(runs []*runstate.Run) []int64 {
	out := make([]int64, len(runs))
	for i, r := range runs {
		out[i] = r.Job.ID
	}
	return out
}

// A claim that took every slot it asked for sets the cursor at its last
// job, and the next claim starts there; a higher-priority job and one with
// an earlier run_at, inserted behind the cursor, are claimed first at the
// next claim from the front, before the jobs still ahead of the cursor: the
// fallback tick's, the one after a claim from the cursor came up short,
// and the first a second after the last claim from the front.
func TestCursorJobsBehindItAreClaimedFirstFromTheFront(t *testing.T) {
	t.Parallel()
	for name, next := range map[string]func(ctx context.Context, c *Claimer) machine.Event{
		"fallback tick": func(context.Context, *Claimer) machine.Event { return machine.EventTick },
		"a second on": func(_ context.Context, c *Claimer) machine.Event {
			c.cursor.Every = 0 // cursor.FrontEvery: the last claim from the front is as far back as that
			c.cursor.LastFront = c.cursor.LastFront.Add(-cursor.FrontEvery)
			return machine.EventSlotFreed
		},
		"after a short claim from the cursor": func(ctx context.Context, c *Claimer) machine.Event {
			c.cursor.Set = true
			c.cursor.ID = 1 << 62 // past every job: the claim from the cursor finds none
			_, r := claimNow(ctx, t, c, 1)
			require.Zero(t, r.Claimed)
			return machine.EventTimer
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			c, pool, jobs := newTestClaimer(ctx, t, Config{})
			c.cursor.Every = time.Hour // no claim is from the front for the time it takes
			c.cursor.Slow = -1         // every claim from the front counts as slow: the cursor is used
			ahead := insertJobs(ctx, t, pool, jobs, 5)
			runs, _ := claimNow(ctx, t, c, 2)
			require.ElementsMatch(t, ahead[:2], ids(runs), "the first claim is from the front")
			require.True(t, c.cursor.Set)
			require.Equal(t, ahead[1], c.cursor.ID, "the cursor is at the claim's last job")

			var urgent, early int64
			require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+jobs+" (kind, priority) VALUES ('noop', -1) RETURNING id").Scan(&urgent))
			require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+jobs+" (kind, run_at) VALUES ('noop', now() - interval '1 hour') RETURNING id").Scan(&early))

			fronts := c.fronts.Load()
			runs, _ = claimNow(ctx, t, c, 1)
			require.Equal(t, ahead[2:3], ids(runs), "a claim from the cursor takes the next job ahead of it")
			require.Equal(t, fronts, c.fronts.Load())

			runs, r := claimOn(ctx, t, c, next(ctx, c), 2)
			require.ElementsMatch(t, []int64{urgent, early}, ids(runs), "the claim from the front takes the jobs behind the cursor first")
			require.Equal(t, 2, r.Claimed)
			require.Positive(t, c.fronts.Load()-fronts)
			runs, _ = claimNow(ctx, t, c, 5)
			require.ElementsMatch(t, ahead[3:], ids(runs))
		})
	}
}

// The claim after this claimer gave back a lost claim's jobs, and after a
// failed claim, is from the front.
func TestCursorResetByGiveBackAndFailure(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, pool, jobs := newTestClaimer(ctx, t, Config{})
	c.cursor.Every = time.Hour
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
	r := c.claim(canceled, machine.EventTimer, 1, nil)
	require.Error(t, r.Err)
	require.False(t, c.cursor.Set, "after a failed claim, from the front")
}

// A claimer that stays saturated claims from its cursor, and from the
// front at least every cursor.FrontEvery however busy it is: a job that lands
// behind the cursor meanwhile (here a higher priority) runs then, not after
// the whole backlog. The cursor's clock is the test's, and moves on 100 ms
// at each claim.
func TestCursorBusyClaimerLooksFromTheFrontEverySecond(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var (
		mu     sync.Mutex
		order  []int64
		urgent atomic.Int64
		pool   *pgxpool.Pool
		jobs   string
	)
	reg := executors.NewRegistry()
	reg.Register("noop", executors.Func(func(ctx context.Context, job *executors.Job) error {
		mu.Lock()
		order = append(order, job.ID)
		n := len(order)
		mu.Unlock()
		if n == 3 { // the cursor is set: behind it, a job of a higher priority
			var id int64
			if err := pool.QueryRow(ctx, "INSERT INTO "+jobs+" (kind, priority) VALUES ('noop', -1) RETURNING id").Scan(&id); err != nil {
				return err
			}
			urgent.Store(id)
		}
		return nil
	}))
	c, p, j := newTestClaimer(ctx, t, Config{Registry: reg, Options: Options{Concurrency: 1, PollInterval: time.Hour}})
	pool, jobs = p, j
	clock := time.Now()
	c.cursor.Now = func() time.Time { clock = clock.Add(100 * time.Millisecond); return clock } // the claim loop's alone
	const backlog = 60
	insertJobs(ctx, t, pool, jobs, backlog)
	runClaimer(ctx, t, c)
	wait.For(t, 30*time.Second, "every job to run", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(order) == backlog+1
	})
	mu.Lock()
	defer mu.Unlock()
	at := slices.Index(order, urgent.Load())
	require.Positive(t, at)
	require.Less(t, at, 3+int(cursor.FrontEvery/(100*time.Millisecond))+2,
		"the job behind the cursor runs at the first claim from the front a second on, not after the backlog: %v", order)
	require.Positive(t, c.Stats().Fronts)
	require.Less(t, c.Stats().Fronts, c.Stats().Claims/2, "most claims of a saturated claimer are from the cursor")
}

// A saturated claimer claims only as slots free. While its claims from the
// front are quick, each claim is one, and a freed slot goes to the due job
// of the highest priority. While they are slow (a hold), a slot that frees
// within the second after a claim from the front goes to the next job
// ahead of the cursor, though a due job of a higher priority waits behind
// it, and that job holds the slot while it runs; the job behind the cursor
// is claimed at the first slot freed a second or more after the claim from
// the front. Two slots, four slow jobs of priority 5 that run until the
// test lets them end, and one of priority 0 inserted behind the cursor;
// the cursor's clock stands still until the test moves it on, so a claim
// from the front takes no time on it.
func TestCursorSlotFreedGoesAheadOfTheCursorOnlyWhileClaimsFromTheFrontAreSlow(t *testing.T) {
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
		clock   = time.Now()
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
	c.cursor.Now = func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
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
	runClaimer(ctx, t, c)
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
	wait.On(t, 20*time.Second, "the first claim's two jobs to start", startedN(2))
	urgent := insert(0)
	end(slow[0])
	wait.On(t, 20*time.Second, "the freed slot's job to start", startedN(3))
	mu.Lock()
	if !slowFronts {
		defer mu.Unlock()
		require.Equal(t, urgent, started[2], "claims from the front are quick: the freed slot goes to the due job of the highest priority: %v", started)
		return
	}
	require.Equal(t, slow[2], started[2], "within the second, the freed slot goes to the next job ahead of the cursor: %v", started)
	clock = clock.Add(time.Hour) // no slot frees: no claim, however long
	mu.Unlock()
	end(slow[1])
	wait.On(t, 20*time.Second, "the next freed slot's job to start", startedN(4))
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, urgent, started[3], "the first slot freed a second on goes to the job behind the cursor: %v", started)
}

// Under a transaction held open long enough, a claim from the front walks
// millions of dead entries and takes a second or more (1M: 0.3 to 1.5 s,
// EXPLAIN ANALYZE on PostgreSQL 15). A saturated claimer must still claim
// from its cursor between its claims from the front, else each claim is a
// second or more after the start of the last claim from the front, every
// claim is from the front, and the cursor saves nothing just when the hold
// has grown longest. The cursor's clock moves on 10 ms at each look, and
// 1.5 s while a claim from the front runs.
func TestCursorSlowClaimsFromTheFrontLeaveTheCursorItsTurn(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reg := executors.NewRegistry()
	reg.Register("noop", executors.Func(func(context.Context, *executors.Job) error { return nil }))
	c, pool, jobs := newTestClaimer(ctx, t, Config{Registry: reg, Options: Options{Concurrency: 2, PollInterval: time.Hour}})
	var (
		mu     sync.Mutex
		clock  = time.Now()
		fronts int64
	)
	c.cursor.Now = func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		clock = clock.Add(10 * time.Millisecond)
		return clock
	}
	hooks := &testhook.Hooks{ClaimSent: func(string) { // on the claim loop, as the claim runs
		mu.Lock()
		defer mu.Unlock()
		if f := c.fronts.Load(); f != fronts {
			fronts = f
			clock = clock.Add(1500 * time.Millisecond)
		}
	}}
	const backlog = 60
	insertJobs(ctx, t, pool, jobs, backlog)
	stop := runClaimer(testhook.With(ctx, hooks), t, c)
	wait.For(t, 20*time.Second, "every job to be claimed", func() bool { return c.Stats().Claimed == backlog })
	require.NoError(t, stop())
	s := c.Stats()
	require.Less(t, s.Fronts, s.Claims/2, "most claims of a saturated claimer are from the cursor, however long a claim from the front takes: %+v", s)
}
