package atworker_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/atworker"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

// waitBlocked waits until a session whose query contains marker waits on a
// lock.
func waitBlocked(t *testing.T, marker string) {
	t.Helper()
	pgtest.WaitSQL(t, 20*time.Second, "a session of "+marker+" to wait on a lock", `SELECT EXISTS (SELECT FROM pg_stat_activity
		WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0 AND pid <> pg_backend_pid())`, marker)
}

// An AT Worker's cleaner reading a row as processing (its job running)
// whose job finishes before the trigger locks it: the UPDATE must not make
// the finished job pending again, which would deliver it twice.
func TestReviewCleanerRacingAFinishingJob(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := pgtest.Pool(t)
	pgd := pgtest.FreshSchema(t)
	_, table := appSchema(t)
	_, err := pool.Exec(ctx, `INSERT INTO `+table+` (task_type, payload) VALUES ('noop', '{}')`)
	require.NoError(t, err)
	_, err = atworker.Switch(ctx, pool, atworker.Options{Schema: pgd, Table: table})
	require.NoError(t, err)
	jobs := pgx.Identifier{pgd, "jobs"}.Sanitize()
	// A worker has run it for ten minutes.
	_, err = pool.Exec(ctx, `UPDATE `+jobs+` SET status = 'running', attempts = 1, locked_by = 'w1',
		locked_until = now() + interval '1 minute', updated_at = now() - interval '10 minutes'`)
	require.NoError(t, err)

	// The worker's completion is under way when the cleaner runs.
	finish, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = finish.Rollback(ctx) }()
	_, err = finish.Exec(ctx, `UPDATE `+jobs+` SET status = 'done', finished_at = now(), locked_by = NULL, updated_at = now()`)
	require.NoError(t, err)

	marker := "cleaner " + pgd
	cleaned := make(chan error, 1)
	go func() {
		_, err := pool.Exec(ctx, `/* `+marker+` */ UPDATE `+table+` SET status = 'pending', attempts = attempts + 1, updated_at = NOW()
			WHERE status = 'processing' AND updated_at < NOW() - INTERVAL '5 minutes'`)
		cleaned <- err
	}()
	waitBlocked(t, marker)
	require.NoError(t, finish.Commit(ctx))
	require.NoError(t, <-cleaned)

	var status string
	require.NoError(t, pool.QueryRow(ctx, `SELECT status FROM `+jobs).Scan(&status))
	require.Equal(t, "done", status, "the cleaner made a delivered job pending again: it runs twice")
}

// A job running at the revert fails and is due again; Wait sees it pending,
// but a worker claims it before Wait cancels it. Wait must not hand the row
// to the AT Worker while pgdispatch runs the job.
func TestReviewWaitRacingAClaim(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := pgtest.Pool(t)
	pgd := pgtest.FreshSchema(t)
	_, table := appSchema(t)
	_, err := pool.Exec(ctx, `INSERT INTO `+table+` (task_type, payload) VALUES ('noop', '{}')`)
	require.NoError(t, err)
	o := atworker.Options{Schema: pgd, Table: table}
	_, err = atworker.Switch(ctx, pool, o)
	require.NoError(t, err)
	jobs := pgx.Identifier{pgd, "jobs"}.Sanitize()
	_, err = pool.Exec(ctx, `UPDATE `+jobs+` SET status = 'running', attempts = 1, locked_by = 'w1', locked_until = now() + interval '1 minute'`)
	require.NoError(t, err)
	res, err := atworker.Revert(ctx, pool, o)
	require.NoError(t, err)
	require.Len(t, res.Running, 1)

	// The attempt fails and the job is due again.
	_, err = pool.Exec(ctx, `UPDATE `+jobs+` SET status = 'pending', locked_by = NULL, run_at = now(), last_error = 'boom'`)
	require.NoError(t, err)
	// A worker's claim has the row locked.
	claim, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = claim.Rollback(ctx) }()
	_, err = claim.Exec(ctx, `SELECT id FROM `+jobs+` FOR UPDATE`)
	require.NoError(t, err)

	type result struct {
		w   atworker.WaitResult
		err error
	}
	waited := make(chan result, 1)
	go func() {
		w, err := atworker.Wait(ctx, pool, pgd, res.Table, res.Running, 30*time.Second, 10*time.Second)
		waited <- result{w, err}
	}()
	// Wait's cancel waits for the claim, and the claim takes the job.
	pgtest.WaitSQL(t, 20*time.Second, "Wait's cancel to wait on the claim", `SELECT EXISTS (SELECT FROM pg_stat_activity
		WHERE wait_event_type = 'Lock' AND strpos(query, 'handed back') > 0 AND strpos(query, $1) > 0)`, pgd)
	_, err = claim.Exec(ctx, `UPDATE `+jobs+` SET status = 'running', attempts = 2, locked_by = 'w2', locked_until = now() + interval '1 minute'`)
	require.NoError(t, err)
	require.NoError(t, claim.Commit(ctx))
	// The second attempt succeeds.
	_, err = pool.Exec(ctx, `UPDATE `+jobs+` SET status = 'done', finished_at = now(), locked_by = NULL`)
	require.NoError(t, err)
	r := <-waited
	require.NoError(t, r.err)

	var row string
	require.NoError(t, pool.QueryRow(ctx, `SELECT status FROM `+table).Scan(&row))
	require.Equal(t, "completed", row, "the row was handed to the AT Worker while pgdispatch ran its job: delivered twice")
}

// A column whose name holds the functions' dollar quote.
func TestReviewColumnWithDollarQuote(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := pgtest.Pool(t)
	pgd := pgtest.FreshSchema(t)
	_, table := appSchema(t)
	_, err := pool.Exec(ctx, `ALTER TABLE `+table+` ADD COLUMN "note$body$" text DEFAULT 'x'`)
	require.NoError(t, err)
	_, err = atworker.Switch(ctx, pool, atworker.Options{Schema: pgd, Table: table})
	require.NoError(t, err)
	var note string
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+table+` (task_type, payload, "note$body$") VALUES ('noop', '{}', 'n') RETURNING "note$body$"`).Scan(&note))
	require.Equal(t, "n", note)
}

// Two switches at once: the second reports the table already switched.
func TestReviewConcurrentSwitches(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := pgtest.Pool(t)
	pgd := pgtest.FreshSchema(t)
	_, table := appSchema(t)
	// The first switch's lock is held while the second starts.
	hold, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = hold.Rollback(ctx) }()
	_, err = hold.Exec(ctx, `LOCK TABLE `+table+` IN ACCESS SHARE MODE`)
	require.NoError(t, err)
	type result struct {
		plan atworker.Plan
		err  error
	}
	done := make(chan result, 2)
	for i := 0; i < 2; i++ {
		go func() {
			p, err := atworker.Switch(ctx, pool, atworker.Options{Schema: pgd, Table: table, LockWait: 20 * time.Second})
			done <- result{p, err}
		}()
	}
	pgtest.WaitSQL(t, 20*time.Second, "both switches to wait on the table's lock",
		`SELECT count(*) >= 2 FROM pg_locks WHERE relation = to_regclass($1) AND NOT granted`, table)
	require.NoError(t, hold.Commit(ctx))
	a, b := <-done, <-done
	require.NoError(t, a.err)
	require.NoError(t, b.err)
	require.NotEqual(t, a.plan.AlreadySwitched, b.plan.AlreadySwitched, "one switches, the other finds it switched")
}

// newRole makes a role of the test's own, dropped when it ends.
func newRole(ctx context.Context, t *testing.T, what string) string {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	role := pgx.Identifier{"pgdt_" + hex.EncodeToString(b) + "_" + what}.Sanitize()
	_, err := pgtest.Pool(t).Exec(ctx, "CREATE ROLE "+role+" NOLOGIN")
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = pgtest.Pool(t).Exec(ctx, "DROP OWNED BY "+role+"; DROP ROLE "+role)
	})
	return role
}

// ownedTable gives the AT Worker's table to a role of the application's
// own, which has no privileges on pgdispatch, and a producer role with
// INSERT on it.
func ownedTable(ctx context.Context, t *testing.T) (schema, table, owner, producer string) {
	t.Helper()
	pool := pgtest.Pool(t)
	sch, table := appSchema(t)
	schema = pgx.Identifier{sch}.Sanitize()
	owner, producer = newRole(ctx, t, "app"), newRole(ctx, t, "producer")
	_, err := pool.Exec(ctx, fmt.Sprintf(`GRANT ALL ON SCHEMA %[1]s TO %[2]s; GRANT USAGE ON SCHEMA %[1]s TO %[3]s;
		ALTER TABLE %[4]s OWNER TO %[2]s;
		GRANT INSERT ON %[4]s TO %[3]s; GRANT USAGE ON SEQUENCE %[1]s.scheduled_tasks_id_seq TO %[3]s;
		CREATE TABLE %[1]s.seen (who text, super bool); ALTER TABLE %[1]s.seen OWNER TO %[2]s`, schema, owner, producer, table))
	require.NoError(t, err)
	return schema, table, owner, producer
}

// A superuser switches a table the application's role owns, and that role
// inserts into it as it did: the view must let its owner in.
func TestReviewTableOwnerKeepsAccess(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := pgtest.Pool(t)
	pgd := pgtest.FreshSchema(t)
	_, table, owner, _ := ownedTable(ctx, t)
	_, err := pool.Exec(ctx, fmt.Sprintf(`SET ROLE %s; INSERT INTO %s (task_type, payload) VALUES ('noop', '{}'); RESET ROLE`, owner, table))
	require.NoError(t, err)
	_, err = atworker.Switch(ctx, pool, atworker.Options{Schema: pgd, Table: table})
	require.ErrorContains(t, err, "needs USAGE on schema", "the owner, whose rights the view's functions run with, has none on the jobs")
	grantJobs(ctx, t, pgd, owner)
	_, err = atworker.Switch(ctx, pool, atworker.Options{Schema: pgd, Table: table})
	require.NoError(t, err)
	conn, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer conn.Release()
	_, err = conn.Exec(ctx, "SET ROLE "+owner)
	require.NoError(t, err)
	defer func() { _, _ = conn.Exec(context.Background(), "RESET ROLE") }()
	_, err = conn.Exec(ctx, `INSERT INTO `+table+` (task_type, payload) VALUES ('noop', '{}')`)
	require.NoError(t, err, "the table's owner, its producer, can no longer insert")
}

// The table's owner puts a trigger of its own on the store; a producer's
// INSERT through the view runs it. It must not run as the role that ran
// the switch (a superuser): the owner would be a superuser.
func TestReviewStoreTriggerRunsAsSwitcher(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := pgtest.Pool(t)
	pgd := pgtest.FreshSchema(t)
	schema, table, owner, producer := ownedTable(ctx, t)
	grantJobs(ctx, t, pgd, owner)
	_, err := atworker.Switch(ctx, pool, atworker.Options{Schema: pgd, Table: table})
	require.NoError(t, err)
	_, err = pool.Exec(ctx, fmt.Sprintf(`SET ROLE %[2]s;
		CREATE FUNCTION %[1]s.spy() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO %[1]s.seen SELECT current_user, rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user;
			RETURN NEW;
		END $$;
		CREATE TRIGGER spy BEFORE INSERT ON %[1]s.scheduled_tasks_at_worker FOR EACH ROW EXECUTE FUNCTION %[1]s.spy();
		RESET ROLE`, schema, owner))
	require.NoError(t, err)
	_, err = pool.Exec(ctx, fmt.Sprintf(`SET ROLE %s; INSERT INTO %s (task_type, payload) VALUES ('noop', '{}'); RESET ROLE`, producer, table))
	require.NoError(t, err)
	var who string
	var super bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT who, super FROM `+schema+`.seen`).Scan(&who, &super))
	require.False(t, super, "the table owner's trigger function ran as superuser %s", who)
}

// grantJobs gives role what the owner of a switched table needs on
// pgdispatch's jobs.
func grantJobs(ctx context.Context, t *testing.T, pgd, role string) {
	t.Helper()
	_, err := pgtest.Pool(t).Exec(ctx, fmt.Sprintf("GRANT USAGE ON SCHEMA %[1]s TO %[2]s; GRANT SELECT, INSERT, UPDATE, DELETE ON %[1]s.jobs TO %[2]s; "+
		"GRANT USAGE ON SEQUENCE %[1]s.jobs_id_seq TO %[2]s",
		pgx.Identifier{pgd}.Sanitize(), role))
	require.NoError(t, err)
}
