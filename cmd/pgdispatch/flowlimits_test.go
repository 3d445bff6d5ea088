package main

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

// limits set declares a queue's limits, which limits list shows and limits
// clear removes; the queue is limited while it has one. Wrong values exit
// 2 (a usage error) or 1 (the database's refusal), and a clear that found
// nothing exits 1.
func TestLimitsCommands(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	a := &adminOutput{schema: schema, env: dbEnv(schema)}
	limited := func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		var l bool
		err := pgtest.Pool(t).QueryRow(ctx, "SELECT coalesce((SELECT limited FROM "+pgx.Identifier{schema, "queues"}.Sanitize()+
			" WHERE name = 'mail'), false)").Scan(&l)
		require.NoError(t, err)
		return l
	}

	for _, c := range []struct {
		args   []string
		stdout string
	}{
		{[]string{"limits", "set", "--concurrency", "2", "mail"}, "queue mail, every key: at most 2 running\n"},
		{[]string{"limits", "set", "--key", "acme", "--strict", "--rate", "50", "--per", "1s", "mail"}, "queue mail, key acme: strict order, at most 50 starts per 1s\n"},
		{[]string{"limits", "set", "fair"}, "queue fair, every key: takes turns with the other keys\n"},
	} {
		code, stdout, stderr := a.runExit(t, c.args...)
		require.Equal(t, 0, code, "%v: %s", c.args, stderr)
		require.Equal(t, c.stdout, stdout, c.args)
	}
	require.True(t, limited())

	code, stdout, stderr := a.runExit(t, "limits", "list")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "QUEUE  KEY        CONCURRENCY  STRICT  RATE\n"+
		"fair   every key  -            no      -\n"+
		"mail   every key  2            no      -\n"+
		"mail   acme       -            yes     50 per 1s\n", stdout)
	code, stdout, _ = a.runExit(t, "limits", "list", "--queue", "fair")
	require.Equal(t, 0, code)
	require.Equal(t, "QUEUE  KEY        CONCURRENCY  STRICT  RATE\nfair   every key  -            no      -\n", stdout)

	for _, c := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"limits", "set", "--rate", "5", "mail"}, 1, "--rate and --per go together"},
		{[]string{"limits", "set", "--concurrency", "100001", "mail"}, 1, "the concurrency must be from 1 to 100000"},
		{[]string{"limits", "set", "--rate", "5", "--per", "48h", "mail"}, 1, "at most 1 day"},
		{[]string{"limits", "set"}, 2, "give one queue name"},
		{[]string{"limits", "clear", "--key", "globex", "mail"}, 1, "nothing changed"},
	} {
		code, _, stderr := a.runExit(t, c.args...)
		require.Equal(t, c.code, code, "%v: %s", c.args, stderr)
		require.Contains(t, stderr, c.says, c.args)
	}

	code, stdout, stderr = a.runExit(t, "limits", "clear", "mail")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "queue mail, every key: limit cleared\n", stdout)
	require.True(t, limited(), "the key acme's limit stays")
	code, stdout, stderr = a.runExit(t, "limits", "clear", "--key", "acme", "mail")
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "queue mail, key acme: limit cleared\n", stdout)
	require.False(t, limited())
}
