package claimer

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/pgtest"
)

// The claim asks for its generic plan with a transaction-local setting: it
// must claim as before, and the setting must not outlive the claim on the
// pooled connection, which other code shares.
func TestClaimKeepsPlanSettingToItself(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	schema := pgtest.Schema(t)
	pool := newSizedPool(ctx, t, 1) // every statement below runs on the claim's connection

	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	_, err := pool.Exec(ctx, "INSERT INTO "+jobs+" (kind) SELECT 'noop' FROM generate_series(1, 3)")
	require.NoError(t, err)
	c, err := New(Config{
		Pool: pool, Schema: schema, SleepConnConfig: pool.Config().ConnConfig, Queue: "default",
		WorkerID: "w", Registry: executors.NewRegistry(),
	})
	require.NoError(t, err)

	claimed, _, err := c.claim(ctx, 2)
	require.NoError(t, err)
	require.Len(t, claimed, 2)
	var running int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+jobs+" WHERE status = 'running' AND locked_by = 'w'").Scan(&running))
	require.Equal(t, 2, running)

	var mode string
	require.NoError(t, pool.QueryRow(ctx, "SELECT current_setting('plan_cache_mode')").Scan(&mode))
	require.Equal(t, "auto", mode)
}
