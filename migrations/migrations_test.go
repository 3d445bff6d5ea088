package migrations_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/timing"
	"github.com/pgdispatch/pgdispatch/internal/testkit/wait"
	"github.com/pgdispatch/pgdispatch/migrations"
	"github.com/pgdispatch/pgdispatch/schedule"
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

// A migrator waits for another one's whole run, however long it takes,
// within Config.Timeout: LockTimeout bounds the DDL statements alone. Here
// another session holds the migration lock (as a migrator building an index
// on a large table would) until the waiting migrator has waited four times
// its LockTimeout, by the server's clock.
func TestMigrateWaitsForAnotherMigratorPastTheLockTimeout(t *testing.T) {
	t.Parallel()
	// The schema's own lock, and tern's, which a migrator of any schema of
	// the database holds through its run.
	for _, lock := range []struct{ name, lock, unlock, where string }{
		{
			"this schema's", "SELECT pg_advisory_lock(hashtext('pgdispatch.migrate'), hashtext($1))",
			"SELECT pg_advisory_unlock(hashtext('pgdispatch.migrate'), hashtext($1))",
			"classid = hashtext('pgdispatch.migrate')::oid AND objid = hashtext($1)::oid",
		},
		{
			"the database's", "SELECT pg_advisory_lock(9628173550095224) WHERE $1 <> ''",
			"SELECT pg_advisory_unlock(9628173550095224) WHERE $1 <> ''",
			"classid = (9628173550095224 >> 32)::oid AND objid = (9628173550095224 & 4294967295)::oid AND objsubid = 1 AND $1 <> ''",
		},
	} {
		t.Run(lock.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			schema := pgtest.EmptySchemaName(t)
			holder, err := pgtest.Pool(t).Acquire(ctx)
			require.NoError(t, err)
			defer holder.Release()
			_, err = holder.Exec(ctx, lock.lock, schema)
			require.NoError(t, err)
			unlocked := false
			defer func() {
				if !unlocked {
					_, _ = holder.Exec(context.WithoutCancel(ctx), lock.unlock, schema)
				}
			}()

			const lockTimeout = 100 * time.Millisecond
			done := make(chan error, 1)
			go func() {
				_, _, err := migrations.Migrate(ctx, pgtest.Pool(t), migrations.Config{Schema: schema, LockTimeout: lockTimeout})
				done <- err
			}()
			wait.For(t, 30*time.Second, "the migrator to have waited four times its lock timeout for the migration lock", func() bool {
				var waited bool
				err := pgtest.Pool(t).QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_catalog.pg_locks
					WHERE locktype = 'advisory' AND `+lock.where+`
					  AND NOT granted AND waitstart < clock_timestamp() - make_interval(secs => $2))`,
					schema, 4*lockTimeout.Seconds()).Scan(&waited)
				select {
				case err := <-done:
					require.Fail(t, "the migrator ended while the lock was held", "%v", err)
				default:
				}
				return err == nil && waited
			})
			_, err = holder.Exec(ctx, lock.unlock, schema)
			require.NoError(t, err)
			unlocked = true
			require.NoError(t, <-done)
			v, err := migrations.Check(ctx, pgtest.Pool(t), schema)
			require.NoError(t, err)
			require.Equal(t, migrations.Latest(), v)
		})
	}
}

func TestCheckOutdated(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.FreshSchema(t)
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

	// The migration's pool waits on a lock until its context ends: a lock
	// timeout is the migration's own.
	migrateCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	start := time.Now()
	_, _, err = migrations.Migrate(migrateCtx, pgtest.LockWaitingPool(t), migrations.Config{Schema: schema, LockTimeout: 200 * time.Millisecond})
	require.Error(t, err)
	timing.Below(t, "the migration's failure", time.Since(start), 5*time.Second)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "55P03", pgErr.Code)
	require.Contains(t, err.Error(), "a lock was held too long")
}

func TestTableConstraints(t *testing.T) {
	t.Parallel()
	tx, schema := pgtest.Tx(t)
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	for _, tc := range []struct{ sql, constraint string }{
		{"INSERT INTO " + jobs + " (kind, max_attempts) VALUES ('noop', -1)", "jobs_max_attempts_check"},
		{"INSERT INTO " + jobs + " (kind) VALUES ('')", "jobs_kind_check"},
		{"INSERT INTO " + jobs + " (kind, status) VALUES ('noop', 'finished')", "jobs_status_check"},
		{"INSERT INTO " + jobs + " (kind, queue) VALUES ('noop', '')", "jobs_queue_check"},
	} {
		err := pgtest.Try(t, tx, tc.sql)
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
	schema := pgtest.FreshSchema(t)
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

// A schema's channel is its name: a schema named as the channel every
// schema's workers hear operators' controls on would share it.
func TestMigrateRefusesTheControlChannelAsSchemaName(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Cleanup(func() { _, _ = pgtest.Pool(t).Exec(ctx, `DROP SCHEMA IF EXISTS "pgdispatch.control" CASCADE`) })
	_, _, err := migrations.Migrate(ctx, pgtest.Pool(t), migrations.Config{Schema: "pgdispatch.control"})
	require.ErrorContains(t, err, "control channel")
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

// pgErrorOf returns the *pgconn.PgError in err, failing the test without one.
func pgErrorOf(t *testing.T, err error, msgAndArgs ...any) *pgconn.PgError {
	t.Helper()
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, msgAndArgs...)
	return pgErr
}

// Migration 8 refuses at INSERT, by a constraint that names the column,
// each value a claim, the sweeper or an admin command cannot handle.
func TestLimitsRefuseHostileRows(t *testing.T) {
	t.Parallel()
	tx, schema := pgtest.Tx(t)
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	for _, tc := range []struct {
		columns, values, constraint string
	}{
		{"kind, attempts", "'noop', 2147483647", "jobs_attempts_check"},
		{"kind, attempts", "'noop', 1000001", "jobs_attempts_check"},
		{"kind, attempts", "'noop', -1", "jobs_attempts_check"},
		{"kind, max_attempts", "'noop', 2147483647", "jobs_max_attempts_check"},
		{"kind, max_attempts", "'noop', 0", "jobs_max_attempts_check"},
		{"kind", "repeat('k', 129)", "jobs_kind_check"},
		{"kind, queue", "'noop', repeat('q', 129)", "jobs_queue_check"},
		{"kind, queue", "'noop', repeat('q', 10000)", "jobs_queue_check"},
		{"kind, run_at", "'noop', '9999-01-01 00:00:00+00'", "jobs_run_at_check"},
		{"kind, run_at", "'noop', '294276-12-31 00:00:00+00'", "jobs_run_at_check"},
		{"kind, run_at", "'noop', '0001-12-31 23:59:59+00 BC'", "jobs_run_at_check"},
		{"kind, run_at", "'noop', '4713-01-01 00:00:00+00 BC'", "jobs_run_at_check"},
		{"kind, run_at", "'noop', 'infinity'", "jobs_run_at_check"},
		{"kind, dedup_key", "'noop', repeat('d', 513)", "jobs_dedup_key_check"},
		{"kind, payload", "'noop', jsonb_build_object('a', repeat('a', 1048576))", "jobs_payload_size_check"},
	} {
		sql := "INSERT INTO " + jobs + " (" + tc.columns + ") VALUES (" + tc.values + ")"
		err := pgtest.Try(t, tx, sql)
		pgErr := pgErrorOf(t, err, sql)
		require.Equal(t, "23514", pgErr.Code, sql) // check_violation
		require.Equal(t, tc.constraint, pgErr.ConstraintName, sql)
	}
}

// The limits are the package's constants: a row at each of them is
// accepted, one past it refused. Names and keys count characters, and a
// key of DedupKeyLimit four-byte characters still fits its index.
func TestLimitsAreTheConstants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tx, schema := pgtest.Tx(t)
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	// The size of {"a": ""}, so that {"a": repeat('x', n)} is n bytes more.
	var overhead int
	require.NoError(t, tx.QueryRow(ctx, `SELECT pg_column_size('{"a": ""}'::jsonb)`).Scan(&overhead))
	payload := func(size int) string { return `{"a": "` + strings.Repeat("x", size-overhead) + `"}` }
	wide := func(n int) string { return strings.Repeat("é😀", n/2) } // 2 and 4 bytes a character

	for _, tc := range []struct {
		column     string
		at, past   any
		constraint string
	}{
		{"attempts", migrations.AttemptsLimit, migrations.AttemptsLimit + 1, "jobs_attempts_check"},
		{"max_attempts", migrations.AttemptsLimit, migrations.AttemptsLimit + 1, "jobs_max_attempts_check"},
		{"queue", wide(migrations.NameLimit), wide(migrations.NameLimit) + "q", "jobs_queue_check"},
		{"dedup_key", wide(migrations.DedupKeyLimit), wide(migrations.DedupKeyLimit) + "d", "jobs_dedup_key_check"},
		{"run_at", migrations.RunAtEnd.Add(-time.Microsecond), migrations.RunAtEnd, "jobs_run_at_check"},
		{"run_at", migrations.RunAtMin, migrations.RunAtMin.Add(-time.Microsecond), "jobs_run_at_check"},
		{"payload", payload(migrations.PayloadLimit), payload(migrations.PayloadLimit + 1), "jobs_payload_size_check"},
	} {
		sql := "INSERT INTO " + jobs + " (kind, " + tc.column + ") VALUES ('noop', $1)"
		require.NoError(t, pgtest.Try(t, tx, sql, tc.at), "%s at its limit", tc.column)
		err := pgtest.Try(t, tx, sql, tc.past)
		require.Equal(t, tc.constraint, pgErrorOf(t, err, tc.column).ConstraintName)
	}
	require.NoError(t, pgtest.Try(t, tx, "INSERT INTO "+jobs+" (kind) VALUES ($1)", wide(migrations.NameLimit)))
	err := pgtest.Try(t, tx, "INSERT INTO "+jobs+" (kind) VALUES ($1)", wide(migrations.NameLimit)+"k")
	require.Equal(t, "jobs_kind_check", pgErrorOf(t, err).ConstraintName)
}

// The payload limit holds for values that arrive compressed, as a value
// read from a table does (here a temporary table of the writer's own):
// pg_column_size of 40 MB of one letter, so stored, is under 1 MiB. And an
// UPDATE of another column of a row whose payload is stored compressed
// passes, as every claim and completion is such an UPDATE.
func TestPayloadLimitSeesCompressedValues(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tx, schema := pgtest.Tx(t)
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()

	// Built by the INSERT, uncompressed: the CHECK refuses it.
	err := pgtest.Try(t, tx, "INSERT INTO "+jobs+" (kind, payload) VALUES ('noop', jsonb_build_object('a', repeat('a', 40000000)))")
	require.Equal(t, "jobs_payload_size_check", pgErrorOf(t, err).ConstraintName)

	_, err = tx.Exec(ctx, `CREATE TEMP TABLE src (name text, p jsonb);
		INSERT INTO src VALUES ('huge', jsonb_build_object('a', repeat('a', 40000000))),
		                       ('fine', jsonb_build_object('a', repeat('b', 800000)))`)
	require.NoError(t, err)
	var stored, raw int
	require.NoError(t, tx.QueryRow(ctx, "SELECT pg_column_size(p), octet_length(p::text) FROM src WHERE name = 'huge'").Scan(&stored, &raw))
	require.Less(t, stored, migrations.PayloadLimit, "stored compressed")
	require.Greater(t, raw, 40000000)

	err = pgtest.Try(t, tx, "INSERT INTO "+jobs+" (kind, payload) SELECT 'noop', p FROM src WHERE name = 'huge'")
	pgErr := pgErrorOf(t, err)
	require.Equal(t, "23514", pgErr.Code)
	require.Equal(t, "jobs_payload_size_check", pgErr.ConstraintName)
	require.Contains(t, pgErr.Detail, "40000017 bytes decompressed")

	var id int64
	require.NoError(t, tx.QueryRow(ctx, "INSERT INTO "+jobs+" (kind, payload) SELECT 'noop', p FROM src WHERE name = 'fine' RETURNING id").Scan(&id))
	require.NoError(t, tx.QueryRow(ctx, "SELECT pg_column_size(payload) FROM "+jobs+" WHERE id = $1", id).Scan(&stored))
	require.Less(t, stored, 100000, "the payload is stored compressed")
	for _, sql := range []string{
		"UPDATE " + jobs + " SET status = 'running', attempts = attempts + 1 WHERE id = $1",
		"UPDATE " + jobs + " SET status = 'pending', payload = payload WHERE id = $1",
	} {
		tag, err := tx.Exec(ctx, sql, id)
		require.NoError(t, err, sql)
		require.Equal(t, int64(1), tag.RowsAffected())
	}
}

// A schema of version 7 that holds rows the limits refuse migrates: each
// row is repaired so that every constraint holds (and is validated), and a
// pending job that could never run as it was is dead with the reason.
func TestHardeningRepairsOldRows(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schema := pgtest.EmptySchemaName(t)
	_, to, err := migrations.MigrateTo(ctx, pgtest.Pool(t), migrations.Config{Schema: schema}, 7)
	require.NoError(t, err)
	require.Equal(t, int32(7), to)
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	_, err = pgtest.Pool(t).Exec(ctx, "INSERT INTO "+jobs+` (kind, status, attempts, max_attempts, queue, run_at, dedup_key, payload) VALUES
		('huge_attempts', 'pending', 2147483647, 2147483647, 'default', now(), NULL, '{}'),
		('forever', 'pending', 0, 2147483647, 'default', now(), NULL, '{}'),
		('far', 'pending', 0, NULL, 'default', '294276-01-01', NULL, '{}'),
		('past', 'pending', 0, NULL, 'default', '4713-01-01 BC', NULL, '{}'),
		('long_queue', 'pending', 0, NULL, repeat('q', 9000), now(), NULL, '{}'),
		('long_key', 'pending', 0, NULL, 'default', now(), repeat('k', 600), '{}'),
		('big', 'pending', 0, NULL, 'default', now(), NULL, jsonb_build_object('a', repeat('a', 40000000))),
		('big_done', 'done', 0, NULL, 'default', now(), NULL, jsonb_build_object('a', repeat('a', 40000000))),
		('fine', 'pending', 3, 10, 'default', now(), 'kept', '{"a": 1}')`)
	require.NoError(t, err)

	from, to, err := migrations.Migrate(ctx, pgtest.Pool(t), migrations.Config{Schema: schema})
	require.NoError(t, err)
	require.Equal(t, int32(7), from)
	require.Equal(t, migrations.Latest(), to)

	type row struct {
		Status       string
		Attempts     int32
		MaxAttempts  *int32
		QueueLen     int
		RunAtMoved   bool
		DedupKey     *string
		PayloadBytes int
		LastError    string
	}
	rows, err := pgtest.Pool(t).Query(ctx, `SELECT kind, status, attempts, max_attempts, char_length(queue),
		run_at > now() - interval '1 minute' AND run_at < now() + interval '1 minute' AND kind IN ('far', 'past'),
		dedup_key, octet_length(payload::text), coalesce(last_error, '') FROM `+jobs)
	require.NoError(t, err)
	got := map[string]row{}
	var kind string
	var r row
	_, err = pgx.ForEachRow(rows, []any{&kind, &r.Status, &r.Attempts, &r.MaxAttempts, &r.QueueLen, &r.RunAtMoved, &r.DedupKey, &r.PayloadBytes, &r.LastError}, func() error {
		got[kind] = r
		return nil
	})
	require.NoError(t, err)
	million := int32(migrations.AttemptsLimit)
	removed := len(`{"pgdispatch_payload_removed": "the payload was over the limit of 1 MiB (migration 008)"}`)
	refused := "; pgdispatch refuses such a job at INSERT since migration 008"
	require.Equal(t, map[string]row{
		"huge_attempts": {"dead", million, &million, 7, false, nil, 2, "attempts was 2147483647" + refused},
		"forever":       {"pending", 0, &million, 7, false, nil, 2, ""},
		"far":           {"dead", 0, nil, 7, true, nil, 2, "run_at was 294276-01-01 00:00:00+00, a time that never comes" + refused},
		"past":          {"pending", 0, nil, 7, true, nil, 2, ""},
		"long_queue":    {"dead", 0, nil, 128, false, nil, 2, "queue was 9000 characters long" + refused},
		"long_key":      {"pending", 0, nil, 7, false, nil, 2, ""},
		"big":           {"dead", 0, nil, 7, false, nil, removed, "payload was 40000017 bytes" + refused},
		"big_done":      {"done", 0, nil, 7, false, nil, 40000009, ""}, // finished: a claim never loads it
		"fine":          {"pending", 3, ptr(int32(10)), 7, false, ptr("kept"), 8, ""},
	}, got)

	var invalid []string
	rows, err = pgtest.Pool(t).Query(ctx, "SELECT conname FROM pg_constraint WHERE conrelid = $1::regclass AND NOT convalidated", jobs)
	require.NoError(t, err)
	invalid, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Empty(t, invalid, "every constraint is validated")
}

func ptr[T any](v T) *T { return &v }

// A queue name too long for a NOTIFY payload is refused by its constraint,
// even while a worker sleeps on a queue of the same hash: the wake-up
// trigger, which runs first, leaves it alone instead of failing in
// pg_notify ("payload string too long").
func TestLongQueueRefusedByItsConstraint(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schema := pgtest.Schema(t)
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	queue := strings.Repeat("q", 9000)
	sleeper := pgtest.Conn(t)
	_, err := sleeper.Exec(ctx, "SELECT pg_advisory_lock($1::int4, hashtext($2))", migrations.SleepKey(schema), queue)
	require.NoError(t, err)
	_, err = pgtest.Pool(t).Exec(ctx, "INSERT INTO "+jobs+" (kind, queue) VALUES ('noop', $1)", queue)
	require.Equal(t, "jobs_queue_check", pgErrorOf(t, err).ConstraintName, "%v", err)
}

// enqueue() runs with its owner's rights from migration 8 on, so EXECUTE
// is no longer everyone's: it goes to each role that could insert into the
// table when the migration ran (by a grant on the table or on its columns),
// so that existing writers keep calling it, and to no other.
func TestEnqueueExecuteFollowsInsert(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schema := pgtest.EmptySchemaName(t)
	_, _, err := migrations.MigrateTo(ctx, pgtest.Pool(t), migrations.Config{Schema: schema}, 7)
	require.NoError(t, err)
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	suffix := strings.TrimPrefix(schema, "pgdt_")
	table, columns, none := "pgdt_t_"+suffix, "pgdt_c_"+suffix, "pgdt_n_"+suffix
	for _, role := range []string{table, columns, none} {
		id := pgx.Identifier{role}.Sanitize()
		_, err := pgtest.Pool(t).Exec(ctx, "CREATE ROLE "+id+" NOLOGIN")
		require.NoError(t, err)
		t.Cleanup(func() {
			_, err := pgtest.Pool(t).Exec(context.Background(), "DROP OWNED BY "+id+"; DROP ROLE "+id)
			require.NoError(t, err)
		})
	}
	_, err = pgtest.Pool(t).Exec(ctx, "GRANT INSERT ON "+jobs+" TO "+pgx.Identifier{table}.Sanitize()+"; "+
		"GRANT INSERT (kind, payload) ON "+jobs+" TO "+pgx.Identifier{columns}.Sanitize())
	require.NoError(t, err)
	_, _, err = migrations.Migrate(ctx, pgtest.Pool(t), migrations.Config{Schema: schema})
	require.NoError(t, err)

	for role, want := range map[string]bool{table: true, columns: true, none: false, "public": false} {
		for _, fn := range []string{"enqueue", "enqueue_checked"} {
			var can bool
			require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "SELECT has_function_privilege($1, $2, 'EXECUTE')", role,
				pgx.Identifier{schema, fn}.Sanitize()+"(text, jsonb, text, timestamptz, smallint, text, integer, text, text, text)").Scan(&can))
			require.Equal(t, want, can, "%s on %s", role, fn)
		}
	}
}

// The schedules table's payload limit is the jobs table's, and holds for
// values that arrive compressed too: 40 MB of one letter read from a table,
// through schedule() or an INSERT, is refused at declaration.
func TestSchedulePayloadLimitSeesCompressedValues(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tx, schema := pgtest.Tx(t)
	schedules := pgx.Identifier{schema, "schedules"}.Sanitize()
	_, err := tx.Exec(ctx, `CREATE TEMP TABLE src (name text, p jsonb);
		INSERT INTO src VALUES ('huge', jsonb_build_object('a', repeat('a', 40000000))),
		                       ('fine', jsonb_build_object('a', repeat('b', 800000)))`)
	require.NoError(t, err)
	for _, sql := range []string{
		"INSERT INTO " + schedules + " (name, cron, kind, payload) SELECT 'big', '@daily', 'noop', p FROM src WHERE name = 'huge'",
		"SELECT " + pgx.Identifier{schema, "schedule"}.Sanitize() + "('big', '@daily', 'noop', (SELECT p FROM src WHERE name = 'huge'))",
		"UPDATE " + schedules + " SET payload = (SELECT p FROM src WHERE name = 'huge') WHERE name = 'fine'",
	} {
		if strings.HasPrefix(sql, "UPDATE") {
			_, err = tx.Exec(ctx, "SELECT "+pgx.Identifier{schema, "schedule"}.Sanitize()+"('fine', '@daily', 'noop', (SELECT p FROM src WHERE name = 'fine'))")
			require.NoError(t, err, "a compressed payload under the limit")
		}
		err = pgtest.Try(t, tx, sql)
		pgErr := pgErrorOf(t, err, sql)
		require.Equal(t, "23514", pgErr.Code, sql)
		require.Equal(t, "schedules_payload_size_check", pgErr.ConstraintName, sql)
		require.Contains(t, pgErr.Detail, "40000017 bytes decompressed", sql)
	}
	// The jobs table's check names its own constraint still.
	err = pgtest.Try(t, tx, "INSERT INTO "+pgx.Identifier{schema, "jobs"}.Sanitize()+" (kind, payload) SELECT 'noop', p FROM src WHERE name = 'huge'")
	require.Equal(t, "jobs_payload_size_check", pgErrorOf(t, err).ConstraintName)
}

// A worker role granted what firing schedules needed before migration 12
// fires them after it, as its own role: the migration grants it EXECUTE on
// fire_schedule_slots() and UPDATE of the new run state. A slot whose key
// a writer inserted before the migration, when keys were not reserved yet,
// creates no job and is shown as taken.
func TestScheduleGrantsCarryOverMigration12(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schema := pgtest.EmptySchemaName(t)
	pool := pgtest.Pool(t)
	_, _, err := migrations.MigrateTo(ctx, pool, migrations.Config{Schema: schema}, 11)
	require.NoError(t, err)
	role := "pgdt_" + strings.ReplaceAll(schema, "pgdt_", "") + "_worker"
	ident, s := pgx.Identifier{role}.Sanitize(), pgx.Identifier{schema}.Sanitize()
	_, err = pool.Exec(ctx, "CREATE ROLE "+ident+" NOLOGIN")
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := pool.Exec(context.Background(), "DROP OWNED BY "+ident+"; DROP ROLE "+ident)
		require.NoError(t, err)
	})
	_, err = pool.Exec(ctx, "GRANT USAGE ON SCHEMA "+s+" TO "+ident+"; "+
		"GRANT SELECT, UPDATE, DELETE ON "+s+".jobs TO "+ident+"; "+
		"GRANT SELECT, UPDATE (next_run_at, last_run_at, runs, missed, caught_up, error) ON "+s+".schedules TO "+ident+"; "+
		"GRANT EXECUTE ON FUNCTION "+s+".insert_scheduled_jobs(bigint[], timestamptz[]) TO "+ident+"; "+
		"SELECT "+s+".schedule('early', NULL, 'noop', every => '1 hour'), "+s+".schedule('late', NULL, 'noop', every => '1 hour'); "+
		"UPDATE "+s+".schedules SET next_run_at = '2030-01-01 00:00:00+00'; "+
		"INSERT INTO "+s+".jobs (kind, payload, dedup_key) VALUES ('noop', '{\"from\": \"a writer\"}', 'schedule:late:2030-01-01T00:00:00Z')")
	require.NoError(t, err)
	_, _, err = migrations.Migrate(ctx, pool, migrations.Config{Schema: schema})
	require.NoError(t, err)

	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["role"] = role
	worker, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer worker.Close()
	sched, err := schedule.New(schedule.Config{
		Pool: worker, Schema: schema,
		Now: func() time.Time { return time.Date(2030, 1, 1, 0, 1, 0, 0, time.UTC) },
	})
	require.NoError(t, err)
	res, err := sched.Pass(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, res.Created)
	require.EqualValues(t, 1, res.Taken)
	rows, _ := pool.Query(ctx, "SELECT name, runs, taken, warning IS NOT NULL FROM "+s+".schedules ORDER BY name")
	type row struct {
		Name        string
		Runs, Taken int64
		Warned      bool
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	require.NoError(t, err)
	require.Equal(t, []row{{"early", 1, 0, false}, {"late", 0, 1, true}}, got)
}

// Migration 015's index, built ahead without holding off writers, as
// docs/operations.md says, is kept; one that a failed concurrent build
// left invalid is built again.
func TestKindIndexBuiltAhead(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := pgtest.Pool(t)
	for _, invalid := range []bool{false, true} {
		schema := pgtest.EmptySchemaName(t)
		_, _, err := migrations.MigrateTo(ctx, pool, migrations.Config{Schema: schema}, 14)
		require.NoError(t, err)
		index := pgx.Identifier{schema, "jobs_kind_idx"}.Sanitize()
		_, err = pool.Exec(ctx, "CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_kind_idx ON "+pgx.Identifier{schema, "jobs"}.Sanitize()+
			" (kind, queue, run_at, id) WHERE status = 'pending'")
		require.NoError(t, err)
		var before uint32
		require.NoError(t, pool.QueryRow(ctx, "SELECT $1::regclass::oid", index).Scan(&before))
		if invalid {
			_, err = pool.Exec(ctx, "UPDATE pg_catalog.pg_index SET indisvalid = false WHERE indexrelid = $1", before)
			require.NoError(t, err)
		}
		_, to, err := migrations.Migrate(ctx, pool, migrations.Config{Schema: schema})
		require.NoError(t, err)
		require.Equal(t, migrations.Latest(), to)
		var (
			after uint32
			valid bool
		)
		require.NoError(t, pool.QueryRow(ctx, "SELECT indexrelid, indisvalid FROM pg_catalog.pg_index WHERE indexrelid = $1::regclass", index).Scan(&after, &valid))
		require.True(t, valid, "invalid before: %v", invalid)
		require.Equal(t, !invalid, after == before, "invalid before: %v: kept if valid, built again if not", invalid)
	}
}

// Roles granted what they needed before migration 16 keep working after
// it, without docs/roles.sql run again: the role that may pause queues
// may declare flow limits and read the keys' state, the role that may
// delete jobs keeps the keys' state, the role that may insert the trace
// context may insert the flow key (a dispatch trigger does, as the
// writer), and add_trigger keeps its privileges.
func TestFlowControlGrantsCarryOverMigration16(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schema := pgtest.EmptySchemaName(t)
	pool := pgtest.Pool(t)
	_, _, err := migrations.MigrateTo(ctx, pool, migrations.Config{Schema: schema}, 15)
	require.NoError(t, err)
	suffix := strings.TrimPrefix(schema, "pgdt_")
	writer, worker, operator := "pgdt_wr_"+suffix, "pgdt_wo_"+suffix, "pgdt_op_"+suffix
	for _, role := range []string{writer, worker, operator} {
		id := pgx.Identifier{role}.Sanitize()
		_, err := pool.Exec(ctx, "CREATE ROLE "+id+" NOLOGIN")
		require.NoError(t, err)
		t.Cleanup(func() {
			_, err := pool.Exec(context.Background(), "DROP OWNED BY "+id+"; DROP ROLE "+id)
			require.NoError(t, err)
		})
	}
	s := pgx.Identifier{schema}.Sanitize()
	_, err = pool.Exec(ctx, "GRANT INSERT (kind, payload, queue, traceparent, tracestate) ON "+s+".jobs TO "+pgx.Identifier{writer}.Sanitize()+"; "+
		"GRANT SELECT, UPDATE, DELETE ON "+s+".jobs TO "+pgx.Identifier{worker}.Sanitize()+"; "+
		"GRANT SELECT, UPDATE ON "+s+".jobs TO "+pgx.Identifier{operator}.Sanitize()+"; "+
		"GRANT EXECUTE ON FUNCTION "+s+".pause_queue(text) TO "+pgx.Identifier{operator}.Sanitize()+"; "+
		"REVOKE ALL ON FUNCTION "+s+".add_trigger(text, text[], text, jsonb, text, text, text, interval) FROM PUBLIC; "+
		"GRANT EXECUTE ON FUNCTION "+s+".add_trigger(text, text[], text, jsonb, text, text, text, interval) TO "+pgx.Identifier{operator}.Sanitize())
	require.NoError(t, err)
	_, _, err = migrations.Migrate(ctx, pool, migrations.Config{Schema: schema})
	require.NoError(t, err)

	type check struct {
		role, sql, object, privilege string
		want                         bool
	}
	setLimit := s + ".set_flow_limit(text, text, integer, boolean, integer, interval)"
	addTrigger := s + ".add_trigger(text, text[], text, jsonb, text, text, text, interval, text)"
	for _, c := range []check{
		{operator, "has_function_privilege", setLimit, "EXECUTE", true},
		{operator, "has_function_privilege", s + ".clear_flow_limit(text, text)", "EXECUTE", true},
		{operator, "has_table_privilege", s + ".flow_limits", "INSERT", true},
		{operator, "has_table_privilege", s + ".flow_keys", "SELECT", true},
		{operator, "has_table_privilege", s + ".flow_keys", "DELETE", false},
		{operator, "has_function_privilege", addTrigger, "EXECUTE", true},
		{"public", "has_function_privilege", addTrigger, "EXECUTE", false},
		{"public", "has_function_privilege", setLimit, "EXECUTE", false},
		{worker, "has_function_privilege", setLimit, "EXECUTE", false},
		{worker, "has_table_privilege", s + ".flow_limits", "SELECT", true},
		{worker, "has_table_privilege", s + ".flow_limits", "INSERT", false},
		{worker, "has_table_privilege", s + ".flow_keys", "INSERT", true},
		{worker, "has_table_privilege", s + ".flow_keys", "UPDATE", true},
		{worker, "has_table_privilege", s + ".flow_keys", "DELETE", true},
		{writer, "has_table_privilege", s + ".flow_keys", "SELECT", false},
	} {
		var got bool
		require.NoError(t, pool.QueryRow(ctx, "SELECT "+c.sql+"($1, $2, $3)", c.role, c.object, c.privilege).Scan(&got))
		require.Equal(t, c.want, got, "%s: %s on %s", c.role, c.privilege, c.object)
	}
	var can bool
	require.NoError(t, pool.QueryRow(ctx, "SELECT has_column_privilege($1, $2, 'flow_key', 'INSERT')", writer, s+".jobs").Scan(&can))
	require.True(t, can, "the writer inserts the flow key")
}

// Migration 16's indexes, built ahead without holding off writers, as its
// comment says, are kept; one that a failed concurrent build left invalid
// is built again.
func TestFlowIndexesBuiltAhead(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := pgtest.Pool(t)
	schema := pgtest.EmptySchemaName(t)
	_, _, err := migrations.MigrateTo(ctx, pool, migrations.Config{Schema: schema}, 15)
	require.NoError(t, err)
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	_, err = pool.Exec(ctx, "ALTER TABLE "+jobs+" ADD COLUMN IF NOT EXISTS flow_key text")
	require.NoError(t, err)
	before := map[string]uint32{}
	for name, ddl := range map[string]string{
		"jobs_flow_pending_idx": " (queue, flow_key, priority, run_at, id) WHERE status = 'pending' AND flow_key IS NOT NULL",
		"jobs_flow_running_idx": " (queue, flow_key) WHERE status = 'running' AND flow_key IS NOT NULL",
	} {
		_, err = pool.Exec(ctx, "CREATE INDEX CONCURRENTLY "+name+" ON "+jobs+ddl)
		require.NoError(t, err)
		var oid uint32
		require.NoError(t, pool.QueryRow(ctx, "SELECT $1::regclass::oid", pgx.Identifier{schema, name}.Sanitize()).Scan(&oid))
		before[name] = oid
	}
	_, err = pool.Exec(ctx, "UPDATE pg_catalog.pg_index SET indisvalid = false WHERE indexrelid = $1", before["jobs_flow_running_idx"])
	require.NoError(t, err)
	_, _, err = migrations.Migrate(ctx, pool, migrations.Config{Schema: schema})
	require.NoError(t, err)
	for name, invalid := range map[string]bool{"jobs_flow_pending_idx": false, "jobs_flow_running_idx": true} {
		var (
			after uint32
			valid bool
		)
		require.NoError(t, pool.QueryRow(ctx, "SELECT indexrelid, indisvalid FROM pg_catalog.pg_index WHERE indexrelid = $1::regclass",
			pgx.Identifier{schema, name}.Sanitize()).Scan(&after, &valid))
		require.True(t, valid, name)
		require.Equal(t, !invalid, after == before[name], "%s: kept if valid, built again if not", name)
	}
	_, err = pool.Exec(ctx, "INSERT INTO "+jobs+" (kind, flow_key) VALUES ('noop', '')")
	require.Equal(t, "jobs_flow_key_check", pgErrorOf(t, err).ConstraintName, "the column added ahead has its constraint")
}

// The worker and operator roles granted what they needed before migration
// 18 read (worker) and rotate (operator) the signing secrets after it,
// and only the worker reads a secret: not a role that deletes jobs
// without running a worker (the console's, a purge's).
func TestSigningSecretGrantsCarryOverMigration18(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schema := pgtest.EmptySchemaName(t)
	pool := pgtest.Pool(t)
	_, _, err := migrations.MigrateTo(ctx, pool, migrations.Config{Schema: schema}, 17)
	require.NoError(t, err)
	s := pgx.Identifier{schema}.Sanitize()
	rolePool := func(suffix, grants string) *pgxpool.Pool { return grantedPool(ctx, t, schema, suffix, grants) }
	worker := rolePool("worker", "GRANT SELECT, UPDATE, DELETE ON "+s+".jobs TO {role}; "+
		"GRANT EXECUTE ON FUNCTION "+s+".fire_schedule_slots(bigint[], timestamptz[]) TO {role}")
	operator := rolePool("operator", "GRANT SELECT, UPDATE ON "+s+".jobs TO {role}; GRANT EXECUTE ON FUNCTION "+s+".pause_queue(text) TO {role}")
	// The console's delete needs DELETE on jobs: its role is no worker.
	console := rolePool("console", "GRANT SELECT, UPDATE, DELETE ON "+s+".jobs TO {role}; GRANT EXECUTE ON FUNCTION "+s+".pause_queue(text) TO {role}")
	// A purge by cron deletes jobs too.
	purger := rolePool("purger", "GRANT SELECT, DELETE ON "+s+".jobs TO {role}")
	_, _, err = migrations.Migrate(ctx, pool, migrations.Config{Schema: schema})
	require.NoError(t, err)

	var id int64
	require.NoError(t, operator.QueryRow(ctx, "SELECT id FROM "+s+".rotate_signing_secret(decode(repeat('ab', 32), 'hex'), '1 hour')").Scan(&id))
	_, err = operator.Exec(ctx, "SELECT id, created_at, expires_at FROM "+s+".signing_secrets")
	require.NoError(t, err)
	_, err = operator.Exec(ctx, "SELECT secret FROM "+s+".signing_secrets")
	require.Equal(t, "42501", pgErrorOf(t, err).Code)
	for _, p := range []*pgxpool.Pool{console, purger} {
		_, err = p.Exec(ctx, "SELECT secret FROM "+s+".signing_secrets")
		require.Equal(t, "42501", pgErrorOf(t, err).Code, "a role that deletes jobs but runs no worker reads no secret")
	}
	var n int
	require.NoError(t, worker.QueryRow(ctx, "SELECT count(secret) FROM "+s+".signing_secrets").Scan(&n))
	require.Equal(t, 1, n)
	_, err = worker.Exec(ctx, "SELECT "+s+".rotate_signing_secret(decode(repeat('ab', 32), 'hex'), '0')")
	require.Equal(t, "42501", pgErrorOf(t, err).Code)
}

// The worker and operator roles of migration 19 (the worker writes the
// endpoints, the operator pauses queues and reads them) keep working after
// migration 20: the worker's flush that opens an endpoint records its
// event, with its job, and reports it; the operator disables and enables
// an endpoint and reads the events; neither writes an event itself.
func TestEndpointEventGrantsCarryOverMigration20(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schema := pgtest.EmptySchemaName(t)
	pool := pgtest.Pool(t)
	_, _, err := migrations.MigrateTo(ctx, pool, migrations.Config{Schema: schema}, 19)
	require.NoError(t, err)
	s := pgx.Identifier{schema}.Sanitize()
	rolePool := func(suffix, grants string) *pgxpool.Pool { return grantedPool(ctx, t, schema, suffix, grants) }
	worker := rolePool("worker", "GRANT SELECT, UPDATE, DELETE ON "+s+".jobs TO {role}; "+
		"GRANT SELECT, INSERT, UPDATE, DELETE ON "+s+".endpoints TO {role}; "+
		"GRANT EXECUTE ON FUNCTION "+s+".record_endpoint_outcomes(text[], integer[], integer[], text[], interval, integer, float8, interval) TO {role}")
	operator := rolePool("operator", "GRANT SELECT, UPDATE ON "+s+".jobs TO {role}; GRANT SELECT ON "+s+".endpoints TO {role}; "+
		"GRANT EXECUTE ON FUNCTION "+s+".pause_queue(text) TO {role}")
	_, _, err = migrations.Migrate(ctx, pool, migrations.Config{Schema: schema})
	require.NoError(t, err)

	var opened string
	require.NoError(t, worker.QueryRow(ctx, "SELECT "+s+".record_endpoint_outcomes(ARRAY['http://down:80'], ARRAY[1], ARRAY[1], "+
		"ARRAY['HTTP 503'], '1 minute', 1, 1, '1 hour', 'noop', NULL, NULL)").Scan(&opened))
	require.Equal(t, "http://down:80", opened)
	_, err = worker.Exec(ctx, "UPDATE "+s+".endpoint_events SET reported_at = now() WHERE reported_at IS NULL")
	require.NoError(t, err)
	var disabled, enabled bool
	require.NoError(t, operator.QueryRow(ctx, "SELECT "+s+".disable_endpoint('http://down:80', 'ask ops')").Scan(&disabled))
	require.NoError(t, operator.QueryRow(ctx, "SELECT "+s+".enable_endpoint('http://down:80')").Scan(&enabled))
	require.True(t, disabled && enabled)
	var events, jobs int
	require.NoError(t, operator.QueryRow(ctx, "SELECT count(*), count(job_id) FROM "+s+".endpoint_events").Scan(&events, &jobs))
	require.Equal(t, []int{3, 1}, []int{events, jobs})
	for _, p := range []*pgxpool.Pool{worker, operator} {
		_, err = p.Exec(ctx, "INSERT INTO "+s+".endpoint_events (endpoint, event, actor) VALUES ('http://x:80', 'opened', 'breaker')")
		require.Equal(t, "42501", pgErrorOf(t, err).Code)
	}
	_, err = operator.Exec(ctx, "SELECT "+s+".endpoint_event('http://x:80', 'opened', 'breaker', NULL, NULL, 'noop', NULL, NULL)")
	require.Equal(t, "42501", pgErrorOf(t, err).Code)
}

// grantedPool creates a role of schema's test, named by suffix, with USAGE
// on the schema and grants ({role} names it), dropped at the test's end,
// and returns a pool whose sessions take it.
func grantedPool(ctx context.Context, t *testing.T, schema, suffix, grants string) *pgxpool.Pool {
	t.Helper()
	pool := pgtest.Pool(t)
	s := pgx.Identifier{schema}.Sanitize()
	role := "pgdt_" + strings.ReplaceAll(schema, "pgdt_", "") + "_" + suffix
	ident := pgx.Identifier{role}.Sanitize()
	_, err := pool.Exec(ctx, "CREATE ROLE "+ident+" NOLOGIN; GRANT USAGE ON SCHEMA "+s+" TO "+ident+"; "+
		strings.ReplaceAll(grants, "{role}", ident))
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := pool.Exec(context.Background(), "DROP OWNED BY "+ident+"; DROP ROLE "+ident)
		require.NoError(t, err)
	})
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["role"] = role
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}
