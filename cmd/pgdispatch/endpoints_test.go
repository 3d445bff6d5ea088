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
	require.Equal(t, "ENDPOINT  STATE  ATTEMPTS  FAILURES  OPENED  OPEN UNTIL  REASON\n", stdout)

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
	require.Regexp(t, `^https://down\.example:443\s+open\s+0\s+0\s+2026-01-02T\S+\s+2026-01-02T\S+\s+POST https://down\.example:443/hook: HTTP 503 Service Unavailable: x+…$`, lines[1])
	require.Regexp(t, `^http://up\.example:80\s+closed\s+7\s+1\s+-\s+-\s+-$`, lines[2])

	code, stdout, stderr = a.runExit(t, "endpoints", "list", "--json")
	require.Equal(t, 0, code, stderr)
	var list []map[string]any
	require.NoError(t, json.Unmarshal([]byte(stdout), &list))
	require.Len(t, list, 2)
	require.Equal(t, "https://down.example:443", list[0]["endpoint"])
	require.Equal(t, reason, list[0]["reason"])
	require.InDelta(t, 30.0, list[0]["cool_down_seconds"], 0)
}
