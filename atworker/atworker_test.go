package atworker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/atworker"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.MainNoLeaks(m) }

// ATWorkerDDL is the AT Worker's table as its README implies, with a
// column of the application's own (tenant).
const ATWorkerDDL = `
CREATE TABLE %s (
    id            bigserial PRIMARY KEY,
    task_type     varchar(50) NOT NULL,
    payload       jsonb NOT NULL,
    status        varchar(20) NOT NULL DEFAULT 'pending'
                  CHECK (status IN ('pending', 'processing', 'completed', 'failed')),
    attempts      integer NOT NULL DEFAULT 0,
    max_attempts  integer NOT NULL DEFAULT 3,
    execute_at    timestamptz NOT NULL DEFAULT now(),
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    completed_at  timestamptz,
    error_message text,
    tenant        text NOT NULL DEFAULT 'acme'
)`

// appSchema makes a schema of the application's own with the AT Worker's
// table in it, and returns the table's qualified name.
func appSchema(t *testing.T) (schema, table string) {
	t.Helper()
	schema = pgtest.EmptySchemaName(t)
	ctx := context.Background()
	_, err := pgtest.Pool(t).Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
	require.NoError(t, err)
	table = pgx.Identifier{schema, "scheduled_tasks"}.Sanitize()
	_, err = pgtest.Pool(t).Exec(ctx, fmt.Sprintf(ATWorkerDDL, table))
	require.NoError(t, err)
	return schema, table
}

func TestSwitchAndRevertRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	pgd := pgtest.FreshSchema(t)
	_, table := appSchema(t)
	_, err := pool.Exec(ctx, `INSERT INTO `+table+` (task_type, payload, status, attempts, execute_at, updated_at, completed_at, error_message, tenant) VALUES
		('http_callback', '{"url": "http://a.test/"}', 'pending', 0, now() + interval '1 hour', now(), NULL, NULL, 't1'),
		('email', '{"to": ["a@b.test"]}', 'processing', 1, now() - interval '1 minute', now() - interval '1 minute', NULL, NULL, 't2'),
		('rabbitmq', '{"routing_key": "q"}', 'completed', 1, now() - interval '1 hour', now() - interval '50 minutes', now() - interval '50 minutes', NULL, 't3'),
		('http_callback', '{"url": "http://b.test/"}', 'failed', 3, now() - interval '1 hour', now(), NULL, 'HTTP 500', 't4')`)
	require.NoError(t, err)

	o := atworker.Options{Schema: pgd, Table: table}
	dry := o
	dry.DryRun = true
	plan, err := atworker.Switch(ctx, pool, dry)
	require.NoError(t, err)
	require.Equal(t, atworker.RowCounts{"pending": 1, "processing": 1, "completed": 1, "failed": 1}, plan.Rows)
	require.Equal(t, []string{"created_at", "tenant"}, plan.Columns)

	plan, err = atworker.Switch(ctx, pool, o)
	require.NoError(t, err)
	require.False(t, plan.AlreadySwitched)
	plan, err = atworker.Switch(ctx, pool, o)
	require.NoError(t, err)
	require.True(t, plan.AlreadySwitched)

	jobs := pgx.Identifier{pgd, "jobs"}.Sanitize()
	var got []string
	rows, err := pool.Query(ctx, `SELECT j.kind || ':' || j.status || ':' || j.attempts || ':' || coalesce(j.last_error, '') ||
		':' || (j.run_at > now() + interval '3 minutes')::text FROM `+jobs+` j ORDER BY j.id`)
	require.NoError(t, err)
	got, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{
		"http_callback:pending:0::true", "email:pending:1::true", "rabbitmq:done:1::false", "http_callback:dead:3:HTTP 500:false",
	}, got)

	// A producer's INSERT, RETURNING its id; the view's statuses.
	var id int64
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+table+` (task_type, payload, tenant) VALUES ('email', '{"to": ["x@y.test"]}', 'new') RETURNING id`).Scan(&id))
	require.Equal(t, int64(5), id)
	rows, err = pool.Query(ctx, `SELECT id || ':' || status || ':' || tenant FROM `+table+` ORDER BY id`)
	require.NoError(t, err)
	got, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"1:pending:t1", "2:pending:t2", "3:completed:t3", "4:failed:t4", "5:pending:new"}, got)

	// An old AT Worker finishing the row it held: the job is done and never runs.
	tag, err := pool.Exec(ctx, `UPDATE `+table+` SET status = 'completed', completed_at = now(), updated_at = now() WHERE id = 2`)
	require.NoError(t, err)
	require.Equal(t, int64(1), tag.RowsAffected())
	// An AT Worker's poll fails, and its claim is refused.
	_, err = pool.Exec(ctx, `SELECT id FROM `+table+` WHERE status = 'pending' AND execute_at <= NOW() LIMIT 10 FOR UPDATE SKIP LOCKED`)
	require.ErrorContains(t, err, "FOR UPDATE cannot be applied to the nullable side of an outer join")
	tag, err = pool.Exec(ctx, `UPDATE `+table+` SET status = 'processing' WHERE id = 1`)
	require.NoError(t, err)
	require.Equal(t, int64(0), tag.RowsAffected())
	// An operator retrying a failed row.
	_, err = pool.Exec(ctx, `UPDATE `+table+` SET status = 'pending', attempts = 0, tenant = 't4b' WHERE id = 4`)
	require.NoError(t, err)
	var status string
	var attempts int
	require.NoError(t, pool.QueryRow(ctx, `SELECT j.status, j.attempts FROM `+jobs+` j WHERE j.id = 4`).Scan(&status, &attempts))
	require.Equal(t, "pending", status)
	require.Zero(t, attempts)
	require.NoError(t, pool.QueryRow(ctx, `SELECT j.status FROM `+jobs+` j WHERE j.id = 2`).Scan(&status))
	require.Equal(t, "done", status)
	// DELETE.
	tag, err = pool.Exec(ctx, `DELETE FROM `+table+` WHERE id = 5`)
	require.NoError(t, err)
	require.Equal(t, int64(1), tag.RowsAffected())

	// Settle, then the sweeper's purge: the view still answers.
	n, err := atworker.Settle(ctx, pool, pgd, 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, int64(0), n) // 2 was settled by its UPDATE, 3 at the switch
	_, err = pool.Exec(ctx, `UPDATE `+jobs+` SET status = 'dead', finished_at = now(), last_error = 'boom' WHERE id = 1`)
	require.NoError(t, err)
	n, err = atworker.Settle(ctx, pool, pgd, 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	_, err = pool.Exec(ctx, `DELETE FROM `+jobs+` WHERE id IN (1, 3)`)
	require.NoError(t, err)
	rows, err = pool.Query(ctx, `SELECT id || ':' || status || ':' || coalesce(error_message, '') || ':' || tenant FROM `+table+` ORDER BY id`)
	require.NoError(t, err)
	got, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"1:failed:boom:t1", "2:completed::t2", "3:completed::t3", "4:pending:HTTP 500:t4b"}, got)

	res, err := atworker.Revert(ctx, pool, o)
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Cancelled)
	require.Equal(t, atworker.RowCounts{"pending": 1, "completed": 2, "failed": 1}, res.Rows)
	rows, err = pool.Query(ctx, `SELECT id || ':' || status || ':' || coalesce(error_message, '') || ':' || tenant FROM `+table+` ORDER BY id`)
	require.NoError(t, err)
	got, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"1:failed:boom:t1", "2:completed::t2", "3:completed::t3", "4:pending:HTTP 500:t4b"}, got)
	require.NoError(t, pool.QueryRow(ctx, `SELECT j.status FROM `+jobs+` j WHERE j.id = 4`).Scan(&status))
	require.Equal(t, "cancelled", status)
	// A table again: the sequence goes on.
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+table+` (task_type, payload) VALUES ('email', '{}') RETURNING id`).Scan(&id))
	require.Equal(t, int64(6), id)
	res, err = atworker.Revert(ctx, pool, o)
	require.NoError(t, err)
	require.True(t, res.NotSwitched)

	_, err = atworker.Switch(ctx, pool, atworker.Options{Schema: pgd, Table: "no_such_schema_x.scheduled_tasks"})
	require.ErrorIs(t, err, atworker.ErrNoTable)
}

// Jobs running at the revert: their rows read processing, and Wait writes
// each outcome, or cancels what still runs when the wait ends.
func TestRevertWaitsForRunningJobs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	pgd := pgtest.FreshSchema(t)
	_, table := appSchema(t)
	_, err := pool.Exec(ctx, `INSERT INTO `+table+` (task_type, payload) SELECT 'noop', '{}' FROM generate_series(1, 3)`)
	require.NoError(t, err)
	o := atworker.Options{Schema: pgd, Table: table}
	_, err = atworker.Switch(ctx, pool, o)
	require.NoError(t, err)
	jobs := pgx.Identifier{pgd, "jobs"}.Sanitize()
	// A worker claims all three.
	_, err = pool.Exec(ctx, `UPDATE `+jobs+` SET status = 'running', attempts = 1, locked_by = 'w1',
		locked_until = now() + interval '1 minute', updated_at = now() - interval '10 minutes'`)
	require.NoError(t, err)

	res, err := atworker.Revert(ctx, pool, o)
	require.NoError(t, err)
	require.Zero(t, res.Cancelled)
	require.Len(t, res.Running, 3)
	require.Equal(t, atworker.RowCounts{"processing": 3}, res.Rows)
	var fresh bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT bool_and(updated_at > now() - interval '1 minute') FROM `+table).Scan(&fresh))
	require.True(t, fresh, "the AT Worker's cleaner would take the rows back at once")

	// 1 succeeds, 2 fails for good, 3 fails and would be retried; a second
	// wait with 3's retry running again cuts it.
	_, err = pool.Exec(ctx, `UPDATE `+jobs+` SET status = 'done', finished_at = now(), locked_by = NULL WHERE id = 1`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE `+jobs+` SET status = 'dead', finished_at = now(), last_error = 'boom', locked_by = NULL WHERE id = 2`)
	require.NoError(t, err)
	w, err := atworker.Wait(ctx, pool, pgd, res.Table, res.Running, 0, 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, 2, w.Finished)
	require.Equal(t, []atworker.RunningJob{{JobID: 3, RowID: "3"}}, w.Cut)
	rows, err := pool.Query(ctx, `SELECT id || ':' || status || ':' || coalesce(error_message, '') FROM `+table+` ORDER BY id`)
	require.NoError(t, err)
	got, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"1:completed:", "2:failed:boom", "3:pending:"}, got)
	var status string
	require.NoError(t, pool.QueryRow(ctx, `SELECT status FROM `+jobs+` WHERE id = 3`).Scan(&status))
	require.Equal(t, "cancelled", status)
}
