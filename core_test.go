package pgdispatch_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/claimer"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgbouncertest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

// route is how a scenario's workers and writers reach PostgreSQL.
type route struct {
	// config is a worker config for b's schema with the fallback tick an
	// hour away, so that nothing the test sees comes from polling.
	config func(t *testing.T, b *bundle, id string) pgdispatch.Config
	// writer is the pool the scenario's writers insert through.
	writer func(t *testing.T) *pgxpool.Pool
}

// direct is PostgreSQL itself, for the workers and the writers.
var direct = route{
	config: func(t *testing.T, b *bundle, id string) pgdispatch.Config { return b.config(t, id) },
	writer: func(t *testing.T) *pgxpool.Pool { return pgtest.Pool(t) },
}

// behind is a PgBouncer in transaction pooling mode, set up as
// docs/operations.md says: the workers' pools and the writers go through
// it, with pgx's cache_describe mode and no startup parameters; the
// listener and the sleep keys connect to PostgreSQL directly.
func behind(bouncer *pgbouncertest.Bouncer) route {
	return route{
		config: func(t *testing.T, b *bundle, id string) pgdispatch.Config {
			t.Helper()
			listen, err := pgx.ParseConfig(pgtest.URL())
			require.NoError(t, err)
			listen.RuntimeParams["application_name"] = "pgdispatch-listener-" + b.schema
			return pgdispatch.Config{
				Pool:             bouncerPool(t, bouncer),
				ListenConnConfig: listen,
				Schema:           b.schema,
				WorkerID:         id,
				Registry:         b.registry,
				Options:          claimer.Options{PollInterval: hour},
				Logger:           zaptest.NewLogger(t),
			}
		},
		writer: func(t *testing.T) *pgxpool.Pool { return bouncerPool(t, bouncer) },
	}
}

// coreScenarios are the core acceptance, each run on a schema of its own
// by TestCore, straight to PostgreSQL, and by TestPgBouncer, through it.
var coreScenarios = []struct {
	name string
	run  func(t *testing.T, b *bundle, via route)
}{
	// Acceptance 1: a plain INSERT on another connection runs at once.
	{"InsertWakesWorker", func(t *testing.T, b *bundle, via route) {
		w, _, _ := start(t, via.config(t, b, "w1"))
		writer := via.writer(t)
		// A first job drains any wake-up left over from start.
		first := b.insertVia(t, writer, "INSERT INTO "+b.jobs+" (kind) VALUES ('record') RETURNING id")
		b.rec.waitStart(t, first, waitFor)
		b.waitAsleep(t, w)
		notified := w.Listener().Notifications()

		id := b.insertVia(t, writer, "INSERT INTO "+b.jobs+" (kind, payload) VALUES ('record', '{\"n\": 2}') RETURNING id")
		committed := time.Now()
		startedAt := b.rec.waitStart(t, id, 10*time.Second)
		t.Logf("commit to start: %s", startedAt.Sub(committed))
		b.watch.Status(t, id, "done", waitFor)
		require.Equal(t, 1, b.rec.startsOf(id))
		require.Greater(t, w.Listener().Notifications(), notified, "a sleeping worker is woken by NOTIFY")
	}},

	// Acceptance 2: three workers share 10,000 jobs; each runs exactly once.
	{"ThreeWorkersRunEachJobOnce", func(t *testing.T, b *bundle, via route) {
		const n = 10000
		var stops []func()
		for i := range 3 {
			cfg := via.config(t, b, fmt.Sprintf("worker-%d", i))
			cfg.Concurrency = 20
			_, stop, _ := start(t, cfg)
			stops = append(stops, stop)
		}
		b.insertVia(t, via.writer(t),
			"WITH i AS (INSERT INTO "+b.jobs+" (kind) SELECT 'record' FROM generate_series(1, $1) RETURNING id) SELECT count(*) FROM i", n)

		b.rec.waitStarts(t, n)
		for _, stop := range stops {
			stop() // graceful: writes every outcome
		}
		b.rec.requireEachOnce(t, n)
		var done, attempts1 int
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `SELECT count(*) FILTER (WHERE status = 'done'),
			count(*) FILTER (WHERE attempts = 1) FROM `+b.jobs).Scan(&done, &attempts1))
		require.Equal(t, n, done)
		require.Equal(t, n, attempts1)
	}},

	// Acceptance 3 in process: a job whose worker stopped renewing its
	// lease (its claim left behind as a crash leaves it) runs again
	// elsewhere once the lease expires, and ends done with attempts = 2.
	// The subprocess version with a real kill -9 is in cmd/pgdispatch.
	{"ExpiredLeaseIsRescued", func(t *testing.T, b *bundle, via route) {
		// The crashed worker's claim: running, attempt 1, lease about to expire.
		id := b.insertVia(t, via.writer(t), `INSERT INTO `+b.jobs+` (kind, status, attempts, locked_by, locked_until)
			VALUES ('record', 'running', 1, 'crashed-worker', now() + interval '1 second') RETURNING id`)
		cfg := via.config(t, b, "rescuer")
		cfg.SweepInterval = 200 * time.Millisecond
		start(t, cfg)
		s := b.watch.Status(t, id, "done", waitFor)
		require.Equal(t, 2, s.Attempts)
		require.Equal(t, 1, b.rec.startsOf(id))
		var rescued bool
		for _, h := range b.watch.History(id) {
			if h.Status == "pending" && h.Error != nil {
				require.Contains(t, *h.Error, "lease expired: worker crashed-worker")
				rescued = true
			}
		}
		require.True(t, rescued, "the sweeper gave the job back: %+v", b.watch.History(id))
	}},

	// Acceptance 5: retries, permanent errors, attempts used up, unknown
	// kinds; the worker keeps serving through all of it.
	{"RetriesAndDeadJobs", func(t *testing.T, b *bundle, via route) {
		cfg := via.config(t, b, "w")
		cfg.RetryBackoff = func(attempt int) time.Duration { return time.Duration(attempt) * 300 * time.Millisecond }
		start(t, cfg)
		writer := via.writer(t)

		flaky := b.insertVia(t, writer, `INSERT INTO `+b.jobs+` (kind, payload) VALUES ('record', '{"fail": 2}') RETURNING id`)
		permanent := b.insertVia(t, writer, `INSERT INTO `+b.jobs+` (kind, payload) VALUES ('record', '{"permanent": true}') RETURNING id`)
		exhausted := b.insertVia(t, writer, `INSERT INTO `+b.jobs+` (kind, payload, max_attempts) VALUES ('record', '{"fail": 99}', 2) RETURNING id`)
		unknown := b.insertVia(t, writer, `INSERT INTO `+b.jobs+` (kind) VALUES ('no_such_kind') RETURNING id`)

		s := b.watch.Status(t, flaky, "done", waitFor)
		require.Equal(t, 3, s.Attempts)
		delays := b.retryDelays(flaky)
		require.Len(t, delays, 2, "two retries")
		require.InDelta(t, 0.3, delays[0], 0.01, "backoff after attempt 1")
		require.InDelta(t, 0.6, delays[1], 0.01, "backoff after attempt 2")

		s = b.watch.Status(t, permanent, "dead", waitFor)
		require.Equal(t, 1, s.Attempts)
		require.Contains(t, *s.Error, "refused for good")

		s = b.watch.Status(t, exhausted, "dead", waitFor)
		require.Equal(t, 2, s.Attempts)
		require.Contains(t, *s.Error, "attempt 2 of 2")
		require.Contains(t, *s.Error, "failing attempt 2 on purpose")

		s = b.watch.Status(t, unknown, "dead", waitFor)
		require.Equal(t, 1, s.Attempts)
		require.Contains(t, *s.Error, `unknown kind "no_such_kind"`)
		require.Zero(t, b.rec.startsOf(unknown))

		ok := b.insertVia(t, writer, "INSERT INTO "+b.jobs+" (kind) VALUES ('record') RETURNING id")
		b.watch.Status(t, ok, "done", waitFor)
	}},
}

// runCore runs every core scenario via route, in parallel.
func runCore(t *testing.T, via route) {
	for _, sc := range coreScenarios {
		t.Run(sc.name, func(t *testing.T) {
			t.Parallel()
			sc.run(t, setup(t), via)
		})
	}
}

// The core acceptance, straight to PostgreSQL.
func TestCore(t *testing.T) {
	t.Parallel()
	runCore(t, direct)
}

// The core acceptance behind a PgBouncer 1.18 in transaction pooling mode
// (behind).
func TestPgBouncer(t *testing.T) {
	t.Parallel()
	runCore(t, behind(pgbouncertest.Start(t, pgtest.URL())))
}

// bouncerPool is a pool through bouncer, set up as docs/operations.md says
// for a transaction pooler, closed when the test ends.
func bouncerPool(t *testing.T, bouncer *pgbouncertest.Bouncer) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(bouncer.URL() + "&default_query_exec_mode=cache_describe&pool_max_conns=10")
	require.NoError(t, err)
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

func (b *bundle) insertVia(t *testing.T, db *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var id int64
	require.NoError(t, db.QueryRow(ctx, sql, args...).Scan(&id))
	return id
}
