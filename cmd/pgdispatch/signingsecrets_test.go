package main

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/signing"
)

// secrets rotate, with a running worker: a secret read from stdin, then
// one made and printed once; the worker reads each without a restart.
// Neither secret reaches list, the logs, or any other output.
func TestSecretsRotate(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	environ := dbEnv(schema)
	run := start(t, environ, "run")
	run.stderr.waitFor(t, "worker started", time.Minute)

	// Neither flag: the receivers would not know the secret.
	code, stdout, stderr := (&adminOutput{env: environ}).runExit(t, "secrets", "rotate")
	require.Equal(t, 2, code, stdout+stderr)
	require.Contains(t, stderr, "give --print or --stdin")
	// A secret that does not parse is not echoed.
	bad := "whsec_Bad!Secret!Text"
	p := startWithInput(t, environ, strings.NewReader(bad+"\n"), "secrets", "rotate", "--stdin")
	require.Equal(t, 1, p.wait(t, 30*time.Second))
	require.Contains(t, p.stderr.String(), "the signing secret must be base64")
	require.NotContains(t, p.stdout.String()+p.stderr.String(), "Bad!Secret")

	given := signing.Generate()
	p = startWithInput(t, environ, strings.NewReader(given.Text()+"\n"), "secrets", "rotate", "--stdin", "--overlap", "1h")
	require.Equal(t, 0, p.wait(t, 30*time.Second), p.stderr.String())
	require.Empty(t, p.stdout.String())
	require.Contains(t, p.stderr.String(), "signing secret 1 signs from now on, alone")
	run.stderr.waitFor(t, `"secret_ids": [1]`, time.Minute)

	p = start(t, environ, "secrets", "rotate", "--print", "--overlap", "10m")
	require.Equal(t, 0, p.wait(t, 30*time.Second), p.stderr.String())
	require.Contains(t, p.stderr.String(), "signing secret 2 signs from now on; the ones before it sign too until ")
	printed, err := signing.ParseSecret(p.stdout.String())
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(p.stdout.String(), signing.Prefix) && strings.Count(p.stdout.String(), "\n") == 1,
		"one line, the secret: %q", p.stdout.String())
	run.stderr.waitFor(t, `"secret_ids": [2, 1]`, time.Minute)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var stored [][]byte
	rows, _ := pgtest.Pool(t).Query(ctx, "SELECT secret FROM "+pgx.Identifier{schema, "signing_secrets"}.Sanitize()+" ORDER BY id")
	stored, err = pgx.CollectRows(rows, pgx.RowTo[[]byte])
	require.NoError(t, err)
	require.Equal(t, [][]byte{given, printed}, stored)

	a := &adminOutput{env: environ}
	list := a.run(t, "secrets", "list")
	require.Regexp(t, `(?m)^ID +CREATED +EXPIRES +SIGNS\n1 +\S+ +\S+ +yes\n2 +\S+ +- +yes\n$`, list)
	listJSON := a.run(t, "secrets", "list", "--json")
	require.Contains(t, listJSON, `"id": 2`)

	require.NoError(t, run.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 0, run.wait(t, time.Minute), run.stderr.String())
	for what, out := range map[string]string{"list": list + listJSON, "run's log": run.stdout.String() + run.stderr.String()} {
		for _, s := range []signing.Secret{given, printed} {
			require.NotContains(t, out, s.Text()[len(signing.Prefix):], what)
			require.NotContains(t, out, fmt.Sprintf("%x", []byte(s)), what)
		}
	}
}
