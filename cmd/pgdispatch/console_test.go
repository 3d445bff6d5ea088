package main

import (
	"net/http"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

// console refuses to start without a token, serves with one, keeps the
// token out of its output, and stops on SIGTERM.
func TestConsoleCommand(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	p := start(t, dbEnv(schema), "console", "--listen", "127.0.0.1:0")
	require.Equal(t, 1, p.wait(t, 30*time.Second))
	require.Contains(t, p.stderr.String(), "the console needs credentials: set CONSOLE_OPERATOR_TOKEN")

	const token = "console-command-token-1234"
	p = start(t, dbEnv(schema, "CONSOLE_OPERATOR_TOKEN="+token), "console", "--listen", "127.0.0.1:0")
	p.stdout.waitFor(t, "pgdispatch console: http://", 30*time.Second)
	url := regexp.MustCompile(`http://\S+/`).FindString(p.stdout.String())
	req, err := http.NewRequest("GET", url, nil)
	require.NoError(t, err)
	req.SetBasicAuth("ann", token)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	require.Equal(t, http.StatusOK, resp.StatusCode)

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 0, p.wait(t, 30*time.Second), p.stderr.String())
	require.NotContains(t, p.stdout.String()+p.stderr.String(), token)
}
