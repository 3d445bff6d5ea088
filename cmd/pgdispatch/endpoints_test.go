package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

// endpoints list shows the endpoints not closed first, with their state,
// counts, when they opened and until when, and the reason cut short; its
// JSON has every column.
func TestEndpointsList(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	a := &adminOutput{schema: schema, env: dbEnv(schema)}

	code, stdout, stderr := a.runExit(t, "endpoints", "list")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "ENDPOINT  STATE  ATTEMPTS  FAILURES  OPENED  OPEN UNTIL  DISABLED  REASON  NOTE\n", stdout)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reason := "POST https://down.example:443/hook: HTTP 503 Service Unavailable: " + strings.Repeat("x", 100)
	_, err := pgtest.Pool(t).Exec(ctx, "INSERT INTO "+pgx.Identifier{schema, "endpoints"}.Sanitize()+
		` (endpoint, state, attempts, failures, opened_at, open_until, cool_down, reason) VALUES
('http://up.example:80', 'closed', 7, 1, NULL, NULL, NULL, NULL),
('https://down.example:443', 'open', 0, 0, '2026-01-02 03:04:05Z', '2026-01-02 03:04:35Z', '30s', $1)`, reason)
	require.NoError(t, err)

	code, stdout, stderr = a.runExit(t, "endpoints", "list")
	require.Equal(t, 0, code, stderr)
	lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
	require.Len(t, lines, 3)
	require.Regexp(t, `^https://down\.example:443\s+open\s+0\s+0\s+2026-01-02T\S+\s+2026-01-02T\S+\s+-\s+POST https://down\.example:443/hook: HTTP 503 Service Unavailable: x+…\s+-$`, lines[1])
	require.Regexp(t, `^http://up\.example:80\s+closed\s+7\s+1\s+-\s+-\s+-\s+-\s+-$`, lines[2])

	code, stdout, stderr = a.runExit(t, "endpoints", "list", "--json")
	require.Equal(t, 0, code, stderr)
	var list []map[string]any
	require.NoError(t, json.Unmarshal([]byte(stdout), &list))
	require.Len(t, list, 2)
	require.Equal(t, "https://down.example:443", list[0]["endpoint"])
	require.Equal(t, reason, list[0]["reason"])
	require.InDelta(t, 30.0, list[0]["cool_down_seconds"], 0)
}

// endpoints disable, enable and note change an endpoint by its name or
// any URL of it, and say so; one that changes nothing exits 1. list shows
// the disabled endpoint first, when and by whom, and the note; events
// shows the operator's events, with the job of HTTP_BREAKER_EVENT_KIND.
// An argument that is no endpoint is a usage error, not echoed.
func TestEndpointsDisableEnable(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	a := &adminOutput{schema: schema, env: dbEnv(schema, "HTTP_BREAKER_EVENT_KIND=noop", "HTTP_BREAKER_EVENT_QUEUE=alerts")}
	const ep = "https://hooks.example.com:443"

	code, stdout, stderr := a.runExit(t, "endpoints", "disable", "https://Hooks.Example.com/orders?token=s3cret", "--note", "migrating; ask ops")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "endpoint "+ep+": disabled; its jobs fail until 'pgdispatch endpoints enable "+ep+"'\n", stdout)
	code, stdout, _ = a.runExit(t, "endpoints", "disable", ep)
	require.Equal(t, 1, code)
	require.Equal(t, "endpoint "+ep+": already disabled\n", stdout)

	code, stdout, stderr = a.runExit(t, "endpoints", "list")
	require.Equal(t, 0, code, stderr)
	lines := strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
	require.Len(t, lines, 2)
	require.Regexp(t, `^https://hooks\.example\.com:443\s+closed\s+0\s+0\s+-\s+-\s+20\S+ by operator\s+-\s+migrating; ask ops$`, lines[1])

	code, stdout, stderr = a.runExit(t, "endpoints", "note", ep, "receiver owned by payments")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "endpoint "+ep+": note set\n", stdout)

	code, stdout, stderr = a.runExit(t, "endpoints", "enable", ep)
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "endpoint "+ep+": enabled; the jobs that died while it was disabled: "+
		"'pgdispatch jobs retry --all-dead --host hooks.example.com:443' counts them, --yes retries them\n", stdout)
	code, stdout, _ = a.runExit(t, "endpoints", "enable", ep)
	require.Equal(t, 1, code)
	require.Equal(t, "endpoint "+ep+": not disabled\n", stdout)

	code, stdout, stderr = a.runExit(t, "endpoints", "list", "--json")
	require.Equal(t, 0, code, stderr)
	var list []map[string]any
	require.NoError(t, json.Unmarshal([]byte(stdout), &list))
	require.Len(t, list, 1)
	require.Equal(t, "closed", list[0]["state"])
	require.Nil(t, list[0]["disabled_at"])
	require.Equal(t, "receiver owned by payments", list[0]["note"])

	code, stdout, stderr = a.runExit(t, "endpoints", "events", "--json")
	require.Equal(t, 0, code, stderr)
	var events []map[string]any
	require.NoError(t, json.Unmarshal([]byte(stdout), &events))
	require.Len(t, events, 2)
	require.Equal(t, []any{"enabled", "operator"}, []any{events[0]["event"], events[0]["by"]})
	require.Equal(t, []any{"disabled", "operator", "migrating; ask ops"}, []any{events[1]["event"], events[1]["by"], events[1]["note"]})
	var kind, queue string
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "SELECT kind, queue FROM "+pgx.Identifier{schema, "jobs"}.Sanitize()+
		" WHERE id = $1", int64(events[1]["job_id"].(float64))).Scan(&kind, &queue))
	require.Equal(t, []string{"noop", "alerts"}, []string{kind, queue})

	code, stdout, stderr = a.runExit(t, "endpoints", "events", ep)
	require.Equal(t, 0, code, stderr)
	lines = strings.Split(strings.TrimSuffix(stdout, "\n"), "\n")
	require.Len(t, lines, 3)
	require.Regexp(t, `^\d+\s+20\S+\s+https://hooks\.example\.com:443\s+disabled\s+operator \(\S+\)\s+\d+\s+migrating; ask ops$`, lines[2])

	code, stdout, stderr = a.runExit(t, "endpoints", "disable", "hooks.example.com/s3cret")
	require.Equal(t, 2, code)
	require.Empty(t, stdout)
	require.Contains(t, stderr, "give an endpoint")
	require.NotContains(t, stderr, "s3cret")
}
