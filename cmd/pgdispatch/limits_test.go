package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

// The email executor's bounds are settings, and a wrong one stops run at
// start with a clear error: credentials over plain SMTP need an explicit
// SMTP_ALLOW_PLAINTEXT_AUTH=true, and the password is never printed.
func TestSMTPSettings(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	smtp := []string{"SMTP_HOST=127.0.0.1", "SMTP_PORT=2525", "SMTP_FROM=shop@example.test"}
	for _, tc := range []struct {
		env  []string
		want string
	}{
		{[]string{"SMTP_TLS=none", "SMTP_USERNAME=mailer", "SMTP_PASSWORD=s3cret-smtp-pw"}, "SMTP_ALLOW_PLAINTEXT_AUTH=true"},
		{[]string{"SMTP_ALLOW_PLAINTEXT_AUTH=maybe"}, `invalid SMTP_ALLOW_PLAINTEXT_AUTH "maybe"`},
		{[]string{"SMTP_ALLOW_FROM=example.test,not an address@"}, `AllowFrom "not an address@"`},
		{[]string{"SMTP_MAX_RECIPIENTS=0"}, `invalid SMTP_MAX_RECIPIENTS "0"`},
	} {
		p := start(t, dbEnv(schema, append(append([]string{}, smtp...), tc.env...)...), "run")
		require.Equal(t, 1, p.wait(t, 30*time.Second), tc.env)
		require.Contains(t, p.stderr.String(), tc.want)
		require.NotContains(t, p.stderr.String()+p.stdout.String(), "s3cret-smtp-pw")
	}
}

// A worker cannot be configured to write what the jobs table refuses: a
// MAX_ATTEMPTS its claims would write into max_attempts, or a queue no job
// can name.
func TestSettingsWithinTheTableLimits(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	for _, tc := range []struct{ env, want string }{
		{"MAX_ATTEMPTS=1000001", "invalid MAX_ATTEMPTS 1000001: at most 1000000"},
		{"QUEUES=default," + strings.Repeat("q", 129), "invalid QUEUES: a queue's name has at most 128 characters"},
	} {
		p := start(t, dbEnv(schema, tc.env), "run")
		require.Equal(t, 1, p.wait(t, 30*time.Second), tc.env)
		require.Contains(t, p.stderr.String(), tc.want)
	}
}
