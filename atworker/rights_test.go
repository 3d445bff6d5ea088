package atworker_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/atworker"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

// rights is a switched table whose owner is no superuser, an application
// role with SELECT, INSERT, UPDATE and DELETE on it from before the
// switch, and jobs the application must not reach: another writer's, and
// the job of another tenant's row.
type rights struct {
	pgd, schema, table, store string
	owner, app, reader        string // reader may read two columns
	o                         atworker.Options
	mine                      int64   // the application's own row
	victims                   []int64 // the jobs it must not reach
}

func setupRights(ctx context.Context, t *testing.T) rights {
	t.Helper()
	pool := pgtest.Pool(t)
	r := rights{pgd: pgtest.FreshSchema(t)}
	r.schema, r.table, r.owner, r.app = ownedTable(ctx, t)
	r.store = r.schema + ".scheduled_tasks_at_worker"
	grantJobs(ctx, t, r.pgd, r.owner)
	r.reader = newRole(ctx, t, "reader")
	_, err := pool.Exec(ctx, fmt.Sprintf(`GRANT SELECT, INSERT, UPDATE, DELETE ON %[1]s TO %[2]s;
		ALTER TABLE %[1]s ADD COLUMN "note$1" text; GRANT USAGE ON SCHEMA %[3]s TO %[4]s; GRANT SELECT (id, "note$1") ON %[1]s TO %[4]s`,
		r.table, r.app, r.schema, r.reader))
	require.NoError(t, err)
	jobs := pgx.Identifier{r.pgd, "jobs"}.Sanitize()
	var other, tenant int64
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+jobs+` (kind, payload, run_at, last_error)
		VALUES ('http_callback', '{"url": "http://victim.test/secret"}', now() + interval '1 hour', 'victim-secret') RETURNING id`).Scan(&other))
	_, err = pool.Exec(ctx, `INSERT INTO `+r.table+` (task_type, payload, execute_at, error_message, tenant)
		VALUES ('http_callback', '{"url": "http://victim.test/secret"}', now() + interval '1 hour', 'victim-secret', 'other')`)
	require.NoError(t, err)

	// The table's owner, no superuser, switches it.
	r.o = atworker.Options{Schema: r.pgd, Table: r.table}
	owner := roleConn(ctx, t, r.owner)
	_, err = atworker.Switch(ctx, owner, r.o)
	require.NoError(t, err)
	require.NoError(t, pool.QueryRow(ctx, `SELECT pgdispatch_job_id FROM `+r.store+` WHERE tenant = 'other'`).Scan(&tenant))
	r.victims = []int64{other, tenant}

	app := roleConn(ctx, t, r.app)
	require.NoError(t, app.QueryRow(ctx, `INSERT INTO `+r.table+` (task_type, payload, tenant)
		VALUES ('http_callback', '{"url": "http://app.test/"}', 'app') RETURNING id`).Scan(&r.mine))
	return r
}

// roleConn is a session logged in as role, closed when the test ends.
func roleConn(ctx context.Context, t *testing.T, role string) *pgx.Conn {
	t.Helper()
	_, err := pgtest.Pool(t).Exec(ctx, "ALTER ROLE "+role+" LOGIN")
	require.NoError(t, err)
	cfg, err := pgx.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	cfg.User = strings.Trim(role, `"`)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	var super bool
	require.NoError(t, conn.QueryRow(ctx, "SELECT rolsuper FROM pg_roles WHERE rolname = session_user").Scan(&super))
	require.False(t, super)
	return conn
}

func requireDenied(t *testing.T, err error, what string) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.True(t, errors.As(err, &pgErr) && pgErr.Code == "42501", "%s: want permission denied, got %v", what, err)
}

// The switch moves the table's grants to the view: the application's role
// keeps them there, and has none left on the store, whose new column
// points each row at its job.
func TestBridgeStoreClosedToTheApplication(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := setupRights(ctx, t)
	app := roleConn(ctx, t, r.app)

	_, err := app.Exec(ctx, `UPDATE `+r.store+` SET pgdispatch_job_id = $1 WHERE id = $2`, r.victims[0], r.mine)
	requireDenied(t, err, "the application points its row at another writer's job")
	_, err = app.Exec(ctx, `SELECT pgdispatch_job_id FROM `+r.store)
	requireDenied(t, err, "the application reads the store")
	_, err = app.Exec(ctx, `DELETE FROM `+r.store+` WHERE tenant = 'other'`)
	requireDenied(t, err, "the application deletes from the store")

	// Through the view, it does what it did.
	var tenant string
	require.NoError(t, app.QueryRow(ctx, `UPDATE `+r.table+` SET tenant = 'app2' WHERE id = $1 RETURNING tenant`, r.mine).Scan(&tenant))
	require.Equal(t, "app2", tenant)
	tag, err := app.Exec(ctx, `DELETE FROM `+r.table+` WHERE id = $1`, r.mine)
	require.NoError(t, err)
	require.Equal(t, int64(1), tag.RowsAffected())

	// A column's grant moves too.
	var onView, onStore bool
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `SELECT has_column_privilege($1::regrole, $2, 'note$1', 'SELECT'),
		has_column_privilege($1::regrole, $3, 'note$1', 'SELECT')`, r.reader, r.table, r.store).Scan(&onView, &onStore))
	require.True(t, onView, "the reader's column grant on the view")
	require.False(t, onStore, "the reader's column grant left on the store")

	// The revert gives the table its grants back.
	_, err = atworker.Revert(ctx, roleConn(ctx, t, r.owner), r.o)
	require.NoError(t, err)
	var all, column bool
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `SELECT has_table_privilege($1::regrole, $2, 'SELECT, INSERT, UPDATE, DELETE'),
		has_column_privilege($3::regrole, $2, 'note$1', 'SELECT') AND NOT has_column_privilege($3::regrole, $2, 'tenant', 'SELECT')`,
		r.app, r.table, r.reader).Scan(&all, &column))
	require.True(t, all, "the application's grants on the table after the revert")
	require.True(t, column, "the reader's column grant on the table after the revert")
	_, err = app.Exec(ctx, `INSERT INTO `+r.table+` (task_type, payload) VALUES ('noop', '{}')`)
	require.NoError(t, err)
}

// A row pointed at a job the bridge did not make for it (a grant on the
// store given after the switch allows it) leads nowhere: the view does not
// read that job, its triggers neither rewrite nor delete it, and Settle
// does not copy it.
func TestBridgeActsOnlyOnItsOwnJobs(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := setupRights(ctx, t)
	pool := pgtest.Pool(t)
	jobs := pgx.Identifier{r.pgd, "jobs"}.Sanitize()
	// A grant to every table of the schema, given after the switch.
	_, err := roleConn(ctx, t, r.owner).Exec(ctx, fmt.Sprintf("GRANT ALL ON ALL TABLES IN SCHEMA %s TO %s", r.schema, r.app))
	require.NoError(t, err)
	app := roleConn(ctx, t, r.app)

	for _, victim := range r.victims {
		var payload string
		require.NoError(t, pool.QueryRow(ctx, `SELECT payload::text FROM `+jobs+` WHERE id = $1`, victim).Scan(&payload))
		_, err := app.Exec(ctx, `UPDATE `+r.store+` SET pgdispatch_job_id = $1 WHERE id = $2`, victim, r.mine)
		require.NoError(t, err)

		var errorMessage *string
		var late bool
		require.NoError(t, app.QueryRow(ctx, `SELECT error_message, execute_at > now() + interval '30 minutes' FROM `+r.table+` WHERE id = $1`,
			r.mine).Scan(&errorMessage, &late))
		require.Nil(t, errorMessage, "job %d's state read through the view", victim)
		require.False(t, late, "job %d's run_at read through the view", victim)

		_, err = pool.Exec(ctx, `UPDATE `+jobs+` SET status = 'dead', finished_at = now() WHERE id = $1`, victim)
		require.NoError(t, err)
		_, err = atworker.Settle(ctx, pool, r.pgd, 10*time.Second)
		require.NoError(t, err)
		require.NoError(t, app.QueryRow(ctx, `SELECT error_message FROM `+r.store+` WHERE id = $1`, r.mine).Scan(&errorMessage))
		require.Nil(t, errorMessage, "job %d's state copied into the row by Settle", victim)
		_, err = pool.Exec(ctx, `UPDATE `+jobs+` SET status = 'pending', finished_at = NULL WHERE id = $1`, victim)
		require.NoError(t, err)

		_, _ = app.Exec(ctx, `UPDATE `+r.table+` SET payload = '{"url": "http://attacker.test/"}', execute_at = now(), error_message = 'x' WHERE id = $1`, r.mine)
		var after string
		var due bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT payload::text, run_at <= now() FROM `+jobs+` WHERE id = $1`, victim).Scan(&after, &due))
		require.Equal(t, payload, after, "job %d rewritten through the view", victim)
		require.False(t, due, "job %d made due through the view", victim)

		_, _ = app.Exec(ctx, `DELETE FROM `+r.table+` WHERE id = $1`, r.mine)
		var exists bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT FROM `+jobs+` WHERE id = $1)`, victim).Scan(&exists))
		require.True(t, exists, "job %d deleted through the view", victim)

		require.NoError(t, app.QueryRow(ctx, `INSERT INTO `+r.table+` (task_type, payload, tenant)
			VALUES ('http_callback', '{"url": "http://app.test/"}', 'app') RETURNING id`).Scan(&r.mine))
	}
}

// A writer of the jobs table that takes the key of a row's job ahead of
// it makes the producer's INSERT fail, with an error a producer does not
// take for a duplicate of its own row (unique_violation).
func TestBridgeKeyTakenIsNoDuplicate(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, pool, pgd, schema, table := b.ctx, b.pool, b.pgd, b.schema, b.table
	_, err := atworker.Switch(ctx, pool, atworker.Options{Schema: pgd, Table: table})
	require.NoError(t, err)
	var comment string
	require.NoError(t, pool.QueryRow(ctx, `SELECT col_description(to_regclass($1), a.attnum) FROM pg_attribute a
		WHERE a.attrelid = to_regclass($1) AND a.attname = 'pgdispatch_job_id'`, pgx.Identifier{schema, "scheduled_tasks_at_worker"}.Sanitize()).Scan(&comment))
	var taken string
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+pgx.Identifier{pgd, "jobs"}.Sanitize()+` (kind, dedup_key)
		VALUES ('noop', ($1::jsonb->>'dedup_key_prefix') || '1') RETURNING dedup_key`, comment).Scan(&taken))
	require.Contains(t, taken, "at-worker:")

	_, err = pool.Exec(ctx, `INSERT INTO `+table+` (task_type, payload) VALUES ('noop', '{}')`)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "%v", err)
	require.NotEqual(t, "23505", pgErr.Code, "a producer takes it for its own row inserted before: %v", err)
	require.Contains(t, pgErr.Message, "is held by another job")
}
