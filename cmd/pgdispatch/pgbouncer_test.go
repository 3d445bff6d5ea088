package main

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgbouncertest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

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
