package email_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/executors/email"
	"github.com/pgdispatch/pgdispatch/internal/testkit/smtptest"
)

// SMTP servers that attack the worker. Each attempt ends with a readable
// error, having read a bounded number of bytes, and closes its connection.

// hostileLimit is what each hostile server sends at most: a client that
// reads it all has no bound.
const hostileLimit = 64 << 20

// hostileAttempt runs one attempt against h within timeout, and returns its
// result, the connection it made and its error. It fails the test if the
// attempt outlives its context by more than a few seconds.
func hostileAttempt(t *testing.T, h *smtptest.Hostile, timeout time.Duration) (string, *smtptest.HostileConn, error) {
	t.Helper()
	e, err := email.New(email.Config{
		Host: h.Host, Port: h.Port, TLS: email.TLSNone, Username: user, Password: password, AllowPlaintextAuth: true,
		From: "shop@example.test", Timeout: time.Minute,
	})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	ctx, a := executors.WithAttempt(ctx)
	done := make(chan error, 1)
	go func() {
		done <- e.Execute(ctx, &executors.Job{ID: 3, Attempt: 1, Payload: json.RawMessage(`{"to": ["ann@example.test"], "subject": "s", "text": "t"}`)})
	}()
	select {
	case err = <-done:
	case <-time.After(timeout + 10*time.Second):
		t.Fatalf("the attempt went on %s past its context's end", 10*time.Second)
	}
	var conn *smtptest.HostileConn
	select {
	case conn = <-h.Conns:
	default:
		t.Fatal("the attempt never connected")
	}
	select {
	case <-conn.Closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the attempt has ended, and its connection is still open")
	}
	return string(a.Result()), conn, err
}

// A reply that never ends, in one line or in many, fails the attempt once
// it has run past MaxReplyBytes: the worker reads no more of it.
func TestEndlessReplies(t *testing.T) {
	t.Parallel()
	for _, b := range []smtptest.Behaviour{smtptest.EndlessLine, smtptest.EndlessMultiline, smtptest.EndlessEHLO} {
		t.Run(b.String(), func(t *testing.T) {
			t.Parallel()
			h := smtptest.StartHostile(t, hostileLimit, b)
			_, conn, err := hostileAttempt(t, h, 20*time.Second)
			require.ErrorContains(t, err, "reply ran past")
			t.Logf("%s: %v; the server sent %d bytes", b, err, conn.Written())
			// What the sockets' buffers hold on loopback comes on top of
			// what the client read.
			require.Less(t, conn.Written(), int64(16<<20), "the client read on")
			var p *executors.PermanentError
			require.NotErrorAs(t, err, &p, "a broken server may be mended: the job retries")
		})
	}
}

// A server that stops talking holds the attempt no longer than its
// context, however long the executor's own Timeout: the connection is
// closed when the attempt ends.
func TestSilentServerHoldsNoLongerThanTheAttempt(t *testing.T) {
	t.Parallel()
	h := smtptest.StartHostile(t, 64, smtptest.EndlessLine) // 64 bytes of greeting, then silence
	start := time.Now()
	_, _, err := hostileAttempt(t, h, time.Second)
	t.Logf("the attempt ended %s after it began: %v", time.Since(start).Round(time.Millisecond), err)
	require.ErrorContains(t, err, "no reply before the job's deadline")
}

// A server that quotes the AUTH command in its refusal leaks the base64 of
// the password: neither the error nor the result holds it.
func TestEchoedAuthStaysSecret(t *testing.T) {
	t.Parallel()
	h := smtptest.StartHostile(t, 0, smtptest.EchoAuth)
	result, _, err := hostileAttempt(t, h, 20*time.Second)
	require.ErrorContains(t, err, "535")
	var p *executors.PermanentError
	require.ErrorAs(t, err, &p)
	plain := base64.StdEncoding.EncodeToString([]byte("\x00" + user + "\x00" + password))
	for _, out := range []string{err.Error(), result} {
		t.Log(out)
		require.Contains(t, out, "authentication failed")
		require.NotContains(t, out, plain)
		require.NotContains(t, out, plain[8:24], "a piece of the credentials")
		require.NotContains(t, out, password)
	}
}
