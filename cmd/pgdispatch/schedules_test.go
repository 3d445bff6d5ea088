package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/wait"
)

// The schedules commands as an operator uses them: a declaration refused
// with the workers' own message, one with an unknown kind warned about,
// list and stats with a running worker's next run, pause, resume and
// remove.
func TestSchedulesCommands(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	e := dbEnv(schema)
	run := func(want int, args ...string) (string, string) {
		t.Helper()
		p := start(t, e, args...)
		require.Equal(t, want, p.wait(t, 30*time.Second), "pgdispatch %s\n%s%s", strings.Join(args, " "), p.stdout, p.stderr)
		return p.stdout.String(), p.stderr.String()
	}

	_, errOut := run(1, "schedules", "add", "nightly", "--cron", "0 2 * * 8", "--kind", "noop")
	require.Contains(t, errOut, `schedule nightly: cron "0 2 * * 8": end of range (8) above maximum (6)`)
	_, errOut = run(1, "schedules", "add", "nightly", "--cron", "0 2 * * *", "--time-zone", "Europe/Berlim", "--kind", "noop")
	require.Contains(t, errOut, `time zone "Europe/Berlim" is unknown`)
	_, errOut = run(1, "schedules", "add", "nightly", "--cron", "0 2 * * *", "--every", "1h", "--kind", "noop")
	require.Contains(t, errOut, "not both")

	out, errOut := run(0, "schedules", "add", "nightly", "--cron", "0 2 * * *", "--time-zone", "Europe/Berlin", "--kind", "reports",
		"--payload", `{"url": "https://user:secret@example.com/"}`)
	require.Equal(t, "schedule nightly: added\n", out)
	require.Contains(t, errOut, "warning: kind reports is none of pgdispatch's executors")
	out, _ = run(0, "schedules", "add", "tick", "--every", "1h", "--kind", "noop", "--catch-up", "all", "--priority", "-1")
	require.Equal(t, "schedule tick: added\n", out)
	out, _ = run(0, "schedules", "add", "tick", "--every", "1h", "--kind", "noop")
	require.Equal(t, "schedule tick: declared (changed only where it differed)\n", out)

	// A worker computes the next runs; the notification of the declaration
	// (or its first pass) wakes it.
	w := start(t, e, "run", "--poll-interval", "1h")
	w.stderr.waitFor(t, "scheduler started", 30*time.Second)
	wait.For(t, 30*time.Second, "the next runs in schedules list", func() bool {
		out, _ = run(0, "schedules", "list")
		return !strings.Contains(out, "a worker computes it")
	})
	require.NotContains(t, out, "secret", "payloads are masked")
	require.Regexp(t, `(?m)^nightly +0 2 \* \* \* +Europe/Berlin +reports +default +skip +enabled +\d{4}-\d\d-\d\dT0[01]:00:00Z +- +0 +0 +0 +0 +\{"url":"https://user:xxxxx@example\.com/"\}$`, out)
	require.Regexp(t, `(?m)^tick +every 1h0m0s +UTC +noop +default +all \(100\) +enabled +\d{4}-\d\d-\d\dT\d\d:00:00Z +- +0 +0 +0 +0 +\{\}$`, out)
	out, _ = run(0, "stats")
	require.Regexp(t, `(?m)^SCHEDULE +TIMING +STATE +NEXT RUN +LAST RUN +RUNS +MISSED +CAUGHT UP +TAKEN$`, out)
	require.Regexp(t, `(?m)^tick +every 1h0m0s +enabled +\d{4}-`, out)

	// A slot whose key another job held: counted, and its warning below.
	_, err := pgtest.Pool(t).Exec(context.Background(), "UPDATE "+pgx.Identifier{schema, "schedules"}.Sanitize()+
		" SET taken = 1, warning = 'slot 2026-11-27T10:00:00Z: its key is held by job 7' WHERE name = 'tick'")
	require.NoError(t, err)
	out, _ = run(0, "schedules", "list")
	require.Regexp(t, `(?m)^tick +every 1h0m0s +UTC +noop +default +all \(100\) +enabled +\S+ +- +0 +0 +0 +1 +\{\}$`, out)
	require.Contains(t, out, "schedule tick: warning: slot 2026-11-27T10:00:00Z: its key is held by job 7\n")

	out, _ = run(0, "schedules", "pause", "tick")
	require.Equal(t, "schedule tick: paused\n", out)
	out, _ = run(1, "schedules", "pause", "tick") // a command that did nothing exits non-zero
	require.Equal(t, "schedule tick: already paused\n", out)
	out, _ = run(0, "schedules", "list")
	require.Regexp(t, `(?m)^tick +every 1h0m0s +UTC +noop +default +all \(100\) +paused +- +`, out)
	out, _ = run(0, "schedules", "resume", "tick")
	require.Equal(t, "schedule tick: resumed\n", out)
	out, _ = run(0, "schedules", "remove", "tick")
	require.Equal(t, "schedule tick: removed\n", out)
	_, errOut = run(1, "schedules", "remove", "tick")
	require.Contains(t, errOut, "schedule tick: no such schedule")
	_, errOut = run(1, "schedules", "resume", "tick")
	require.Contains(t, errOut, `resume schedule "tick": no such schedule`)
	out, _ = run(0, "schedules", "list", "--json", "--reveal")
	require.Contains(t, out, "user:secret@")
}
