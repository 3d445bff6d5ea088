package migrations_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/migrations"
)

// requireLimitedFollowsRows checks that queue is limited exactly while it
// has a row in flow_limits.
func requireLimitedFollowsRows(ctx context.Context, t *testing.T, s, queue, what string) {
	t.Helper()
	var limited, has bool
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "SELECT coalesce((SELECT limited FROM "+s+".queues WHERE name = $1), false), "+
		"EXISTS (SELECT FROM "+s+".flow_limits WHERE queue = $1)", queue).Scan(&limited, &has))
	require.Equal(t, has, limited, "%s: queue %s has limits: %v; limited: %v", what, queue, has, limited)
}

// A write by hand and clear_flow_limit (or set_flow_limit) of one queue's
// limits at once do not deadlock: both lock the limits' rows before the
// queue's row. A hand UPDATE that holds the row of key k while it waits
// for the row of key k2 (another session's), and clear_flow_limit of k,
// which waits for the hand UPDATE's row of k: once k2 is free, the hand
// UPDATE's trigger takes the queue's row, which clear_flow_limit must not
// hold while it waits.
func TestFlowLimitsByHandAndClearDoNotDeadlock(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schema := pgtest.Schema(t)
	s := pgx.Identifier{schema}.Sanitize()
	pool := pgtest.Pool(t)
	_, err := pool.Exec(ctx, "SELECT "+s+".set_flow_limit('dl', 'k', concurrency => 1)")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "SELECT "+s+".set_flow_limit('dl', 'k2', concurrency => 1)")
	require.NoError(t, err)

	holder := pgtest.Conn(t)
	tx, err := holder.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SELECT FROM "+s+".flow_limits WHERE queue = 'dl' AND key = 'k2' FOR UPDATE")
	require.NoError(t, err)

	handConn, clearConn := pgtest.Conn(t), pgtest.Conn(t)
	hand := make(chan error, 1)
	go func() {
		// Sequential scan: k's row, then k2's (in the order written).
		_, err := handConn.Exec(ctx, "SET enable_indexscan = off; SET enable_bitmapscan = off; "+
			"UPDATE "+s+".flow_limits SET concurrency = 2 WHERE queue = 'dl' /* by hand */")
		hand <- err
	}()
	pgtest.WaitSQL(t, time.Minute, "the hand UPDATE waiting for k2's row",
		"SELECT EXISTS (SELECT FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%/* by hand */%' AND pid <> pg_backend_pid())")
	cleared := make(chan error, 1)
	go func() {
		_, err := clearConn.Exec(ctx, "SELECT "+s+".clear_flow_limit('dl', 'k') /* clear */")
		cleared <- err
	}()
	pgtest.WaitSQL(t, time.Minute, "clear_flow_limit waiting for k's row",
		"SELECT EXISTS (SELECT FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%/* clear */%' AND pid <> pg_backend_pid())")
	require.NoError(t, tx.Commit(ctx))

	require.NoError(t, <-hand, "the hand UPDATE")
	require.NoError(t, <-cleared, "clear_flow_limit")
	requireLimitedFollowsRows(ctx, t, s, "dl", "after both")
}

// A transaction of REPEATABLE READ that writes a queue's limits by hand,
// or clears one, while another added a limit since its snapshot, does not
// leave the queue unlimited with a limit: it fails to serialize, and the
// queue stays limited.
func TestFlowLimitsRepeatableReadKeepsLimited(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schema := pgtest.Schema(t)
	s := pgx.Identifier{schema}.Sanitize()
	pool := pgtest.Pool(t)
	for _, write := range []string{
		"DELETE FROM " + s + ".flow_limits WHERE queue = 'rr' AND key = 'k0'",
		"SELECT " + s + ".clear_flow_limit('rr', 'k0')",
	} {
		_, err := pool.Exec(ctx, "DELETE FROM "+s+".flow_limits WHERE queue = 'rr'")
		require.NoError(t, err)
		_, err = pool.Exec(ctx, "SELECT "+s+".set_flow_limit('rr', 'k0', concurrency => 1)")
		require.NoError(t, err)

		tx, err := pgtest.Conn(t).BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "SELECT FROM "+s+".queues") // the snapshot
		require.NoError(t, err)
		_, err = pool.Exec(ctx, "INSERT INTO "+s+".flow_limits (queue, key, concurrency) VALUES ('rr', 'k1', 1)")
		require.NoError(t, err)
		_, err = tx.Exec(ctx, write)
		if err == nil {
			err = tx.Commit(ctx)
		} else {
			_ = tx.Rollback(ctx)
		}
		if err != nil {
			require.Equal(t, "40001", pgErrorOf(t, err).Code, write)
		}
		requireLimitedFollowsRows(ctx, t, s, "rr", write)
	}
}

// Migration 21 makes limited the queues whose limits were written into
// flow_limits by hand before it, and no other.
func TestFlowLimitsByHandBeforeMigration21(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schema := pgtest.EmptySchemaName(t)
	pool := pgtest.Pool(t)
	_, _, err := migrations.MigrateTo(ctx, pool, migrations.Config{Schema: schema}, 20)
	require.NoError(t, err)
	s := pgx.Identifier{schema}.Sanitize()
	_, err = pool.Exec(ctx, "INSERT INTO "+s+".flow_limits (queue, concurrency) VALUES ('hand', 1), ('hand', NULL) ON CONFLICT DO NOTHING; "+
		"INSERT INTO "+s+".flow_limits (queue, key, concurrency) VALUES ('hand', 'k', 2), ('new', 'k', 1); "+
		"INSERT INTO "+s+".queues (name, limited) VALUES ('stale', true), ('hand', false)")
	require.NoError(t, err)
	_, _, err = migrations.Migrate(ctx, pool, migrations.Config{Schema: schema})
	require.NoError(t, err)
	for _, q := range []string{"hand", "new", "stale"} {
		requireLimitedFollowsRows(ctx, t, s, q, "migrated")
	}
}
