package main

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

// jobs retry --all-dead as an operator runs it after a receiver's outage: a
// dry run that counts and changes nothing, then the command it prints, with
// its window fixed, which retries what it counted; and the usage errors.
func TestRetryAllDeadByHost(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	e := dbEnv(schema)
	dead := func(url, ago string) int64 {
		return insert(t, schema, fmt.Sprintf(`INSERT INTO {jobs} (kind, status, attempts, max_attempts, finished_at, payload)
			VALUES ('http_callback', 'dead', 1, 1, now() - interval '%s', jsonb_build_object('url', '%s')) RETURNING id`, ago, url))
	}
	in1 := dead("https://Hooks.Example.com/a", "30 minutes")
	in2 := dead("https://hooks.example.com:443/b", "90 minutes")
	dead("https://hooks.example.com/c", "3 hours")
	dead("https://other.example.com/d", "30 minutes")
	insert(t, schema, `INSERT INTO {jobs} (kind, status, finished_at, payload)
		VALUES ('email', 'dead', now() - interval '30 minutes', '{"url": "https://hooks.example.com/"}') RETURNING id`)
	statuses := func() string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var s string
		require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "SELECT string_agg(id || ':' || status, ' ' ORDER BY id) FROM "+
			pgx.Identifier{schema, "jobs"}.Sanitize()).Scan(&s))
		return s
	}
	run := func(want int, args ...string) (string, string) {
		t.Helper()
		p := start(t, e, args...)
		require.Equal(t, want, p.wait(t, 30*time.Second), "pgdispatch %s\n%s%s", strings.Join(args, " "), p.stdout, p.stderr)
		return p.stdout.String(), p.stderr.String()
	}

	before := statuses()
	out, _ := run(0, "jobs", "retry", "--all-dead", "--host", "hooks.example.com", "--since", "2h")
	require.Contains(t, out, fmt.Sprintf("2 dead jobs match: %d, %d\n", in1, in2))
	require.Contains(t, out, "nothing was changed")
	require.Equal(t, before, statuses(), "a dry run changes nothing")
	m := regexp.MustCompile(`(?m)^  pgdispatch (jobs retry --all-dead --host hooks\.example\.com --since \S+Z --yes)$`).FindStringSubmatch(out)
	require.NotNil(t, m, out)

	// The printed command has the dry run's "2h ago" as a time.
	out, _ = run(0, strings.Fields(m[1])...)
	require.Equal(t, "2 dead jobs retried\n", out)
	after := statuses()
	require.Equal(t, strings.NewReplacer(
		fmt.Sprintf("%d:dead", in1), fmt.Sprintf("%d:pending", in1),
		fmt.Sprintf("%d:dead", in2), fmt.Sprintf("%d:pending", in2)).Replace(before), after)
	out, _ = run(0, "jobs", "retry", "--all-dead", "--host", "hooks.example.com", "--since", "2h")
	require.Equal(t, "0 dead jobs match: nothing to retry\n", out)
	// Retrying what matches nothing did nothing: exit 1.
	out, errOut := run(1, strings.Fields(m[1])...)
	require.Equal(t, "0 dead jobs retried\n", out)
	require.Contains(t, errOut, "no dead job matched: nothing was retried")

	// A bad --since: one line, the usage, exit 2.
	_, errOut = run(2, "jobs", "retry", "--all-dead", "--since", "yesterday")
	first, rest, _ := strings.Cut(errOut, "\n")
	require.Equal(t, `invalid value "yesterday" for flag -since: want an RFC 3339 time (2026-05-01T10:00:00Z) or a duration ago (2h, 90m)`, first)
	require.True(t, strings.HasPrefix(rest, "Usage: pgdispatch jobs retry [flags]"), errOut)
	_, errOut = run(2, "jobs", "retry", "--all-dead", "--since", "1h", "--until", "2h")
	require.Regexp(t, `^--since \(\S+\) must be before --until \(\S+\)\nUsage: `, errOut)

	// --host with another kind.
	_, errOut = run(2, "jobs", "retry", "--all-dead", "--host", "hooks.example.com", "--kind", "email", "--yes")
	first, rest, _ = strings.Cut(errOut, "\n")
	require.Equal(t, "--host selects http_callback jobs: it cannot go with --kind email", first)
	require.True(t, strings.HasPrefix(rest, "Usage: pgdispatch jobs retry [flags]"), errOut)
	_, errOut = run(2, "jobs", "retry", "--all-dead", "--host", "https://hooks.example.com/")
	require.Contains(t, errOut, "--host: want a host name or IP, optionally with :port, not a URL\nUsage: ")
	_, errOut = run(1, "jobs", "retry", "--host", "hooks.example.com", "--yes")
	require.Contains(t, errOut, "--queue, --kind, --since, --until and --host go with --all-dead")
	require.Equal(t, after, statuses(), "no usage error changes anything")
}
