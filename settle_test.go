package pgdispatch_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/atworker"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

// A worker serving an AT Worker's switched table writes the outcomes of
// its finished jobs into the table's rows, which outlive the jobs once the
// sweeper purges them.
func TestWorkerSettlesSwitchedTable(t *testing.T) {
	t.Parallel()
	b := setupUnwatched(t)
	ctx := context.Background()
	pool := pgtest.Pool(t)
	app := pgtest.EmptySchemaName(t)
	_, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{app}.Sanitize())
	require.NoError(t, err)
	table := pgx.Identifier{app, "scheduled_tasks"}.Sanitize()
	_, err = pool.Exec(ctx, `CREATE TABLE `+table+` (
		id bigserial PRIMARY KEY, task_type varchar(50) NOT NULL, payload jsonb NOT NULL,
		status varchar(20) NOT NULL DEFAULT 'pending', attempts integer NOT NULL DEFAULT 0,
		max_attempts integer NOT NULL DEFAULT 3, execute_at timestamptz NOT NULL DEFAULT now(),
		created_at timestamptz NOT NULL DEFAULT now(), updated_at timestamptz NOT NULL DEFAULT now(),
		completed_at timestamptz, error_message text)`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+table+` (task_type, payload) SELECT 'noop', '{}' FROM generate_series(1, 3)`)
	require.NoError(t, err)
	_, err = atworker.Switch(ctx, pool, atworker.Options{Schema: b.schema, Table: app + ".scheduled_tasks"})
	require.NoError(t, err)

	cfg := b.config(t, "w")
	cfg.SweepInterval = 100 * time.Millisecond
	start(t, cfg)
	store := pgx.Identifier{app, "scheduled_tasks" + atworker.StoreSuffix}.Sanitize()
	require.Eventually(t, func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM `+store+` WHERE status = 'completed' AND completed_at IS NOT NULL`).Scan(&n)
		return err == nil && n == 3
	}, waitFor, 20*time.Millisecond, "the rows of the done jobs were not written back")
}
