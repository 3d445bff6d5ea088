package pgdispatch_test

import (
	"context"
	"fmt"
	"strings"
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
	"github.com/pgdispatch/pgdispatch/migrations"
)

// The core acceptance behind a PgBouncer 1.18 in transaction pooling mode,
// set up as docs/operations.md says: the workers' pools and the writers go
// through it, with pgx's cache_describe mode and no startup parameters; the
// listener and the sleep keys connect to PostgreSQL directly.
func TestPgBouncer(t *testing.T) {
	t.Parallel()
	bouncer := pgbouncertest.Start(t, pgtest.URL())

	t.Run("InsertWakes", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		writer := bouncerPool(t, bouncer)
		w, _, _ := start(t, b.bouncerConfig(t, bouncer, "w1"))

		// A first job drains any wake-up left over from start.
		first := b.insertVia(t, writer, "INSERT INTO "+b.jobs+" (kind) VALUES ('record') RETURNING id")
		b.rec.waitStart(t, first, waitFor)
		b.watch.Status(t, first, "done", waitFor)
		waitSleepKey(t, b.schema, pgdispatch.DefaultQueue)
		notified := w.Listener().Notifications()

		id := b.insertVia(t, writer, "INSERT INTO "+b.jobs+" (kind) VALUES ('record') RETURNING id")
		committed := time.Now()
		startedAt := b.rec.waitStart(t, id, 10*time.Second)
		t.Logf("commit to start through PgBouncer: %s", startedAt.Sub(committed))
		b.watch.Status(t, id, "done", waitFor)
		require.Equal(t, 1, b.rec.startsOf(id))
		require.Greater(t, w.Listener().Notifications(), notified, "a sleeping worker is woken by the NOTIFY of a write through PgBouncer")
	})

	t.Run("ThreeWorkers", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		const n = 10000
		var stops []func()
		for i := range 3 {
			cfg := b.bouncerConfig(t, bouncer, fmt.Sprintf("worker-%d", i))
			cfg.Concurrency = 20
			_, stop, _ := start(t, cfg)
			stops = append(stops, stop)
		}
		b.insertVia(t, bouncerPool(t, bouncer),
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
	})

	t.Run("Retries", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		cfg := b.bouncerConfig(t, bouncer, "w")
		cfg.RetryBackoff = func(attempt int) time.Duration { return time.Duration(attempt) * 200 * time.Millisecond }
		start(t, cfg)
		writer := bouncerPool(t, bouncer)

		flaky := b.insertVia(t, writer, `INSERT INTO `+b.jobs+` (kind, payload) VALUES ('record', '{"fail": 2}') RETURNING id`)
		permanent := b.insertVia(t, writer, `INSERT INTO `+b.jobs+` (kind, payload) VALUES ('record', '{"permanent": true}') RETURNING id`)
		exhausted := b.insertVia(t, writer, `INSERT INTO `+b.jobs+` (kind, payload, max_attempts) VALUES ('record', '{"fail": 99}', 2) RETURNING id`)
		unknown := b.insertVia(t, writer, `INSERT INTO `+b.jobs+` (kind) VALUES ('no_such_kind') RETURNING id`)

		s := b.watch.Status(t, flaky, "done", waitFor)
		require.Equal(t, 3, s.Attempts)
		delays := b.retryDelays(flaky)
		require.Len(t, delays, 2, "two retries")
		require.InDelta(t, 0.2, delays[0], 0.01, "backoff after attempt 1")
		require.InDelta(t, 0.4, delays[1], 0.01, "backoff after attempt 2")

		s = b.watch.Status(t, permanent, "dead", waitFor)
		require.Equal(t, 1, s.Attempts)
		require.Contains(t, *s.Error, "refused for good")
		s = b.watch.Status(t, exhausted, "dead", waitFor)
		require.Equal(t, 2, s.Attempts)
		require.Contains(t, *s.Error, "failing attempt 2 on purpose")
		s = b.watch.Status(t, unknown, "dead", waitFor)
		require.Equal(t, 1, s.Attempts)
		require.Contains(t, *s.Error, `unknown kind "no_such_kind"`)
	})

	t.Run("Rescue", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// A crashed worker's claim: running, attempt 1, its lease about to end.
		id := b.insertVia(t, bouncerPool(t, bouncer), `INSERT INTO `+b.jobs+` (kind, status, attempts, locked_by, locked_until)
			VALUES ('record', 'running', 1, 'crashed-worker', now() + interval '1 second') RETURNING id`)
		cfg := b.bouncerConfig(t, bouncer, "rescuer")
		cfg.SweepInterval = 200 * time.Millisecond
		start(t, cfg)
		s := b.watch.Status(t, id, "done", waitFor)
		require.Equal(t, 2, s.Attempts)
		require.Equal(t, 1, b.rec.startsOf(id))
		var rescued bool
		for _, h := range b.watch.History(id) {
			if h.Status == "pending" && h.Error != nil && strings.Contains(*h.Error, "lease expired: worker crashed-worker") {
				rescued = true
			}
		}
		require.True(t, rescued, "the sweeper gave the job back: %+v", b.watch.History(id))
	})
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

// bouncerConfig is a worker config whose pool goes through bouncer and whose
// listener and sleep keys connect directly, with the fallback tick an hour
// away.
func (b *bundle) bouncerConfig(t *testing.T, bouncer *pgbouncertest.Bouncer, id string) pgdispatch.Config {
	t.Helper()
	direct, err := pgx.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	direct.RuntimeParams["application_name"] = "pgdispatch-listener-" + b.schema
	return pgdispatch.Config{
		Pool:             bouncerPool(t, bouncer),
		ListenConnConfig: direct,
		Schema:           b.schema,
		WorkerID:         id,
		Registry:         b.registry,
		Options:          claimer.Options{PollInterval: hour},
		Logger:           zaptest.NewLogger(t),
	}
}

func (b *bundle) insertVia(t *testing.T, db *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var id int64
	require.NoError(t, db.QueryRow(ctx, sql, args...).Scan(&id))
	return id
}

// waitSleepKey waits until a claimer of queue in schema holds the queue's
// sleep key, on its direct connection: it sleeps, and writers notify. The
// key shows only in pg_locks, which this reads every few milliseconds.
func waitSleepKey(t *testing.T, schema, queue string) {
	t.Helper()
	pgtest.WaitSQL(t, waitFor, fmt.Sprintf("a claimer of %q to take its sleep key", queue), `SELECT EXISTS (
		SELECT FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2
		   AND classid = $1::int8::oid AND objid = (hashtext($2)::int8 & 4294967295)::oid)`,
		int64(uint32(migrations.SleepKey(schema))), queue)
}
