package pgdispatch_test

import (
	"context"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/admin"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/wait"
)

// An operator disables a receiver's endpoint. A writer's URL that names
// the same receiver in another form (a port with leading zeros, an IPv6
// form of its IPv4 address, a host with a trailing dot) is the same
// endpoint: its job is dead, unsent, like the others, and the command its
// last_error names retries it once the endpoint is enabled.
func TestDisabledEndpointHasNoAliases(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	rc := newReceiver(t, false)
	br, _ := breakerWorker(t, schema, "aliases", newOutcomes(), time.Hour)
	u, err := url.Parse(rc.URL)
	require.NoError(t, err)
	port := u.Port()
	ep := "http://127.0.0.1:" + port
	require.Equal(t, ep, endpointOf(t, rc.URL))
	localhost := "http://localhost:" + port

	ctx := context.Background()
	// A job of the host that died before, of another failure: the
	// command that the disabled endpoint's jobs name does not retry it.
	var before int64
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "INSERT INTO "+jobs+` (kind, payload, status, attempts, finished_at, last_error)
		VALUES ('http_callback', jsonb_build_object('url', $1::text), 'dead', 1, now() - interval '1 hour', 'HTTP 410 Gone') RETURNING id`,
		rc.URL+"/gone").Scan(&before))
	a := admin.New(pgtest.Pool(t), schema, 10*time.Second)
	for _, e := range []string{ep, localhost} {
		disabled, err := a.DisableEndpoint(ctx, e, "", admin.EventJob{})
		require.NoError(t, err)
		require.True(t, disabled)
	}
	// The worker hears of it on its notification: until then a job of the
	// endpoint goes, as to a closed one.
	wait.For(t, time.Minute, "the worker knows both disabled", func() bool {
		return br.State(ep) == "disabled" && br.State(localhost) == "disabled"
	})

	aliases := map[string]string{
		"http://127.0.0.1:0" + port + "/hook":                      ep,
		"http://127.0.0.1:00" + port + "/hook":                     ep,
		"http://[::ffff:127.0.0.1]:" + port + "/hook":              ep,
		"http://[0:0:0:0:0:ffff:7f00:1]:" + port + "/hook":         ep,
		"http://LOCALHOST.:" + port + "/hook":                      localhost,
		"http://user:pw@localhost.:" + port + "/hook?token=s3cret": localhost,
	}
	ids := map[int64]string{}
	for raw, want := range aliases {
		ids[enqueueTo(t, schema, raw, 1)[0]] = want
	}
	all := make([]int64, 0, len(ids))
	for id := range ids {
		all = append(all, id)
	}
	pgtest.WaitSQL(t, time.Minute, "every job done or dead",
		"SELECT count(*) = $2 FROM "+jobs+" WHERE id = ANY($1) AND status IN ('done', 'dead')", all, len(all))
	for id := range ids {
		var raw string
		require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "SELECT payload->>'url' FROM "+jobs+" WHERE id = $1", id).Scan(&raw))
		require.Zero(t, rc.requests(id), "job %d to %s sent to a disabled endpoint", id, raw)
	}
	// Their attempts count what was tried: nothing.
	require.Equal(t, 0, queryInt(t, "SELECT coalesce(sum(attempts), 0)::int FROM "+jobs+" WHERE id = ANY($1)", all))

	// Each job's last_error names its endpoint's host:port and the time
	// it was disabled for jobs retry, which select it, and not the job
	// that died before.
	command := regexp.MustCompile(`--all-dead --host (\S+) --since (\S+) --yes`)
	filters := map[admin.DeadFilter]bool{}
	for id, want := range ids {
		var lastError string
		require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "SELECT last_error FROM "+jobs+" WHERE id = $1", id).Scan(&lastError))
		require.Contains(t, lastError, "endpoint "+want+" is disabled", id)
		m := command.FindStringSubmatch(lastError)
		require.NotNil(t, m, lastError)
		require.Equal(t, strings.TrimPrefix(want, "http://"), m[1], id)
		since, err := time.Parse(time.RFC3339, m[2])
		require.NoError(t, err)
		filters[admin.DeadFilter{Host: m[1], Since: since}] = true
	}
	require.Len(t, filters, 2, "one command for each endpoint")
	for f := range filters {
		var want []int64
		for id, e := range ids {
			if e == "http://"+f.Host {
				want = append(want, id)
			}
		}
		c, err := a.CountDead(ctx, f, 100)
		require.NoError(t, err)
		require.ElementsMatch(t, want, c.FirstIDs, f.Host)
		require.NotContains(t, c.FirstIDs, before)
		if f.Host != strings.TrimPrefix(ep, "http://") {
			continue
		}
		// Enabled, the command's jobs are sent, each attempt a request.
		enabled, err := a.EnableEndpoint(ctx, ep, admin.EventJob{})
		require.NoError(t, err)
		require.True(t, enabled)
		n, err := a.RetryDeadMatching(ctx, f)
		require.NoError(t, err)
		require.EqualValues(t, len(want), n)
		pgtest.WaitSQL(t, time.Minute, "the retried jobs done",
			"SELECT count(*) = $2 FROM "+jobs+" WHERE id = ANY($1) AND status = 'done'", want, len(want))
		for _, id := range want {
			require.Equal(t, rc.requests(id), queryInt(t, "SELECT attempts FROM "+jobs+" WHERE id = $1", id), "job %d", id)
		}
	}
}

func queryInt(t *testing.T, sql string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, pgtest.Pool(t).QueryRow(context.Background(), sql, args...).Scan(&n))
	return n
}
