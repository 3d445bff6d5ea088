package main

import (
	"context"
	"strconv"
	"strings"
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

// jobs show says why a pending, due job of a limited queue's key waits,
// from the database: its key's concurrency limit, the job ahead of it in
// strict order, or its rate. It shows any job's flow key.
func TestJobsShowSaysWhyAJobWaits(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	a := &adminOutput{schema: schema, env: dbEnv(schema)}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	pool := pgtest.Pool(t)
	insert := func(queue, key, status string) string {
		t.Helper()
		var id int64
		require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+s("jobs")+" (kind, queue, flow_key, status, run_at) "+
			"VALUES ('noop', $1, $2, $3, now() - interval '1 second') RETURNING id", queue, key, status).Scan(&id))
		return strconv.FormatInt(id, 10)
	}
	_, err := pool.Exec(ctx, "SELECT "+s("set_flow_limit")+"('c', concurrency => 2), "+
		s("set_flow_limit")+"('s', 'k', strict => true), "+
		s("set_flow_limit")+"('r', rate => 2, per => '1 hour'), "+
		s("set_flow_limit")+"('c', 'free', concurrency => 5)")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "INSERT INTO "+s("flow_keys")+" (queue, key, starts) VALUES ('r', 'acme', ARRAY[now() - interval '1 minute', now()])")
	require.NoError(t, err)

	insert("c", "acme", "running")
	insert("c", "acme", "running")
	insert("c", "free", "running")
	insert("c", "free", "running")
	ahead := insert("s", "k", "running")

	for _, c := range []struct {
		id, key, waiting string
	}{
		{insert("c", "acme", "pending"), "acme", "waiting: key acme at its concurrency limit of 2 (2 running)\n"},
		{insert("s", "k", "pending"), "k", "waiting: key k runs in strict order; job " + ahead + " is ahead of it\n"},
		{insert("r", "acme", "pending"), "acme", "waiting: key acme at its rate of 2 per 1h0m0s\n"},
		{insert("c", "free", "pending"), "free", ""},     // its own limit, 5, overrides the queue's
		{insert("plain", "acme", "pending"), "acme", ""}, // no limit
	} {
		code, stdout, stderr := a.runExit(t, "jobs", "show", c.id)
		require.Equal(t, 0, code, stderr)
		require.Regexp(t, `(?m)^flow key +`+c.key+`$`, stdout, c.id)
		if c.waiting == "" {
			require.NotContains(t, stdout, "waiting:", c.id)
		} else {
			require.Contains(t, stdout, "finished_at ", c.id)
			require.Contains(t, stdout, "\n"+c.waiting+"payload\n", c.id)
		}
	}
}

// enqueue --flow-key gives the job its key.
func TestEnqueueFlowKeyFlag(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	a := &adminOutput{schema: schema, env: dbEnv(schema)}
	code, stdout, stderr := a.runExit(t, "enqueue", "--kind", "noop", "--run-at", "1h", "--flow-key", "acme")
	require.Equal(t, 0, code, stderr)
	id, err := strconv.ParseInt(strings.TrimSpace(stdout), 10, 64)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var key string
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "SELECT flow_key FROM "+pgx.Identifier{schema, "jobs"}.Sanitize()+" WHERE id = $1", id).Scan(&key))
	require.Equal(t, "acme", key)
}
