package main

import (
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

// The worker's start log names the database it serves (host, port and
// database, never the user's password) and the executors the settings
// configure, and those they leave out with the setting each needs. Two
// workers started on one host without WORKER_ID log IDs of their own: the
// hostname, the process id and a random suffix.
func TestStartLogNamesDatabaseAndExecutors(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	cc, err := pgx.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	const password = "Slp!1secretpw" // the tests' server trusts loopback, and ignores it
	u := "postgres://" + cc.User + ":" + password + "@" + cc.Host + ":" + strconv.Itoa(int(cc.Port)) + "/" + cc.Database + "?sslmode=disable"
	database := cc.Host + ":" + strconv.Itoa(int(cc.Port)) + "/" + cc.Database

	ids := map[string]bool{}
	for range 2 {
		p := start(t, env("DATABASE_URL="+u, "DB_SCHEMA="+schema, "LOG_FORMAT=json", "HTTP_SIGNING_SECRET=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"), "run")
		p.stderr.waitFor(t, "worker started", 30*time.Second)
		require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
		require.Equal(t, 0, p.wait(t, 30*time.Second), p.stderr.String())
		log := p.stderr.String()
		started := lineWith(t, log, `"msg":"worker started"`)
		require.Contains(t, started, `"database":"`+database+`"`)
		executorsLine := lineWith(t, log, `"msg":"executors"`)
		require.Contains(t, executorsLine, `"configured":["http_callback (signed)","noop"]`)
		require.Contains(t, executorsLine, `"not_configured":["rabbitmq: set RABBITMQ_URL","email: set SMTP_HOST"]`)
		for _, leak := range []string{password, "Slp!1", "xxxxx", "whsec_", "MfKQ9r8"} {
			require.NotContains(t, log, leak, "the start log holds no secret, masked or not")
		}
		id := regexp.MustCompile(`"worker_id":"([^"]+)"`).FindStringSubmatch(started)
		require.NotNil(t, id, started)
		require.Regexp(t, `^.+-\d+-[0-9a-f]{6}$`, id[1])
		ids[id[1]] = true
	}
	require.Len(t, ids, 2, "two workers on one host have IDs of their own")
}

// lineWith is the line of log that holds substr.
func lineWith(t *testing.T, log, substr string) string {
	t.Helper()
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, substr) {
			return line
		}
	}
	t.Fatalf("no line holds %s:\n%s", substr, log)
	return ""
}
