package pgtest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/migrations"
)

func TestMain(m *testing.M) { MainNoLeaks(m) }

// These tests are not parallel: each hands a schema back in one subtest and
// takes it again in the next, with no other test between.

// A schema a test is done with goes to the next test, emptied: no jobs, no
// event triggers, ids from 1 again, whether it held a few jobs (deleted)
// or many (truncated).
func TestSchemaIsReusedEmpty(t *testing.T) {
	for _, n := range []int{3, smallTable + 1} {
		t.Run(fmt.Sprint(n), func(t *testing.T) { testSchemaIsReusedEmpty(t, n) })
	}
}

func testSchemaIsReusedEmpty(t *testing.T, jobCount int) {
	var first string
	t.Run("use", func(t *testing.T) {
		first = Schema(t)
		ctx := context.Background()
		_, err := Pool(t).Exec(ctx, "INSERT INTO "+jobs(first)+" (kind) SELECT 'noop' FROM generate_series(1, $1)", jobCount)
		require.NoError(t, err)
		_, err = Pool(t).Exec(ctx, "CREATE TABLE "+pgx.Identifier{first, "orders"}.Sanitize()+" (id int)")
		require.NoError(t, err)
		_, err = Pool(t).Exec(ctx, "SELECT "+pgx.Identifier{first, "add_trigger"}.Sanitize()+
			"($1, ARRAY['insert'], 'noop', '{}', 'default', NULL, 'on_orders')", pgx.Identifier{first, "orders"}.Sanitize())
		require.NoError(t, err)
		Watch(t, first)
	})
	t.Run("reuse", func(t *testing.T) {
		schema := Schema(t)
		require.Equal(t, first, schema, "the schema is reused")
		ctx := context.Background()
		var n int
		require.NoError(t, Pool(t).QueryRow(ctx, "SELECT count(*) FROM "+jobs(schema)).Scan(&n))
		require.Zero(t, n, "no jobs are left")
		require.NoError(t, Pool(t).QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{schema, "event_triggers"}.Sanitize()).Scan(&n))
		require.Zero(t, n, "no event triggers are left")
		var added []string
		rows, err := Pool(t).Query(ctx, `SELECT relname FROM pg_class WHERE relnamespace = $1::regnamespace AND relname = 'orders'
			UNION ALL SELECT proname FROM pg_proc WHERE pronamespace = $1::regnamespace AND proname = 'test_watch'`, schema)
		require.NoError(t, err)
		added, err = pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		require.Empty(t, added, "the table and the function the test added are gone")
		var id int64
		require.NoError(t, Pool(t).QueryRow(ctx, "INSERT INTO "+jobs(schema)+" (kind) VALUES ('noop') RETURNING id").Scan(&id))
		require.Equal(t, int64(1), id, "ids start at 1 again")
	})
}

// A schema whose definition a test changed is dropped, not reused.
func TestChangedSchemaIsNotReused(t *testing.T) {
	for name, sql := range map[string]string{
		"constraint dropped": "ALTER TABLE {jobs} DROP CONSTRAINT jobs_run_at_check",
		"trigger disabled":   "ALTER TABLE {jobs} DISABLE TRIGGER jobs_notify_insert",
		"version changed":    "UPDATE {schema}.schema_version SET version = 4",
		"index added":        "CREATE INDEX extra ON {jobs} (kind)",
		"function replaced":  "CREATE OR REPLACE FUNCTION {schema}.wake(queue text DEFAULT 'default') RETURNS void LANGUAGE sql AS 'SELECT'",
		"statistics":         "INSERT INTO {jobs} (kind) SELECT 'noop' FROM generate_series(1, 100); ANALYZE {jobs}",
	} {
		t.Run(name, func(t *testing.T) {
			var first string
			t.Run("change", func(t *testing.T) {
				first = Schema(t)
				_, err := Pool(t).Exec(context.Background(), expand(sql, first))
				require.NoError(t, err)
			})
			t.Run("next", func(t *testing.T) {
				require.NotEqual(t, first, Schema(t))
				require.False(t, exists(t, first), "the changed schema is dropped")
			})
		})
	}
}

// A schema whose sleep key a session still holds when its test ends is not
// reused: a claimer that did not stop would take the next test's jobs.
func TestSchemaWithASleeperIsNotReused(t *testing.T) {
	defer func(d time.Duration) { resetLockTimeout = d }(resetLockTimeout)
	resetLockTimeout = 100 * time.Millisecond
	var first string
	t.Run("sleep", func(t *testing.T) {
		sleeper := Conn(t) // closed after the schema is handed back
		first = Schema(t)
		_, err := sleeper.Exec(context.Background(), "SELECT pg_advisory_lock($1, hashtext('default'))", migrations.SleepKey(first))
		require.NoError(t, err)
	})
	t.Run("next", func(t *testing.T) {
		require.NotEqual(t, first, Schema(t))
	})
}

// A fresh schema is never one that served before, and it is dropped at the
// end of its test.
func TestFreshSchema(t *testing.T) {
	var fresh string
	t.Run("fresh", func(t *testing.T) {
		reused := Schema(t)
		fresh = FreshSchema(t)
		require.NotEqual(t, reused, fresh)
		var version int32
		require.NoError(t, Pool(t).QueryRow(context.Background(),
			"SELECT version FROM "+pgx.Identifier{fresh, "schema_version"}.Sanitize()).Scan(&version))
		require.Equal(t, migrations.Latest(), version)
	})
	require.False(t, exists(t, fresh))
}

// The schemas of a binary that is gone are dropped by the next one; those
// of a binary that holds its owner lock are not.
func TestStaleSchemas(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	alive := Conn(t)
	// No other binary drops what it finds stale meanwhile.
	_, err := alive.Exec(ctx, "SELECT pg_advisory_lock($1, $2)", ownerClass, janitorKey)
	require.NoError(t, err)
	var aliveToken int32
	require.NoError(t, alive.QueryRow(ctx, `SELECT t FROM (SELECT (random() * 2147483646)::int4 + 1 AS t) r
		WHERE pg_try_advisory_lock($1, t)`, ownerClass).Scan(&aliveToken))
	goneToken := aliveToken ^ 0x5a5a5a5a // no lock of that token is held
	kept, gone := fmt.Sprintf("%s%08x_1", schemaPrefix, aliveToken), fmt.Sprintf("%s%08x_1", schemaPrefix, goneToken)
	for _, s := range []string{kept, gone} {
		_, err = Pool(t).Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{s}.Sanitize())
		require.NoError(t, err)
		t.Cleanup(func() {
			_, _ = Pool(t).Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{s}.Sanitize())
		})
	}
	stale, err := staleSchemas(ctx, alive)
	require.NoError(t, err)
	require.Contains(t, stale, gone)
	require.NotContains(t, stale, kept)
	require.NotContains(t, stale, Schema(t), "this binary's own are not stale")
}

func jobs(schema string) string { return pgx.Identifier{schema, "jobs"}.Sanitize() }

func expand(sql, schema string) string {
	return strings.NewReplacer("{jobs}", jobs(schema), "{schema}", pgx.Identifier{schema}.Sanitize()).Replace(sql)
}

func exists(t *testing.T, schema string) bool {
	t.Helper()
	var found bool
	require.NoError(t, Pool(t).QueryRow(context.Background(),
		"SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)", schema).Scan(&found))
	return found
}

// What a test wrote and changed in its Tx is gone when it ends: the schema
// goes to the next test as it was, though the test changed its definition.
// A statement Try runs that fails leaves the transaction usable.
func TestTxRollsBack(t *testing.T) {
	var first string
	t.Run("use", func(t *testing.T) {
		var tx pgx.Tx
		tx, first = Tx(t)
		ctx := context.Background()
		require.NoError(t, Try(t, tx, "INSERT INTO "+jobs(first)+" (kind) VALUES ('noop')"))
		require.Error(t, Try(t, tx, "INSERT INTO "+jobs(first)+" (kind) VALUES ('')"), "the kind's check")
		_, err := tx.Exec(ctx, "ALTER TABLE "+jobs(first)+" ADD CONSTRAINT test_no_x CHECK (kind <> 'x')")
		require.NoError(t, err)
		var n int
		require.NoError(t, tx.QueryRow(ctx, "SELECT count(*) FROM "+jobs(first)).Scan(&n))
		require.Equal(t, 1, n, "the transaction goes on after the failed statement")
	})
	t.Run("reuse", func(t *testing.T) {
		schema := Schema(t)
		require.Equal(t, first, schema, "the schema is reused: its definition is the migrations'")
		var n int
		require.NoError(t, Pool(t).QueryRow(context.Background(), "SELECT count(*) FROM "+jobs(schema)).Scan(&n))
		require.Zero(t, n)
	})
}
