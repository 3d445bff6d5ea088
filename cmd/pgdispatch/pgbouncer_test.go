package main

import (
	"context"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgbouncertest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/migrations"
)

// route is how the commands reach PostgreSQL: DATABASE_URL, straight to it
// or through a pooler, and LISTEN_DATABASE_URL straight to it, under an
// application_name of its own so that its session shows.
type route struct {
	dbURL  string
	pooled bool
}

// The commands as a user runs them, straight to PostgreSQL.
func TestCommands(t *testing.T) {
	t.Parallel()
	testCommands(t, route{dbURL: pgtest.URL()})
}

// The commands as a user behind a default PgBouncer 1.18 in transaction
// pooling mode runs them: DATABASE_URL through it, LISTEN_DATABASE_URL
// straight to PostgreSQL.
func TestPgBouncerCommands(t *testing.T) {
	t.Parallel()
	bouncer := pgbouncertest.Start(t, pgtest.URL())
	testCommands(t, route{dbURL: bouncer.URL(), pooled: true})
}

// testCommands runs the commands via: migrate and run --migrate take their
// session lock over the direct connection; run, enqueue, stats, jobs and
// triggers work through DATABASE_URL, and the worker listens on
// LISTEN_DATABASE_URL.
func testCommands(t *testing.T, via route) {
	schema := pgtest.EmptySchemaName(t)
	app := "listener-" + schema
	e := dbEnv(schema, "DATABASE_URL="+via.dbURL, "LISTEN_DATABASE_URL="+withParam(pgtest.URL(), "application_name="+app),
		"POLL_INTERVAL=1h", "SYNCHRONOUS_COMMIT=on")
	run := func(args ...string) string {
		t.Helper()
		p := start(t, e, args...)
		require.Equal(t, 0, p.wait(t, time.Minute), p.stderr.String())
		return p.stdout.String()
	}

	require.Contains(t, run("migrate"), "is at version "+strconv.Itoa(int(migrations.Latest())))
	w := pgtest.Watch(t, schema)
	worker := start(t, e, "run", "--migrate")
	worker.stderr.waitFor(t, "listening", 30*time.Second)
	pgtest.WaitSQL(t, 30*time.Second, "the listener on LISTEN_DATABASE_URL",
		"SELECT EXISTS (SELECT FROM pg_stat_activity WHERE application_name = $1 AND query ILIKE 'listen%')", app)

	id, err := strconv.ParseInt(strings.TrimSpace(run("enqueue", "--kind", "noop", "--payload", `{"n": [1, 2]}`)), 10, 64)
	require.NoError(t, err)
	s := w.Status(t, id, "done", 30*time.Second)
	require.Equal(t, 1, s.Attempts)
	require.Regexp(t, `(?m)^\s*default\s+noop\s`, run("stats"))
	require.Regexp(t, `(?m)^status\s+done$`, run("jobs", "show", strconv.FormatInt(id, 10)))

	// A dispatch trigger added via DATABASE_URL, fired by a write the same way.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	table := pgx.Identifier{schema, "orders"}.Sanitize()
	_, err = pgtest.Pool(t).Exec(ctx, "CREATE TABLE "+table+" (id int PRIMARY KEY)")
	require.NoError(t, err)
	require.Contains(t, run("triggers", "add", "--table", table, "--kind", "noop", "--name", "orders_new"), "trigger orders_new added")
	writer, err := pgx.Connect(ctx, withParam(via.dbURL, "default_query_exec_mode=cache_describe"))
	require.NoError(t, err)
	defer func() { require.NoError(t, writer.Close(ctx)) }()
	var fired int64
	_, err = writer.Exec(ctx, "INSERT INTO "+table+" VALUES ($1)", 1)
	require.NoError(t, err)
	w.Until(t, 30*time.Second, "the trigger's job to be done", func(m map[int64]pgtest.JobState) bool {
		for jobID, s := range m {
			if jobID != id && s.Status == "done" {
				fired = jobID
				return true
			}
		}
		return false
	})
	retry := start(t, e, "jobs", "retry", strconv.FormatInt(fired, 10))
	require.Equal(t, 1, retry.wait(t, time.Minute), "a retry that changed nothing fails") // and yet it ran:
	require.Contains(t, retry.stdout.String(), "left as it is: done")

	// bench measures PostgreSQL: it connects past a pooler.
	b := start(t, e, "bench", "--json", "--scenario", "latency", "--jobs", "5", "--spacing", "1ms")
	require.Equal(t, 0, b.wait(t, time.Minute), b.stderr.String())
	if via.pooled {
		require.Contains(t, b.stderr.String(), "bench connects to LISTEN_DATABASE_URL")
	}
	require.Contains(t, b.stdout.String(), "latency_p50_ms")

	require.NoError(t, worker.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 0, worker.wait(t, 30*time.Second), worker.stderr.String())
	require.NotContains(t, worker.stderr.String(), "prepared statement")
}

// Behind the pooler every call stays bounded without server-side timeouts:
// a call its context cuts short is cancelled on the server too, through
// PgBouncer, which forwards pgx's cancel request.
func TestPgBouncerCallsAreBounded(t *testing.T) {
	t.Parallel()
	bouncer := pgbouncertest.Start(t, pgtest.URL())
	ctx := context.Background()
	pool, err := newPool(ctx, poolOptions{
		url: bouncer.URL(), timeout: 5 * time.Second, pooled: true,
		params: map[string]string{"synchronous_commit": "off"},
	})
	require.NoError(t, err)
	defer pool.Close()
	cfg := pool.Config().ConnConfig
	require.Equal(t, pgx.QueryExecModeCacheDescribe, cfg.DefaultQueryExecMode)
	require.Equal(t, map[string]string{"application_name": "pgdispatch"}, cfg.RuntimeParams, "no other startup parameter")

	sleeping := func(want bool, what string) {
		t.Helper()
		pgtest.WaitSQL(t, 10*time.Second, what, `SELECT EXISTS (SELECT FROM pg_stat_activity
			WHERE state = 'active' AND query = 'SELECT pg_sleep(60)' AND application_name = 'pgdispatch') = $1`, want)
	}
	callCtx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := pool.Exec(callCtx, "SELECT pg_sleep(60)"); done <- err }()
	sleeping(true, "the statement to run on the server")
	require.ErrorIs(t, <-done, context.DeadlineExceeded)
	sleeping(false, "the statement to end on the server")

	// The URL's own mode wins.
	pool, err = newPool(ctx, poolOptions{url: bouncer.URL() + "&default_query_exec_mode=exec", timeout: 5 * time.Second, pooled: true})
	require.NoError(t, err)
	defer pool.Close()
	require.Equal(t, pgx.QueryExecModeExec, pool.Config().ConnConfig.DefaultQueryExecMode)
}

// Pointed at PgBouncer without LISTEN_DATABASE_URL, a command says what to
// set; SYNCHRONOUS_COMMIT other than on cannot pass a transaction pooler.
func TestPgBouncerMisconfigured(t *testing.T) {
	t.Parallel()
	bouncer := pgbouncertest.Start(t, pgtest.URL())
	schema := pgtest.Schema(t)
	p := start(t, dbEnv(schema, "DATABASE_URL="+bouncer.URL()), "enqueue", "--kind", "noop")
	require.Equal(t, 1, p.wait(t, 30*time.Second))
	require.Contains(t, p.stderr.String(), "unsupported startup parameter")
	require.Contains(t, p.stderr.String(), "set LISTEN_DATABASE_URL to PostgreSQL itself")

	// LISTEN_DATABASE_URL must not lead to a proxy itself: migrate says so.
	other := pgbouncertest.Start(t, pgtest.URL())
	p = start(t, dbEnv(schema, "DATABASE_URL="+bouncer.URL(), "LISTEN_DATABASE_URL="+other.URL()), "migrate")
	require.Equal(t, 1, p.wait(t, 30*time.Second))
	require.Contains(t, p.stderr.String(), "LISTEN_DATABASE_URL leads to a proxy such as PgBouncer, and it must lead to PostgreSQL itself")

	p = start(t, dbEnv(schema, "DATABASE_URL="+bouncer.URL(), "LISTEN_DATABASE_URL="+pgtest.URL(), "SYNCHRONOUS_COMMIT=off"), "run")
	require.Equal(t, 1, p.wait(t, 30*time.Second))
	require.Contains(t, p.stderr.String(), "SYNCHRONOUS_COMMIT=off cannot reach the server through the transaction pooler")
}

func TestBehindPooler(t *testing.T) {
	t.Parallel()
	const direct = "postgres://app@db:5432/app"
	for _, tc := range []struct {
		db, listen string
		want       bool
	}{
		{direct, "", false},
		{direct, direct, false},
		{direct, "postgres://other@db/app?application_name=x", false}, // the same server
		{"postgres://app@pgbouncer:6432/app", direct, true},
		{"postgres://app@db:6432/app", direct, true},
		{"host=pgbouncer port=5432 user=app", direct, true},
	} {
		require.Equal(t, tc.want, pgdispatch.BehindPooler(tc.db, tc.listen), "%s, %s", tc.db, tc.listen)
	}
}
