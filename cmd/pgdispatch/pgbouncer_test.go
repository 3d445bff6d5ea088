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

// The commands as a user behind a default PgBouncer 1.18 in transaction
// pooling mode runs them: DATABASE_URL through it, LISTEN_DATABASE_URL
// straight to PostgreSQL. migrate and run --migrate take their session lock
// over the direct connection; run, enqueue, stats and jobs work through the
// pooler.
func TestPgBouncerCommands(t *testing.T) {
	t.Parallel()
	bouncer := pgbouncertest.Start(t, pgtest.URL())
	schema := pgtest.EmptySchemaName(t)
	e := dbEnv(schema, "DATABASE_URL="+bouncer.URL(), "LISTEN_DATABASE_URL="+pgtest.URL(),
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

	id, err := strconv.ParseInt(strings.TrimSpace(run("enqueue", "--kind", "noop", "--payload", `{"n": [1, 2]}`)), 10, 64)
	require.NoError(t, err)
	s := w.Status(t, id, "done", 30*time.Second)
	require.Equal(t, 1, s.Attempts)
	require.Regexp(t, `(?m)^\s*default\s+noop\s`, run("stats"))
	require.Regexp(t, `(?m)^status\s+done$`, run("jobs", "show", strconv.FormatInt(id, 10)))

	// A dispatch trigger added through the pooler, fired by a write through it.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	table := pgx.Identifier{schema, "orders"}.Sanitize()
	_, err = pgtest.Pool(t).Exec(ctx, "CREATE TABLE "+table+" (id int PRIMARY KEY)")
	require.NoError(t, err)
	require.Contains(t, run("triggers", "add", "--table", table, "--kind", "noop", "--name", "orders_new"), "trigger orders_new added")
	writer, err := pgx.Connect(ctx, bouncer.URL()+"&default_query_exec_mode=cache_describe")
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
	require.Equal(t, 1, retry.wait(t, time.Minute), "a retry that changed nothing fails") // and yet it ran behind the pooler:
	require.Contains(t, retry.stdout.String(), "left as it is: done")

	// bench measures PostgreSQL: it connects past the pooler.
	b := start(t, e, "bench", "--json", "--scenario", "latency", "--jobs", "5", "--spacing", "1ms")
	require.Equal(t, 0, b.wait(t, time.Minute), b.stderr.String())
	require.Contains(t, b.stderr.String(), "bench connects to LISTEN_DATABASE_URL")
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
	pool, err := newPool(ctx, bouncer.URL(), "DATABASE_URL", pgdispatch.PoolConfig{
		StatementTimeout: 5 * time.Second, ListenURL: pgtest.URL(), SynchronousCommit: "on",
	})
	require.NoError(t, err)
	defer pool.Close()
	cfg := pool.Config().ConnConfig
	require.Equal(t, pgx.QueryExecModeCacheDescribe, cfg.DefaultQueryExecMode)
	require.Equal(t, map[string]string{"application_name": "pgdispatch"}, cfg.RuntimeParams, "no other startup parameter")

	sleeping := func(want bool) func() bool {
		return func() bool {
			var n int
			if err := pgtest.Pool(t).QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE state = 'active' AND query = 'SELECT pg_sleep(60)' AND application_name = 'pgdispatch'`).Scan(&n); err != nil {
				t.Error(err)
				return false
			}
			return (n > 0) == want
		}
	}
	callCtx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := pool.Exec(callCtx, "SELECT pg_sleep(60)"); done <- err }()
	require.Eventually(t, sleeping(true), 10*time.Second, 10*time.Millisecond, "the statement runs on the server")
	require.ErrorIs(t, <-done, context.DeadlineExceeded)
	require.Eventually(t, sleeping(false), 10*time.Second, 10*time.Millisecond, "the statement still runs on the server")

	// The URL's own mode wins.
	pool, err = newPool(ctx, bouncer.URL()+"&default_query_exec_mode=exec", "DATABASE_URL", pgdispatch.PoolConfig{StatementTimeout: 5 * time.Second, ListenURL: pgtest.URL()})
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
	require.Contains(t, p.stderr.String(), "LISTEN_DATABASE_URL, leads to a proxy such as PgBouncer, and it must lead to PostgreSQL itself")

	p = start(t, dbEnv(schema, "DATABASE_URL="+bouncer.URL(), "LISTEN_DATABASE_URL="+pgtest.URL(), "SYNCHRONOUS_COMMIT=off"), "run")
	require.Equal(t, 1, p.wait(t, 30*time.Second))
	require.Contains(t, p.stderr.String(), "synchronous_commit=off cannot reach the server through the transaction pooler")
}
