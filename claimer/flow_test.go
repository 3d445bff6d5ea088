package claimer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/wait"
)

// setLimit declares a flow limit on c's queue: key "" is every key.
func setLimit(ctx context.Context, t *testing.T, c *Claimer, pool *pgxpool.Pool, key string, concurrency int, strict bool, rate int, per time.Duration) {
	t.Helper()
	nullInt := func(n int) any {
		if n == 0 {
			return nil
		}
		return n
	}
	var perArg any
	if per > 0 {
		perArg = per
	}
	var keyArg any
	if key != "" {
		keyArg = key
	}
	_, err := pool.Exec(ctx, "SELECT "+pgx.Identifier{c.cfg.Schema, "set_flow_limit"}.Sanitize()+"($1, $2, $3, $4, $5, $6)",
		c.cfg.Queue, keyArg, nullInt(concurrency), strict, nullInt(rate), perArg)
	require.NoError(t, err)
}

// insertKeyed inserts n noop jobs of key into jobs, in one statement, and
// returns their ids in order.
func insertKeyed(ctx context.Context, t *testing.T, pool *pgxpool.Pool, jobs, key string, n int) []int64 {
	t.Helper()
	rows, err := pool.Query(ctx, "INSERT INTO "+jobs+" (kind, flow_key) SELECT 'noop', $2 FROM generate_series(1, $1) ORDER BY 1 RETURNING id", n, key)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	return ids
}

// keyOf reads the flow keys of ids.
func keysOf(ctx context.Context, t *testing.T, pool *pgxpool.Pool, jobs string) map[int64]string {
	t.Helper()
	rows, err := pool.Query(ctx, "SELECT id, coalesce(flow_key, '') FROM "+jobs)
	require.NoError(t, err)
	keys := map[int64]string{}
	var (
		id  int64
		key string
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &key}, func() error { keys[id] = key; return nil })
	require.NoError(t, err)
	return keys
}

// concurrencyProbe is an executor that counts, by key, the jobs running at
// once in this process, and keeps the most it saw.
type concurrencyProbe struct {
	mu      sync.Mutex
	keys    map[int64]string
	running map[string]int
	most    map[string]int
	ran     int
	all     chan struct{}
	pool    *pgxpool.Pool
	jobs    string
	n       int
}

func (p *concurrencyProbe) Execute(ctx context.Context, job *executors.Job) error {
	key := p.keys[job.ID]
	p.mu.Lock()
	p.running[key]++
	p.most[key] = max(p.most[key], p.running[key])
	p.mu.Unlock()
	// A read of the table: the job takes a while, and the others start beside it.
	var n int
	if err := p.pool.QueryRow(ctx, "SELECT count(*) FROM "+p.jobs+" WHERE flow_key = $1 AND status = 'running'", key).Scan(&n); err != nil {
		return err
	}
	p.mu.Lock()
	p.running[key]--
	p.ran++
	if p.ran == p.n {
		close(p.all)
	}
	p.mu.Unlock()
	return nil
}

// Two claimers of one queue, each with slots to spare, keep every key to
// its concurrency limit (an exact key's limit over the queue's), and drain
// the queue with no fallback tick: a job that ends lets its key's next one
// start.
func TestFlowConcurrencyHoldsAcrossClaimers(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	probe := &concurrencyProbe{running: map[string]int{}, most: map[string]int{}, all: make(chan struct{})}
	registry := executors.NewRegistry()
	registry.Register("noop", probe)
	opts := Options{Concurrency: 10, PollInterval: time.Hour}
	c1, pool, jobs := newTestClaimer(ctx, t, Config{Registry: registry, Options: opts})
	cfg2 := c1.cfg
	cfg2.WorkerID = "w2"
	c2, err := New(cfg2)
	require.NoError(t, err)

	setLimit(ctx, t, c1, pool, "", 2, false, 0, 0)
	setLimit(ctx, t, c1, pool, "solo", 1, false, 0, 0)
	for _, key := range []string{"k0", "k1", "k2", "k3"} {
		insertKeyed(ctx, t, pool, jobs, key, 40)
	}
	insertKeyed(ctx, t, pool, jobs, "solo", 20)
	insertJobs(ctx, t, pool, jobs, 20)
	probe.keys, probe.n, probe.pool, probe.jobs = keysOf(ctx, t, pool, jobs), 4*40+20+20, pool, jobs

	// A reader samples the table: no key ever has more running than its limit.
	sampled := make(chan string, 1)
	go func() {
		defer close(sampled)
		for {
			select {
			case <-probe.all:
				return
			case <-ctx.Done():
				return
			default:
			}
			var key string
			var n int
			err := pgtest.Pool(t).QueryRow(ctx, `SELECT flow_key, count(*) FROM `+jobs+`
				WHERE status = 'running' AND flow_key IS NOT NULL GROUP BY 1
				ORDER BY count(*) > CASE flow_key WHEN 'solo' THEN 1 ELSE 2 END DESC LIMIT 1`).Scan(&key, &n)
			if errors.Is(err, pgx.ErrNoRows) {
				continue
			}
			if err != nil || n > map[bool]int{true: 1, false: 2}[key == "solo"] {
				sampled <- fmt.Sprintf("key %s had %d running (err %v)", key, n, err)
				return
			}
		}
	}()
	runClaimer(ctx, t, c1)
	runClaimer(ctx, t, c2)
	select {
	case <-probe.all:
	case <-ctx.Done():
		t.Fatal("the queue did not drain: a held key was not claimed again")
	}
	if msg, ok := <-sampled; ok {
		t.Fatal(msg)
	}
	probe.mu.Lock()
	defer probe.mu.Unlock()
	for _, key := range []string{"k0", "k1", "k2", "k3"} {
		require.LessOrEqual(t, probe.most[key], 2, "key %s", key)
	}
	require.Equal(t, 1, probe.most["solo"])
	wait.For(t, time.Minute, "every outcome written", func() bool {
		var left int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+jobs+" WHERE status <> 'done'").Scan(&left))
		return left == 0
	})
}

// A strict key starts its jobs one at a time in order; a failed attempt's
// retry stays the key's head, and the jobs behind it wait for it.
func TestFlowStrictOrderWaitsForTheRetry(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var (
		mu      sync.Mutex
		started []string
		running int
		overlap bool
		done    = make(chan struct{})
	)
	const n = 12
	var ids []int64
	registry := executors.NewRegistry()
	registry.Register("noop", executors.Func(func(ctx context.Context, job *executors.Job) error {
		mu.Lock()
		running++
		overlap = overlap || running > 1
		started = append(started, fmt.Sprintf("%d/%d", job.ID, job.Attempt))
		mu.Unlock()
		defer func() {
			mu.Lock()
			running--
			if job.ID == ids[n-1] {
				close(done)
			}
			mu.Unlock()
		}()
		if (job.ID == ids[3] || job.ID == ids[7]) && job.Attempt == 1 {
			return errors.New("fails once")
		}
		return nil
	}))
	c, pool, jobs := newTestClaimer(ctx, t, Config{Registry: registry, Options: Options{
		Concurrency: 10, PollInterval: time.Hour, RetryBackoff: func(int) time.Duration { return 20 * time.Millisecond },
	}})
	setLimit(ctx, t, c, pool, "s", 0, true, 0, 0)
	ids = insertKeyed(ctx, t, pool, jobs, "s", n)
	runClaimer(ctx, t, c)
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("the strict key did not run through")
	}
	mu.Lock()
	defer mu.Unlock()
	var want []string
	for i, id := range ids {
		want = append(want, fmt.Sprintf("%d/1", id))
		if i == 3 || i == 7 {
			want = append(want, fmt.Sprintf("%d/2", id))
		}
	}
	require.Equal(t, want, started)
	require.False(t, overlap, "two jobs of the strict key ran at once")
}

// A key limited to a rate starts no more than the rate within its
// interval, and the claim says when the next start is due.
func TestFlowRateLimitsStarts(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, pool, jobs := newTestClaimer(ctx, t, Config{})
	setLimit(ctx, t, c, pool, "r", 0, false, 3, time.Hour)
	insertKeyed(ctx, t, pool, jobs, "r", 10)
	insertKeyed(ctx, t, pool, jobs, "free", 2)

	runs, _ := claimNow(ctx, t, c, 100)
	require.Len(t, runs, 5, "3 of the rate-limited key and the 2 others")
	runs, r := claimNow(ctx, t, c, 100)
	require.Empty(t, runs)
	require.NotNil(t, r.Next)
	require.Greater(t, *r.Next, 59*time.Minute, "the next start is due an hour after the first")
}

// Keys take turns: a key with a backlog does not keep another key's job
// waiting for more than a claim.
func TestFlowKeysTakeTurns(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, pool, jobs := newTestClaimer(ctx, t, Config{})
	setLimit(ctx, t, c, pool, "", 0, false, 0, 0) // fair shares only
	insertKeyed(ctx, t, pool, jobs, "a", 200)
	claimNow(ctx, t, c, 10) // a's turn
	late := insertKeyed(ctx, t, pool, jobs, "b", 1)[0]
	runs, _ := claimNow(ctx, t, c, 10)
	require.Len(t, runs, 10)
	var ids []int64
	for _, r := range runs {
		ids = append(ids, r.Job.ID)
	}
	require.Contains(t, ids, late, "b's job is in the next claim")
}

// A queue that gets limits while its claimer runs is claimed under them
// from the next claim; a queue whose limits are cleared is claimed as any
// other.
func TestFlowLimitsFollowTheTable(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, pool, jobs := newTestClaimer(ctx, t, Config{})
	insertKeyed(ctx, t, pool, jobs, "a", 5)
	runs, _ := claimNow(ctx, t, c, 2)
	require.Len(t, runs, 2)
	require.False(t, c.flow.limited)

	setLimit(ctx, t, c, pool, "a", 2, false, 0, 0)
	runs, r := claimNow(ctx, t, c, 10)
	require.Empty(t, runs, "key a has 2 running, its limit")
	require.True(t, r.Held)
	require.True(t, c.flow.limited)

	_, err := pool.Exec(ctx, "SELECT "+pgx.Identifier{c.cfg.Schema, "clear_flow_limit"}.Sanitize()+"($1, $2)", c.cfg.Queue, "a")
	require.NoError(t, err)
	runs, _ = claimNow(ctx, t, c, 10)
	require.Len(t, runs, 3)
	require.False(t, c.flow.limited)
}

// A rate-limited key's starts are counted from when its claim took them,
// not from when the claim's transaction began: a claim slowed down (here
// by a lock on flow_limits, held for 600 ms) does not let the next one
// start more than the rate within the interval.
func TestFlowRateHoldsAfterASlowClaim(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, pool, jobs := newTestClaimer(ctx, t, Config{})
	setLimit(ctx, t, c, pool, "r", 0, false, 3, time.Second)
	claimNow(ctx, t, c, 10) // the claimer learns that the queue is limited
	insertKeyed(ctx, t, pool, jobs, "r", 10)

	holder, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer holder.Release()
	tx, err := holder.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{c.cfg.Schema, "flow_limits"}.Sanitize()+" IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)
	type release struct {
		at  time.Time
		err error
	}
	released := make(chan release, 1)
	go func() {
		// The claim waits for the lock: polled, as nothing tells (the
		// test's context bounds it).
		tick := time.NewTicker(wait.Poll)
		defer tick.Stop()
		for waiting := false; !waiting; {
			if err := pgtest.Pool(t).QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_stat_activity
				WHERE wait_event_type = 'Lock' AND query LIKE '%claim_flow%')`).Scan(&waiting); err != nil {
				released <- release{err: err}
				return
			}
			select {
			case <-tick.C:
			case <-ctx.Done():
				released <- release{err: ctx.Err()}
				return
			}
		}
		time.Sleep(600 * time.Millisecond) // makes the claim slow; nothing waits on it
		at := time.Now()
		released <- release{at, tx.Rollback(ctx)}
	}()
	runs, _ := claimNow(ctx, t, c, 10)
	rel := <-released
	require.NoError(t, rel.err)
	require.Len(t, runs, 3)
	// The slow claim took its jobs after the lock was released: the next
	// three start a second after that at the earliest.
	wait.For(t, 30*time.Second, "the key's next jobs to start", func() bool {
		runs, _ = claimNow(ctx, t, c, 10)
		return len(runs) > 0
	})
	require.GreaterOrEqual(t, time.Since(rel.at), time.Second, "6 jobs of a key limited to 3 a second started within %s", time.Since(rel.at))
}

// In a limited queue, jobs without a key take their turn after the keys;
// while the last look found none, the claims look again every
// unkeyedEvery, not at every claim.
func TestFlowJobsWithoutAKeyAreClaimed(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, pool, jobs := newTestClaimer(ctx, t, Config{})
	setLimit(ctx, t, c, pool, "", 1, false, 0, 0)
	insertKeyed(ctx, t, pool, jobs, "a", 3)
	insertJobs(ctx, t, pool, jobs, 2)
	runs, _ := claimNow(ctx, t, c, 10)
	require.Len(t, runs, 3, "a's one and the two without a key")
	require.True(t, c.flow.found)

	insertJobs(ctx, t, pool, jobs, 1)
	runs, _ = claimNow(ctx, t, c, 10)
	require.Len(t, runs, 1, "the last look found some: this claim looks too")
	runs, _ = claimNow(ctx, t, c, 10)
	require.Empty(t, runs)
	require.False(t, c.flow.found)

	insertJobs(ctx, t, pool, jobs, 1)
	c.flow.looked = time.Time{} // unkeyedEvery has passed
	runs, _ = claimNow(ctx, t, c, 10)
	require.Len(t, runs, 1)
}

// A limit written by hand, not with set_flow_limit, holds as a declared
// one, and deleting or truncating the rows by hand lifts it as
// clear_flow_limit does; each write tells the queue's workers.
func TestFlowLimitsWrittenByHand(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, pool, jobs := newTestClaimer(ctx, t, Config{})
	limits := pgx.Identifier{c.cfg.Schema, "flow_limits"}.Sanitize()
	listener, err := pgx.Connect(ctx, pgtest.URL())
	require.NoError(t, err)
	defer func() { _ = listener.Close(context.Background()) }()
	_, err = listener.Exec(ctx, "LISTEN "+pgx.Identifier{c.cfg.Schema}.Sanitize())
	require.NoError(t, err)
	told := func(what string) {
		t.Helper()
		wctx, stop := context.WithTimeout(ctx, 10*time.Second)
		defer stop()
		n, err := listener.WaitForNotification(wctx)
		require.NoError(t, err, "%s told no worker", what)
		require.Equal(t, c.cfg.Queue, n.Payload, what)
	}
	insertKeyed(ctx, t, pool, jobs, "a", 6)

	_, err = pool.Exec(ctx, "INSERT INTO "+limits+" (queue, concurrency) VALUES ($1, 1)", c.cfg.Queue)
	require.NoError(t, err)
	told("an INSERT")
	runs, _ := claimNow(ctx, t, c, 10)
	require.Len(t, runs, 1, "a limit inserted by hand holds")
	_, r := claimNow(ctx, t, c, 10)
	require.True(t, r.Held, "key a is at its limit")

	_, err = pool.Exec(ctx, "UPDATE "+limits+" SET concurrency = 3 WHERE queue = $1", c.cfg.Queue)
	require.NoError(t, err)
	told("an UPDATE")
	runs, _ = claimNow(ctx, t, c, 10)
	require.Len(t, runs, 2, "a limit raised by hand: 3 running")

	_, err = pool.Exec(ctx, "DELETE FROM "+limits+" WHERE queue = $1", c.cfg.Queue)
	require.NoError(t, err)
	told("a DELETE")
	runs, _ = claimNow(ctx, t, c, 1)
	require.Len(t, runs, 1)
	require.False(t, c.flow.limited, "the queue's last limit deleted by hand: no longer limited")

	_, err = pool.Exec(ctx, "INSERT INTO "+limits+" (queue, key, concurrency) VALUES ($1, 'a', 1)", c.cfg.Queue)
	require.NoError(t, err)
	told("an INSERT")
	runs, _ = claimNow(ctx, t, c, 10)
	require.Empty(t, runs, "key a has 4 running, over its limit")
	require.True(t, c.flow.limited)
	_, err = pool.Exec(ctx, "TRUNCATE "+limits)
	require.NoError(t, err)
	told("a TRUNCATE")
	runs, _ = claimNow(ctx, t, c, 10)
	require.Len(t, runs, 2, "the limits truncated: the rest run")
	require.False(t, c.flow.limited)
}
