package email_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/executors/email"
	"github.com/pgdispatch/pgdispatch/internal/testkit/smtptest"
)

// runAttempt runs one attempt of a job with payload, as a worker would,
// and returns the result it recorded ("" when none) and its error.
func runAttempt(t *testing.T, cfg email.Config, payload any) (string, error) {
	t.Helper()
	e, err := email.New(cfg)
	require.NoError(t, err)
	raw, err := json.Marshal(payload)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	ctx, a := executors.WithAttempt(ctx)
	err = e.Execute(ctx, &executors.Job{ID: 9, Attempt: 1, Payload: raw})
	return string(a.Result()), err
}

// Each attempt records the server's reply: to the message's data when it
// accepted it, or the reply that refused it, with its code.
func TestResultIsTheServersReply(t *testing.T) {
	t.Parallel()
	s := smtptest.Start(t, user, password)
	msg := func(to ...string) map[string]any {
		return map[string]any{"to": to, "cc": []string{"bob@example.test"}, "subject": "s", "text": "t"}
	}

	got, err := runAttempt(t, config(s, password), msg("ann@example.test", "cy@example.test"))
	require.NoError(t, err)
	require.JSONEq(t, `{"smtp_code": 250, "reply": "2.0.0 OK: queued", "recipients": 3}`, got)
	require.Len(t, s.Messages(), 1)

	got, err = runAttempt(t, config(s, password), msg("ann@example.test", "reject@example.test"))
	require.ErrorContains(t, err, "550")
	require.JSONEq(t, `{"smtp_code": 550, "enhanced_status": "5.1.1", "command": "RCPT TO", "reply": "5.1.1 no such user"}`, got)

	got, err = runAttempt(t, config(s, password), msg("temp@example.test"))
	require.ErrorContains(t, err, "451")
	require.JSONEq(t, `{"smtp_code": 451, "enhanced_status": "4.3.0", "command": "RCPT TO", "reply": "4.3.0 mailbox busy, try later"}`, got)

	const wrong = "Tr0ub4dor&3-wrong-password"
	got, err = runAttempt(t, config(s, wrong), msg("ann@example.test"))
	require.ErrorContains(t, err, "535")
	require.JSONEq(t, `{"smtp_code": 535, "reply": "5.7.8 authentication failed"}`, got)
	require.NotContains(t, got, wrong)

	got, err = runAttempt(t, email.Config{Host: "127.0.0.1", Port: 1, TLS: email.TLSNone, From: "a@example.test"}, msg("ann@example.test"))
	require.Error(t, err)
	require.Empty(t, got, "no server, no reply")
	require.Len(t, s.Messages(), 1)
}
