package sweeper_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/sweeper"
)

// A transaction held open in the database is read as its oldest snapshot,
// and past the threshold the sweeper warns and names a holder.
func TestHorizonNamesAnOldSnapshot(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool := pgtest.Pool(t)
	core, logs := observer.New(zapcore.WarnLevel)
	s, err := sweeper.New(sweeper.Config{Pool: pool, Schema: pgtest.Schema(t), HorizonWarn: time.Nanosecond, Logger: zap.New(core)})
	require.NoError(t, err)
	_, ok := s.LastHorizon()
	require.False(t, ok)

	holder := pgtest.Conn(t)
	tx, err := holder.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var pid int32
	require.NoError(t, tx.QueryRow(ctx, "SELECT pg_backend_pid() FROM (SELECT txid_current()) x").Scan(&pid))
	for range 3 { // transactions begun after it
		_, err := pool.Exec(ctx, "SELECT txid_current()")
		require.NoError(t, err)
	}
	var held int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT age(backend_xmin) FROM pg_stat_activity WHERE pid = $1", pid).Scan(&held))
	require.GreaterOrEqual(t, held, int64(3))

	h, err := s.CheckHorizon(ctx)
	require.NoError(t, err)
	require.GreaterOrEqual(t, h.XidAge, held, "the oldest snapshot is the held one or older")
	require.Contains(t, h.Holder, "session pid ")
	require.Positive(t, h.Seconds)
	last, ok := s.LastHorizon()
	require.True(t, ok)
	require.Equal(t, h, last)
	warned := logs.FilterMessageSnippet("oldest snapshot is old").All()
	require.Len(t, warned, 1)
	require.Equal(t, h.Holder, warned[0].ContextMap()["holder"])
}
