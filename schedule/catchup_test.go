package schedule_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// Writers set cron schedules' next_run_at far into the past under
// catch_up all: the pass that fires it must still finish within its
// timeout, and each creates its latest catch_up_limit jobs.
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
	start := time.Now()
	res, err := s.Pass(context.Background())
	t.Logf("pass took %s: %+v", time.Since(start), res)
	require.NoError(t, err)
	require.Less(t, time.Since(start), 5*time.Second)
	// Each creates its latest 1000 slots; and "fine" one, once its first
	// second has come.
	require.GreaterOrEqual(t, res.Created, int64(10*1000))
	require.LessOrEqual(t, res.Created, int64(10*1000+1))
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
