package pgdispatch_test

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/admin"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
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
	_, _ = breakerWorker(t, schema, "aliases", newOutcomes(), time.Hour)
	u, err := url.Parse(rc.URL)
	require.NoError(t, err)
	port := u.Port()
	ep := "http://127.0.0.1:" + port
	require.Equal(t, ep, endpointOf(t, rc.URL))
	localhost := "http://localhost:" + port

	ctx := context.Background()
	a := admin.New(pgtest.Pool(t), schema, 10*time.Second)
	for _, e := range []string{ep, localhost} {
		disabled, err := a.DisableEndpoint(ctx, e, "", admin.EventJob{})
		require.NoError(t, err)
		require.True(t, disabled)
	}

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

	// Each job's last_error names its endpoint's host:port for jobs retry,
	// and that host selects it.
	hosts := map[string]bool{}
	for id, want := range ids {
		var lastError string
		require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "SELECT last_error FROM "+jobs+" WHERE id = $1", id).Scan(&lastError))
		host := strings.TrimPrefix(want, "http://")
		require.Contains(t, lastError, "endpoint "+want+" is disabled", id)
		require.Contains(t, lastError, "--all-dead --host "+host+" --yes", id)
		hosts[host] = true
	}
	for host := range hosts {
		var want []int64
		for id, e := range ids {
			if e == "http://"+host {
				want = append(want, id)
			}
		}
		c, err := a.CountDead(ctx, admin.DeadFilter{Host: host}, 100)
		require.NoError(t, err)
		require.ElementsMatch(t, want, c.FirstIDs, host)
	}
}
