package claimer

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/pgtest"
)

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

func newWarmClaimer(ctx context.Context, t *testing.T, schema string, maxConns int32, hold time.Duration) (*Claimer, *pgxpool.Pool) {
	t.Helper()
	pool := newSizedPool(ctx, t, maxConns)
	c, err := New(Config{
		Pool: pool, Schema: schema, SleepConnConfig: pool.Config().ConnConfig, Queue: "default",
		WorkerID: "w", Registry: executors.NewRegistry(), Hold: hold,
	})
	require.NoError(t, err)
	return c, pool
}

// Warming opens the connections a busy claimer uses at once (one per held
// batch, the claim's and the completer's) and leaves each with every
// statement of the claimer prepared and its generic plan made. It changes
// no job and leaves no setting behind.
func TestWarmReadiesConnections(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	schema := pgtest.Schema(t)
	c, pool := newWarmClaimer(ctx, t, schema, 10, 0)
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	insertJobs(ctx, t, pool, jobs, 3)

	c.warm(ctx, false)

	conns := pool.AcquireAllIdle(ctx)
	defer func() {
		for _, conn := range conns {
			conn.Release()
		}
	}()
	require.Len(t, conns, maxHeld+2, "one connection per held batch, the claim's and the completer's")
	statements := []string{c.claimSQL, c.heldClaimSQL, c.heldClaimPastSQL, c.heldCompleteSQL, c.leaseHeldSQL, c.completeSQL, c.heartbeatSQL}
	for _, conn := range conns {
		var planned int
		var mode string
		require.NoError(t, conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_prepared_statements
			WHERE statement = ANY($1) AND generic_plans > 0), current_setting('plan_cache_mode')`, statements).Scan(&planned, &mode))
		require.Equal(t, len(statements), planned, "statements prepared with a generic plan on this connection")
		require.Equal(t, "auto", mode, "the plan settings were the warm-up transaction's own")
	}

	var pending, attempts int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FILTER (WHERE status = 'pending'), sum(attempts) FROM "+jobs).
		Scan(&pending, &attempts))
	require.Equal(t, 3, pending)
	require.Zero(t, attempts)
}

// A warm-up that fails (here the schema does not exist) gives back every
// connection it took, and the pool goes on serving.
func TestWarmFailureReleasesConnections(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, pool := newWarmClaimer(ctx, t, pgtest.EmptySchemaName(t), 10, 0)

	c.warm(ctx, false)

	require.Zero(t, pool.Stat().AcquiredConns())
	var one int
	require.NoError(t, pool.QueryRow(ctx, "SELECT 1").Scan(&one))
	require.Equal(t, 1, one)
}

// Warming leaves a connection of the pool to the claims it runs beside (a
// pool of one is not warmed at all, a pool of four gets three), and a
// claimer that never holds (CLAIM_HOLD=0) warms only the claim's and the
// completer's.
func TestWarmSizes(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	schema := pgtest.Schema(t)
	for _, tc := range []struct {
		maxConns int32
		hold     time.Duration
		want     int32
	}{{1, 0, 0}, {4, 0, 3}, {10, -1, 2}} {
		c, pool := newWarmClaimer(ctx, t, schema, tc.maxConns, tc.hold)
		c.warm(ctx, false)
		require.Equal(t, tc.want, pool.Stat().TotalConns(), "a pool of %d, hold %s", tc.maxConns, tc.hold)
	}
}

// A warm-up beside a busy claimer takes only what the pool hands out
// without waiting: with 8 of 10 connections in use, it opens the 2 it has
// room for and queues no acquire. Before, it made 9: the other 7 queued for
// connections coming back, which in a worker are the claims' and the held
// batches', and kept each up to warmHold.
func TestWarmAgainTakesNoConnectionInUse(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool := newSizedPool(ctx, t, 10)
	c, err := New(Config{
		Pool: pool, Schema: pgtest.Schema(t), SleepConnConfig: pool.Config().ConnConfig, Queue: "default",
		WorkerID: "w", Registry: executors.NewRegistry(),
	})
	require.NoError(t, err)
	inUse := make([]*pgxpool.Conn, 8)
	for i := range inUse {
		inUse[i], err = pool.Acquire(ctx)
		require.NoError(t, err)
	}
	defer func() {
		for _, conn := range inUse {
			conn.Release()
		}
	}()
	before := pool.Stat()

	c.warm(ctx, true)

	after := pool.Stat()
	require.Equal(t, int64(2), after.NewConnsCount()-before.NewConnsCount(), "the room for two connections, opened and warmed")
	require.Equal(t, int64(2), after.AcquireCount()-before.AcquireCount(),
		"two acquires, none queued for a connection to come back (a busy claimer's, in a worker)")
	require.Equal(t, int32(8), after.AcquiredConns(), "the connections in use stay where they are")
}

// Claimers of several queues warm one pool at once, together wanting more
// connections than it has: none waits on the others' connections until it
// times out; each warms what it can and is done.
func TestWarmSharesAPool(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	schema := pgtest.Schema(t)
	pool := newSizedPool(ctx, t, 6) // each claimer warms 5 (3 held batches, the claim, the completer)
	core, logs := observer.New(zap.DebugLevel)
	var wg sync.WaitGroup
	for _, queue := range []string{"a", "b", "c"} {
		c, err := New(Config{
			Pool: pool, Schema: schema, SleepConnConfig: pool.Config().ConnConfig, Queue: queue, WorkerID: "w",
			Registry: executors.NewRegistry(), Logger: zap.New(core),
			StatementTimeout: 20 * time.Second, // longer than the test waits: a warm that waited this long fails it
		})
		require.NoError(t, err)
		wg.Add(1)
		go func() { defer wg.Done(); c.warm(ctx, false) }()
	}
	wg.Wait()
	require.Len(t, logs.FilterMessage("connections warmed").All(), 3, "%v", logs.All())
	require.LessOrEqual(t, pool.Stat().TotalConns(), int32(6))
}

// After the pool has closed the connections a burst needs (idle for its
// MaxConnIdleTime since the last claim that found jobs), the claim that
// finds jobs again warms them beside the burst, as at start.
func TestWarmAgainAfterThePoolWentCold(t *testing.T) {
	t.Parallel()
	// Idle closes, after MaxConnIdleTime; more than poolReadEvery, as a
	// real pool's 30 minutes is.
	pool := warmAgainPool(t, func(cfg *pgxpool.Config) { cfg.MaxConnIdleTime = poolReadEvery + 200*time.Millisecond })
	cold := func() bool { return pool.Stat().TotalConns() == 0 }
	requireWarmAgain(t, pool, cold, "the pool closes its idle connections")
}

func TestWarmAgainAfterThePoolReplacedConnections(t *testing.T) {
	t.Parallel()
	// Lifetime closes, after MaxConnLifetime, which pgxpool counts apart.
	pool := warmAgainPool(t, func(cfg *pgxpool.Config) { cfg.MaxConnLifetime = poolReadEvery + 200*time.Millisecond })
	replaced := func() bool {
		st := pool.Stat()
		return st.TotalConns() == 0 && st.MaxLifetimeDestroyCount() > 0 && st.MaxIdleDestroyCount() == 0
	}
	requireWarmAgain(t, pool, replaced, "the pool closes its connections at the end of their lifetime")
}

// warmAgainPool is a pool of 10 whose health check runs every 50 ms.
func warmAgainPool(t *testing.T, tune func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	cfg.MaxConns = 10
	cfg.HealthCheckPeriod = 50 * time.Millisecond
	tune(cfg)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// requireWarmAgain runs a job on a claimer of pool, waits until replaced
// says the pool has let its connections go, runs a second job, and wants
// the claimer to have warmed a full set of connections again beside it.
func requireWarmAgain(t *testing.T, pool *pgxpool.Pool, replaced func() bool, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schema := pgtest.Schema(t)
	ran := make(chan int64, 1)
	registry := executors.NewRegistry()
	registry.Register("noop", executors.Func(func(_ context.Context, job *executors.Job) error {
		ran <- job.ID
		return nil
	}))
	c, err := New(Config{
		Pool: pool, Schema: schema, SleepConnConfig: pool.Config().ConnConfig, Queue: "default",
		WorkerID: "w", Registry: registry,
	})
	require.NoError(t, err)
	stop := runClaimer(ctx, t, c)
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	runOne := func() {
		t.Helper()
		id := insertJobs(ctx, t, pgtest.Pool(t), jobs, 1)[0]
		c.Wake()
		select {
		case got := <-ran:
			require.Equal(t, id, got)
		case <-ctx.Done():
			t.Fatal("the job never ran")
		}
	}

	runOne() // the first claim that finds jobs
	require.Eventually(t, replaced, 30*time.Second, 10*time.Millisecond, what)
	before := pool.Stat().NewConnsCount()
	runOne()
	warmed := int64(min(maxHeld+2, 10-1))
	require.Eventually(t, func() bool { return pool.Stat().NewConnsCount()-before >= warmed }, 30*time.Second, 10*time.Millisecond,
		"the claim after the pool let its connections go warms %d connections again; it opened %d", warmed, pool.Stat().NewConnsCount()-before)
	require.NoError(t, stop())
}
