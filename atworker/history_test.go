package atworker_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/atworker"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

// bundle is what a test of a switched table needs.
type bundle struct {
	ctx                context.Context
	pool               *pgxpool.Pool
	pgd, schema, table string // pgdispatch's schema, the application's and its table
}

// setup gives the test a schema of pgdispatch's, and the AT Worker's table
// in a schema of the application's.
func setup(t *testing.T) bundle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	b := bundle{ctx: ctx, pool: pgtest.Pool(t), pgd: pgtest.FreshSchema(t)}
	b.schema, b.table = appSchema(t)
	return b
}

// times are a row's timestamps.
type times struct {
	ExecuteAt, UpdatedAt time.Time
	CompletedAt          *time.Time
}

func readTimes(ctx context.Context, t *testing.T, table string) map[int64]times {
	t.Helper()
	rows, err := pgtest.Pool(t).Query(ctx, `SELECT id, execute_at, updated_at, completed_at FROM `+table+` ORDER BY id`)
	require.NoError(t, err)
	out := map[int64]times{}
	var (
		id int64
		r  times
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &r.ExecuteAt, &r.UpdatedAt, &r.CompletedAt}, func() error { out[id] = r; return nil })
	require.NoError(t, err)
	return out
}

func nearMax(ctx context.Context, t *testing.T, table string) []int64 {
	t.Helper()
	rows, err := pgtest.Pool(t).Query(ctx, `SELECT id FROM `+table+` WHERE attempts >= max_attempts - 1 AND status != 'completed' ORDER BY updated_at DESC LIMIT 10`)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	return ids
}

// The table's history survives the switch and the revert: a finished
// row's updated_at, completed_at and execute_at, and the execute_at of a
// row an AT Worker was processing, even once pgdispatch has run it.
func TestSwitchKeepsTheRowsTimes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, pool, pgd, table := b.ctx, b.pool, b.pgd, b.table
	_, err := pool.Exec(ctx, `INSERT INTO `+table+` (id, task_type, payload, status, attempts, max_attempts, execute_at, updated_at, completed_at, error_message) VALUES
		(1, 'email', '{}', 'completed', 1, 3, now() - interval '3 hours', now() - interval '2 hours', now() - interval '2 hours 5 seconds', NULL),
		(2, 'email', '{}', 'failed', 3, 3, now() - interval '3 hours', now() - interval '90 minutes', now() - interval '91 minutes', 'boom'),
		(3, 'email', '{}', 'failed', 2, 3, now() - interval '3 hours', now() - interval '30 minutes', NULL, 'bang'),
		(4, 'email', '{}', 'failed', 3, 3, now() - interval '3 hours', now() - interval '60 minutes', NULL, 'bust'),
		(5, 'email', '{}', 'processing', 1, 3, now() - interval '20 minutes', now() - interval '1 minute', NULL, NULL),
		(6, 'email', '{}', 'processing', 0, 3, now() - interval '10 minutes', now() - interval '2 minutes', NULL, NULL)`)
	require.NoError(t, err)
	before := readTimes(ctx, t, table)
	near := nearMax(ctx, t, table)
	require.Equal(t, []int64{3, 4, 2}, near)

	o := atworker.Options{Schema: pgd, Table: table}
	_, err = atworker.Switch(ctx, pool, o)
	require.NoError(t, err)
	jobs := pgx.Identifier{pgd, "jobs"}.Sanitize()
	var dueAfterStuck bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT j.run_at = $1::timestamptz + interval '5 minutes' FROM `+jobs+` j
		JOIN `+table[:len(table)-1]+`_at_worker" s ON s.pgdispatch_job_id = j.id WHERE s.id = 5`, before[5].UpdatedAt).Scan(&dueAfterStuck))
	require.True(t, dueAfterStuck, "the processing row is due its stuck timeout after its updated_at")
	require.Equal(t, before, readTimes(ctx, t, table), "the view's times after the switch")
	require.Equal(t, near, nearMax(ctx, t, table))

	// pgdispatch runs row 5, and Settle writes it back: it keeps its
	// execute_at, so that completed_at - execute_at measures from it.
	_, err = pool.Exec(ctx, `UPDATE `+jobs+` j SET status = 'running', attempts = j.attempts + 1, updated_at = now() FROM `+
		table[:len(table)-1]+`_at_worker" s WHERE s.pgdispatch_job_id = j.id AND s.id = 5`)
	require.NoError(t, err)
	require.Equal(t, before[5].ExecuteAt, readTimes(ctx, t, table)[5].ExecuteAt)
	_, err = pool.Exec(ctx, `UPDATE `+jobs+` SET status = 'done', finished_at = now(), updated_at = now() WHERE status = 'running'`)
	require.NoError(t, err)
	require.Equal(t, before[5].ExecuteAt, readTimes(ctx, t, table)[5].ExecuteAt)
	n, err := atworker.Settle(ctx, pool, pgd, 10*time.Second)
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	after := readTimes(ctx, t, table)
	require.Equal(t, before[5].ExecuteAt, after[5].ExecuteAt)
	require.NotNil(t, after[5].CompletedAt)

	_, err = atworker.Revert(ctx, pool, o)
	require.NoError(t, err)
	reverted := readTimes(ctx, t, table)
	require.Equal(t, after, reverted, "the table's times after the revert")
	// Row 6, which an AT Worker may still be running, never ran here: it
	// goes back as it was, for the AT Worker's cleaner to judge.
	var status string
	require.NoError(t, pool.QueryRow(ctx, `SELECT status FROM `+table+` WHERE id = 6`).Scan(&status))
	require.Equal(t, "processing", status)
	for id := range before {
		if id != 5 {
			require.Equal(t, before[id], reverted[id], "row %d", id)
		}
	}
	require.Equal(t, near, nearMax(ctx, t, table))
}

// A producer's INSERT ... ON CONFLICT into the view fails, as the guide
// says, and the statements it gives instead work.
func TestProducerOnConflictAfterSwitch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, pool, pgd, table := b.ctx, b.pool, b.pgd, b.table
	_, err := atworker.Switch(ctx, pool, atworker.Options{Schema: pgd, Table: table})
	require.NoError(t, err)

	// With a conflict target: refused, whether or not the id is taken.
	var pgErr *pgconn.PgError
	for _, action := range []string{"DO NOTHING", "DO UPDATE SET payload = excluded.payload"} {
		_, err = pool.Exec(ctx, `INSERT INTO `+table+` (id, task_type, payload) VALUES (7, 'noop', '{}') ON CONFLICT (id) `+action)
		require.ErrorAs(t, err, &pgErr, "%v", err)
		require.Equal(t, "42P10", pgErr.Code, "%v", err) // invalid_column_reference
	}
	var version int
	require.NoError(t, pool.QueryRow(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version))
	if version < 170000 {
		_, err = pool.Exec(ctx, `MERGE INTO `+table+` t USING (SELECT 7 AS id) n ON t.id = n.id
			WHEN NOT MATCHED THEN INSERT (id, task_type, payload) VALUES (n.id, 'noop', '{}')`)
		require.ErrorContains(t, err, "cannot execute MERGE on relation")
	}
	// Without one: accepted, but a taken id is a unique_violation.
	noTarget := `INSERT INTO ` + table + ` (id, task_type, payload) VALUES (6, 'noop', '{}') ON CONFLICT DO NOTHING`
	_, err = pool.Exec(ctx, noTarget)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, noTarget)
	require.ErrorAs(t, err, &pgErr, "%v", err)
	require.Equal(t, "23505", pgErr.Code, "%v", err)

	// The guide's statement: a redelivery inserts nothing.
	guide, err := os.ReadFile("../docs/migrating-from-at-worker.md")
	require.NoError(t, err)
	const idempotent = `INSERT INTO scheduled_tasks (id, task_type, payload)
SELECT $1, $2, $3
WHERE NOT EXISTS (SELECT FROM scheduled_tasks WHERE id = $1);`
	require.Contains(t, string(guide), idempotent)
	insert := strings.ReplaceAll(strings.TrimSuffix(idempotent, ";"), "scheduled_tasks", table)
	for _, want := range []int64{1, 0} {
		tag, err := pool.Exec(ctx, insert, 7, "noop", "{}")
		require.NoError(t, err)
		require.Equal(t, want, tag.RowsAffected())
	}
	// Two at once: the loser gets unique_violation, which it takes as
	// "already there".
	_, err = pool.Exec(ctx, `INSERT INTO `+table+` (id, task_type, payload) VALUES (7, 'noop', '{}')`)
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "23505", pgErr.Code)
	var jobs int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{pgd, "jobs"}.Sanitize()).Scan(&jobs))
	require.Equal(t, 2, jobs)
}
