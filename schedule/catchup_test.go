package schedule_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/timing"
)

// Writers set cron schedules' next_run_at far into the past under
// catch_up all: each pass that fires them must still finish within its
// timeout (a pass computes slots for a bounded time between statements, so
// that the server's idle timeout never ends a busy pass, and leaves the
// rest to the next pass, at once), and each creates its latest
// catch_up_limit jobs.
func TestFarBehindSchedulesFireWithinTheTimeout(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	fn := pgx.Identifier{e.schema, "schedule"}.Sanitize()
	for _, name := range []string{"old1", "old2", "old3", "old4", "old5", "old6", "old7", "old8", "old9", "old10"} {
		e.exec(t, "SELECT "+fn+"($1, '* * * * *', 'noop', catch_up => 'all', catch_up_limit => 1000)", name)
	}
	e.exec(t, "SELECT "+fn+"('fine', NULL, 'noop', every => '1 second')")
	e.exec(t, "UPDATE "+e.schedules+" SET next_run_at = '0001-01-01 00:00:00+00' WHERE name LIKE 'old%'")
	s := newScheduler(t, e, nil)
	var created, passes int64
	for {
		start := time.Now()
		res, err := s.Pass(context.Background())
		t.Logf("%+v", res)
		require.NoError(t, err)
		timing.Below(t, "the pass", time.Since(start), 5*time.Second)
		created += res.Created
		passes++
		if res.Wait > 0 {
			break
		}
		require.Less(t, passes, int64(20), "the passes make progress")
	}
	// Each creates its latest 1000 slots, and one more if a minute began
	// between the pass that caught it up and the last; and "fine" one a
	// second.
	rows, err := pgtest.Pool(t).Query(context.Background(),
		"SELECT split_part(dedup_key, ':', 2), count(*) FROM "+e.jobs+" WHERE dedup_key LIKE 'schedule:old%' GROUP BY 1")
	require.NoError(t, err)
	counts, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct {
		Name string
		N    int64
	}])
	require.NoError(t, err)
	require.Len(t, counts, 10)
	var old int64
	for _, c := range counts {
		require.GreaterOrEqual(t, c.N, int64(1000), c.Name)
		require.LessOrEqual(t, c.N, int64(1001), c.Name)
		old += c.N
	}
	require.LessOrEqual(t, created, old+passes+1)
}

// insert_scheduled_jobs creates no job for a paused schedule: the workers
// may call it, but only an operator pauses and resumes.
func TestInsertScheduledJobsSkipsPausedSchedules(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.exec(t, "SELECT "+pgx.Identifier{e.schema, "schedule"}.Sanitize()+"('p', '@daily', 'noop')")
	e.exec(t, "SELECT "+pgx.Identifier{e.schema, "pause_schedule"}.Sanitize()+"('p')")
	e.exec(t, "SELECT "+pgx.Identifier{e.schema, "insert_scheduled_jobs"}.Sanitize()+
		"(array(SELECT id FROM "+e.schedules+"), ARRAY[now()])")
	require.Empty(t, e.keys(t))
}

// resume_schedule(), a new schedule() and a change of timing inside a
// longer transaction start the schedule from the statement, not from the
// transaction's start: the slots before it, which passed while the
// schedule was paused, or before it existed, are not caught up.
func TestRestartPointIsTheStatementsClock(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	fn := pgx.Identifier{e.schema, "schedule"}.Sanitize()
	e.exec(t, "SELECT "+fn+"('paused', NULL, 'noop', every => '1 second', catch_up => 'all')")
	e.exec(t, "SELECT "+pgx.Identifier{e.schema, "pause_schedule"}.Sanitize()+"('paused')")
	e.exec(t, "SELECT "+fn+"('retimed', '@yearly', 'noop', catch_up => 'all')")

	tx, err := pgtest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit, a no-op
	// A transaction that has been open a while: a whole second, and so a
	// slot of every second, passes before its statements.
	var began, before time.Time
	require.NoError(t, tx.QueryRow(ctx, "SELECT now(), clock_timestamp() FROM pg_sleep(1.2)").Scan(&began, &before))
	_, err = tx.Exec(ctx, "SELECT "+pgx.Identifier{e.schema, "resume_schedule"}.Sanitize()+"('paused'), "+
		fn+"('new', NULL, 'noop', every => '1 second', catch_up => 'all')")
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "UPDATE "+e.schedules+" SET cron = NULL, every = '1 second' WHERE name = 'retimed'")
	require.NoError(t, err)
	var committed time.Time
	require.NoError(t, tx.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&committed))
	require.NoError(t, tx.Commit(ctx))

	s := newScheduler(t, e, func() time.Time { return committed })
	res, err := s.Pass(ctx)
	require.NoError(t, err)
	t.Logf("transaction began %s, statements at %s: %+v", began.Format(time.StampMilli), before.Format(time.StampMilli), res)
	require.Zero(t, res.Missed)
	require.Zero(t, res.CaughtUp)
	rows, _ := pgtest.Pool(t).Query(ctx, "SELECT dedup_key, run_at FROM "+e.jobs+" ORDER BY id")
	type job struct {
		Key string
		At  time.Time
	}
	jobs, err := pgx.CollectRows(rows, pgx.RowToStructByPos[job])
	require.NoError(t, err)
	for _, j := range jobs {
		require.False(t, j.At.Before(before), "%s is for a slot before the statement that started its schedule (%s)", j.Key, before)
	}
}
