package sweeper_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgdispatch/pgdispatch/internal/stmtcount"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgcluster"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/migrations"
	"github.com/pgdispatch/pgdispatch/sweeper"
)

// A transaction held open in the sweeper's database, as a report or an
// idle-in-transaction session holds one, is named as what holds back the
// xmin horizon, with an age that only grows; the sweeper warns once while
// it is older than OldestXminWarn, however many looks, and says so when it
// has ended.
func TestOldestXminNamesAHeldTransaction(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A cluster of its own: a transaction id held in any database of a
	// cluster holds back every database's horizon.
	cluster, err := pgcluster.Start(ctx, pgcluster.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cluster.Stop() })
	admin, err := pgx.Connect(ctx, cluster.URL())
	require.NoError(t, err)
	defer func() { _ = admin.Close(context.Background()) }()
	_, err = admin.Exec(ctx, "CREATE DATABASE app")
	require.NoError(t, err)
	dbURL := strings.Replace(cluster.URL(), "/postgres?", "/app?", 1)
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	_, _, err = migrations.Migrate(ctx, pool, migrations.Config{Schema: "pgdispatch"})
	require.NoError(t, err)

	core, logs := observer.New(zap.InfoLevel)
	s, err := sweeper.New(sweeper.Config{Pool: pool, Schema: "pgdispatch", OldestXminWarn: time.Nanosecond, Logger: zap.New(core)})
	require.NoError(t, err)
	require.False(t, s.OldestXmin().Known, "no look yet")
	s.LookAtHorizon(ctx)
	require.Equal(t, sweeper.Horizon{Known: true}, s.OldestXmin(), "nothing holds the horizon")
	require.Zero(t, logs.Len())

	hold, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer func() { _ = hold.Close(context.Background()) }()
	_, err = hold.Exec(ctx, "SET application_name = 'held-report'")
	require.NoError(t, err)
	_, err = hold.Exec(ctx, "BEGIN")
	require.NoError(t, err)
	var xid int64
	require.NoError(t, hold.QueryRow(ctx, "SELECT txid_current()").Scan(&xid))
	// Transactions after it age its xid.
	for range 3 {
		_, err = pool.Exec(ctx, "SELECT txid_current()")
		require.NoError(t, err)
	}
	pid := strconv.Itoa(int(hold.PgConn().PID()))

	var last time.Duration
	for range 3 {
		s.LookAtHorizon(ctx)
		h := s.OldestXmin()
		require.True(t, h.Known)
		require.Equal(t, "session", h.Holder, h.String())
		require.Equal(t, pid, h.Name)
		require.Equal(t, "held-report", h.App)
		require.Equal(t, "idle in transaction", h.State)
		require.GreaterOrEqual(t, h.Xids, int64(3), "three transactions began after it")
		require.GreaterOrEqual(t, h.Age, last, "its age never goes back")
		require.Positive(t, h.Age)
		last = h.Age
	}
	warned := logs.FilterMessageSnippet("oldest snapshot holds back vacuum").AllUntimed()
	require.Len(t, warned, 1, "one warning per crossing, not per look")
	require.Equal(t, zap.WarnLevel, warned[0].Level)
	fields := warned[0].ContextMap()
	require.Equal(t, pid, fields["name"])
	require.Equal(t, "held-report", fields["application_name"])

	_, err = hold.Exec(ctx, "ROLLBACK")
	require.NoError(t, err)
	s.LookAtHorizon(ctx)
	require.Equal(t, sweeper.Horizon{Known: true}, s.OldestXmin(), "nothing holds the horizon once it ended")
	require.Equal(t, 1, logs.FilterMessageSnippet("younger than the warning's threshold again").Len())
	require.Equal(t, 2, logs.Len())

	// A transaction id held in another database holds back this one's
	// horizon through every snapshot taken here.
	_, err = admin.Exec(ctx, "BEGIN")
	require.NoError(t, err)
	require.NoError(t, admin.QueryRow(ctx, "SELECT txid_current()").Scan(&xid))
	_, err = pool.Exec(ctx, "SELECT txid_current()")
	require.NoError(t, err)
	s.LookAtHorizon(ctx)
	h := s.OldestXmin()
	require.Equal(t, strconv.Itoa(int(admin.PgConn().PID())), h.Name, h.String())
	require.Equal(t, "postgres", h.Database)
	require.Len(t, logs.FilterMessageSnippet("oldest snapshot holds back vacuum").AllUntimed(), 2, "warned again: a new crossing")
	_, err = admin.Exec(ctx, "ROLLBACK")
	require.NoError(t, err)
}

// A pass looks at the xmin horizon in its first transaction: on an idle
// database the look costs no transaction of its own.
func TestPassLooksAtTheHorizonInItsOwnTransaction(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schema := pgtest.Schema(t)
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	var count stmtcount.Counter
	cfg.ConnConfig.Tracer = &count
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s, err := sweeper.New(sweeper.Config{Pool: pool, Schema: schema})
	require.NoError(t, err)
	require.False(t, s.OldestXmin().Known, "no look yet")

	_, err = s.Sweep(ctx)
	require.NoError(t, err)
	require.True(t, s.OldestXmin().Known, "the pass looked at the horizon")
	// Begin is a statement outside a transaction; the look, the lock and
	// the batches are statements inside it.
	require.Equal(t, int64(1), count.Transactions.Load(), "one transaction for the pass and its look")
}
