package migrations_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/pgdispatch/pgdispatch/internal/pgtest"
	"github.com/pgdispatch/pgdispatch/migrations"
)

func TestMain(m *testing.M) { pgtest.MainNoLeaks(m) }

func TestMigrateIsIdempotentAndConcurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.EmptySchemaName(t)
	_, err := migrations.Check(ctx, pgtest.Pool(t), schema)
	require.ErrorIs(t, err, migrations.ErrSchemaMissing)

	var g errgroup.Group
	for range 3 {
		g.Go(func() error {
			_, to, err := migrations.Migrate(ctx, pgtest.Pool(t), migrations.Config{Schema: schema})
			if err == nil && to != migrations.Latest() {
				t.Errorf("migrated to %d, want %d", to, migrations.Latest())
			}
			return err
		})
	}
	require.NoError(t, g.Wait())
	v, err := migrations.Check(ctx, pgtest.Pool(t), schema)
	require.NoError(t, err)
	require.Equal(t, migrations.Latest(), v)

	from, to, err := migrations.Migrate(ctx, pgtest.Pool(t), migrations.Config{Schema: schema})
	require.NoError(t, err)
	require.Equal(t, migrations.Latest(), from)
	require.Equal(t, migrations.Latest(), to)
}

func TestCheckOutdated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.Schema(t)
	version := pgx.Identifier{schema, "schema_version"}.Sanitize()
	_, err := pgtest.Pool(t).Exec(ctx, "UPDATE "+version+" SET version = version - 1")
	require.NoError(t, err)
	_, err = migrations.Check(ctx, pgtest.Pool(t), schema)
	require.ErrorIs(t, err, migrations.ErrSchemaOutdated)
	require.ErrorContains(t, err, fmt.Sprintf("is at version %d, this binary needs %d", migrations.Latest()-1, migrations.Latest()))

	// A newer schema is accepted, for rolling upgrades.
	_, err = pgtest.Pool(t).Exec(ctx, "UPDATE "+version+" SET version = $1", migrations.Latest()+1)
	require.NoError(t, err)
	_, err = migrations.Check(ctx, pgtest.Pool(t), schema)
	require.NoError(t, err)
}

// A schema name that needs quoting works: identifiers are quoted, never
// formatted in.
func TestQuotedSchemaName(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.EmptySchemaName(t) + ` "odd" name; DROP TABLE x`
	t.Cleanup(func() {
		_, _ = pgtest.Pool(t).Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	_, _, err := migrations.Migrate(ctx, pgtest.Pool(t), migrations.Config{Schema: schema})
	require.NoError(t, err)
	var id int64
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "SELECT "+pgx.Identifier{schema, "enqueue"}.Sanitize()+"('noop')").Scan(&id))
	require.Positive(t, id)
}

// DDL runs under lock_timeout: a migration that meets a held lock fails fast
// with a clear message instead of queueing the application's writers behind it.
func TestMigrateFailsFastOnHeldLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.Schema(t)
	tx, err := pgtest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{schema, "schema_version"}.Sanitize()+" IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)

	start := time.Now()
	_, _, err = migrations.Migrate(ctx, pgtest.Pool(t), migrations.Config{Schema: schema, LockTimeout: 200 * time.Millisecond})
	require.Error(t, err)
	require.Less(t, time.Since(start), 5*time.Second)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "55P03", pgErr.Code)
	require.Contains(t, err.Error(), "a lock was held too long")
}

func TestTableConstraints(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.Schema(t)
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	for _, tc := range []struct{ sql, constraint string }{
		{"INSERT INTO " + jobs + " (kind, max_attempts) VALUES ('noop', -1)", "jobs_max_attempts_check"},
		{"INSERT INTO " + jobs + " (kind) VALUES ('')", "jobs_kind_check"},
		{"INSERT INTO " + jobs + " (kind, status) VALUES ('noop', 'finished')", "jobs_status_check"},
		{"INSERT INTO " + jobs + " (kind, queue) VALUES ('noop', '')", "jobs_queue_check"},
	} {
		_, err := pgtest.Pool(t).Exec(ctx, tc.sql)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, tc.sql)
		require.Equal(t, tc.constraint, pgErr.ConstraintName)
	}
}

// Migration 5 refuses infinite run_at values and repairs the rows that have
// one: a pending job due at infinity is dead with a reason; the others take
// their created_at.
func TestFiniteRunAt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.Schema(t)
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	_, err := pgtest.Pool(t).Exec(ctx, "INSERT INTO "+jobs+" (kind, run_at) VALUES ('noop', 'infinity')")
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "jobs_run_at_check", pgErr.ConstraintName)

	// As a schema at version 4 with such rows would be.
	_, err = pgtest.Pool(t).Exec(ctx, "ALTER TABLE "+jobs+" DROP CONSTRAINT jobs_run_at_check")
	require.NoError(t, err)
	_, err = pgtest.Pool(t).Exec(ctx, "INSERT INTO "+jobs+" (kind, run_at, status, finished_at) VALUES "+
		"('never', 'infinity', 'pending', NULL), ('due', '-infinity', 'pending', NULL), ('old', 'infinity', 'done', now())")
	require.NoError(t, err)
	_, err = pgtest.Pool(t).Exec(ctx, "UPDATE "+pgx.Identifier{schema, "schema_version"}.Sanitize()+" SET version = 4")
	require.NoError(t, err)
	from, _, err := migrations.Migrate(ctx, pgtest.Pool(t), migrations.Config{Schema: schema})
	require.NoError(t, err)
	require.Equal(t, int32(4), from)

	rows, err := pgtest.Pool(t).Query(ctx, "SELECT kind, status, run_at = created_at, coalesce(last_error, '') FROM "+jobs+" ORDER BY kind")
	require.NoError(t, err)
	type row struct {
		kind, status string
		created      bool
		lastErr      string
	}
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		return x, r.Scan(&x.kind, &x.status, &x.created, &x.lastErr)
	})
	require.NoError(t, err)
	require.Equal(t, []row{
		{"due", "pending", true, ""},
		{"never", "dead", true, "run_at was infinity, a time that never comes; pgdispatch now refuses it at INSERT"},
		{"old", "done", true, ""},
	}, got)
	_, err = pgtest.Pool(t).Exec(ctx, "INSERT INTO "+jobs+" (kind, run_at) VALUES ('noop', '-infinity')")
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "jobs_run_at_check", pgErr.ConstraintName)
}

// A schema name holding $$ would end the functions' $$-quoted bodies: it is
// refused with a reason before anything is created.
func TestMigrateRefusesDollarQuoteInSchemaName(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.EmptySchemaName(t) + "$$x"
	_, _, err := migrations.Migrate(ctx, pgtest.Pool(t), migrations.Config{Schema: schema})
	require.ErrorContains(t, err, `contains "$$"`)
	var exists bool
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)", schema).Scan(&exists))
	require.False(t, exists)
}

// The wake-up triggers, against sleepers simulated by a session holding the
// sleep keys of queues a and c: a transaction that inserts rows of a and b,
// several at once and one by one, and a done row of c, notifies a once (c's
// row is not pending, and b has no sleeper); an update that makes a row of a
// pending again notifies a; with the keys free, nothing notifies.
func TestTriggersNotifyOnlySleepers(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schema := pgtest.Schema(t)
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	channel := pgx.Identifier{schema}.Sanitize()
	sleeper, listener, writer := pgtest.Conn(t), pgtest.Conn(t), pgtest.Conn(t)
	const key = `SELECT pg_advisory_lock($1::int4, hashtext(q)) FROM unnest($2::text[]) q`
	_, err := sleeper.Exec(ctx, key, migrations.SleepKey(schema), []string{"a", "c"})
	require.NoError(t, err)
	_, err = listener.Exec(ctx, "LISTEN "+channel)
	require.NoError(t, err)

	// received returns the payloads notified on the schema's channel up to
	// the marker, which is sent after everything else.
	received := func() []string {
		t.Helper()
		_, err := writer.Exec(ctx, "SELECT pg_notify($1, 'marker')", schema)
		require.NoError(t, err)
		var got []string
		for {
			n, err := listener.WaitForNotification(ctx)
			require.NoError(t, err)
			if n.Payload == "marker" {
				return got
			}
			got = append(got, n.Payload)
		}
	}

	tx, err := writer.Begin(ctx)
	require.NoError(t, err)
	for _, sql := range []string{
		"INSERT INTO " + jobs + " (queue, kind) SELECT q, 'noop' FROM unnest('{a,b,a,b,a}'::text[]) q",
		"INSERT INTO " + jobs + " (queue, kind) VALUES ('b', 'noop')",
		"INSERT INTO " + jobs + " (queue, kind) VALUES ('a', 'noop')",
		"INSERT INTO " + jobs + " (queue, kind, status) VALUES ('c', 'noop', 'done')",
	} {
		_, err := tx.Exec(ctx, sql)
		require.NoError(t, err)
	}
	// Notified once per queue and transaction: the function records it.
	var notified string
	require.NoError(t, tx.QueryRow(ctx, "SELECT current_setting('pgdispatch.notified')").Scan(&notified))
	require.Equal(t, schema+"/a", notified)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, []string{"a"}, received())

	_, err = writer.Exec(ctx, "UPDATE "+jobs+" SET status = 'dead' WHERE queue = 'a'")
	require.NoError(t, err)
	require.Empty(t, received())
	_, err = writer.Exec(ctx, "UPDATE "+jobs+" SET status = 'pending' WHERE queue = 'a'")
	require.NoError(t, err)
	require.Equal(t, []string{"a"}, received())

	_, err = sleeper.Exec(ctx, "SELECT pg_advisory_unlock_all()")
	require.NoError(t, err)
	_, err = writer.Exec(ctx, "INSERT INTO "+jobs+" (queue, kind) SELECT q, 'noop' FROM unnest('{a,b,c}'::text[]) q")
	require.NoError(t, err)
	require.Empty(t, received())
}

// The sleep key's schema half is part of the protocol between the triggers a
// migration wrote and every worker build that sleeps on the schema: it must
// not change from build to build. The expected value is FNV-1a (32 bits) of
// "pgdispatch.sleep/pgdispatch", computed independently.
func TestSleepKeyIsStable(t *testing.T) {
	require.Equal(t, int32(1922186763), migrations.SleepKey("pgdispatch"))
	require.NotEqual(t, migrations.SleepKey("pgdispatch"), migrations.SleepKey("pgdispatch2"))
}
