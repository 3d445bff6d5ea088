package main

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/migrations"
)

// runExit runs the command and returns its exit code, stdout and stderr.
func (a *adminOutput) runExit(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	p := start(t, a.env, args...)
	code := p.wait(t, 30*time.Second)
	return code, p.stdout.String(), p.stderr.String()
}

// A command that did nothing exits non-zero: ids that match no job, or no
// job the command applies to, and a pause or resume that found the queue
// as asked already.
func TestControlsThatDidNothingFail(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	a := &adminOutput{schema: schema, env: dbEnv(schema)}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var id int64
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, `INSERT INTO `+pgx.Identifier{schema, "jobs"}.Sanitize()+
		` (kind, queue) VALUES ('noop', 'mail') RETURNING id`).Scan(&id))
	jobID := strconv.FormatInt(id, 10)

	for _, c := range []struct {
		args         []string
		stdout, says string
	}{
		{[]string{"jobs", "cancel", "999999"}, "job 999999: not found\n", "no job was cancelled"},
		{[]string{"jobs", "retry", "999999"}, "job 999999: not found\n", "no job was retried"},
		{[]string{"jobs", "snooze", "--for", "1m", "999999"}, "job 999999: not found\n", "no job was snoozed"},
		{[]string{"jobs", "retry", jobID}, "job " + jobID + ": left as it is: pending, not dead or cancelled\n", "no job was retried"},
		{[]string{"jobs", "cancel", jobID, "999999"}, "job " + jobID + ": cancelled (was pending)\njob 999999: not found\n", "not found: job 999999"},
		{[]string{"queues", "resume", "mail"}, "queue mail: not paused\n", "nothing changed"},
	} {
		code, stdout, stderr := a.runExit(t, c.args...)
		require.Equal(t, 1, code, "%v exits 1: %s%s", c.args, stdout, stderr)
		require.Equal(t, c.stdout, stdout, c.args)
		require.Contains(t, stderr, c.says, c.args)
	}
	code, _, stderr := a.runExit(t, "queues", "pause", "mail")
	require.Equal(t, 0, code, stderr)
	code, stdout, _ := a.runExit(t, "queues", "pause", "mail")
	require.Equal(t, 1, code)
	require.Equal(t, "queue mail: already paused\n", stdout)
}

// A queue that no job, schedule or dispatch trigger names, and that no
// worker serves, is refused by queues pause unless --force is given: a
// mistyped name would otherwise be "paused" and listed for good. A forced
// pause lists the queue while it is paused, and no longer once resumed.
func TestPauseRefusesAnUnknownQueue(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	a := &adminOutput{schema: schema, env: dbEnv(schema)}

	code, stdout, stderr := a.runExit(t, "queues", "pause", "nosuchqueue")
	require.Equal(t, 1, code, stdout+stderr)
	require.Contains(t, stderr, `queue "nosuchqueue" is unknown`)
	require.Contains(t, stderr, "--force")
	require.NotContains(t, a.run(t, "queues", "list"), "nosuchqueue")

	require.Equal(t, "queue nosuchqueue: paused\n", a.run(t, "queues", "pause", "--force", "nosuchqueue"))
	require.Regexp(t, `(?m)^nosuchqueue\s+paused\s`, a.run(t, "queues", "list"))
	require.Equal(t, "queue nosuchqueue: resumed\n", a.run(t, "queues", "resume", "nosuchqueue"))
	require.NotContains(t, a.run(t, "queues", "list"), "nosuchqueue", "a resumed queue with no jobs is not listed")

	// A queue a schedule names, or a dispatch trigger, is known.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := pgtest.Pool(t).Exec(ctx, `SELECT `+pgx.Identifier{schema, "schedule"}.Sanitize()+`('nightly', '0 2 * * *', 'noop', queue => 'reports')`)
	require.NoError(t, err)
	require.Equal(t, "queue reports: paused\n", a.run(t, "queues", "pause", "reports"))

	// A queue a worker serves is known while the worker sleeps on it.
	start(t, dbEnv(schema, "QUEUES=idle", "POLL_INTERVAL=1h"), "run") // its stderr is logged should the test fail
	pgtest.WaitSQL(t, 30*time.Second, "the worker to sleep on its queue", `SELECT EXISTS (SELECT FROM pg_locks
		WHERE locktype = 'advisory' AND objsubid = 2
		  AND classid = ($1::int8 & 4294967295)::oid AND objid = (hashtext('idle')::int8 & 4294967295)::oid)`,
		migrations.SleepKey(schema))
	require.Equal(t, "queue idle: paused\n", a.run(t, "queues", "pause", "idle"))
}
