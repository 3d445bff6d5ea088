package email_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/executors/email"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/smtptest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/wait"
	"github.com/pgdispatch/pgdispatch/internal/testkit/workertest"
)

func TestMain(m *testing.M) { pgtest.MainNoLeaks(m) }

const (
	waitFor  = 20 * time.Second
	user     = "mailer"
	password = "correct-horse-battery"
)

type bundle struct {
	schema string
	jobs   string
	watch  *pgtest.Watcher
}

func setup(t *testing.T, cfg email.Config) *bundle {
	t.Helper()
	exec, err := email.New(cfg)
	require.NoError(t, err)
	reg := executors.NewRegistry()
	reg.Register(email.Kind, exec)
	schema := workertest.Start(t, "mail-test", reg)
	return &bundle{schema: schema, jobs: pgx.Identifier{schema, "jobs"}.Sanitize(), watch: pgtest.Watch(t, schema)}
}

func (b *bundle) enqueue(t *testing.T, payload any, maxAttempts int) int64 {
	t.Helper()
	return workertest.Enqueue(t, b.schema, "email", payload, maxAttempts)
}

// config is the executor's config for s: plain SMTP on loopback, so the
// credentials are sent unencrypted, by explicit choice.
func config(s *smtptest.Server, pass string) email.Config {
	return email.Config{
		Host: s.Host, Port: s.Port, TLS: email.TLSNone, Username: user, Password: pass, AllowPlaintextAuth: true,
		From: "Shop <shop@example.test>",
	}
}

func TestSendsTheMessage(t *testing.T) {
	t.Parallel()
	s := smtptest.Start(t, user, password)
	b := setup(t, config(s, password))
	id := b.enqueue(t, map[string]any{
		"to": []string{"ann@example.test"}, "cc": []string{"Bob <bob@example.test>"}, "bcc": []string{"audit@example.test"},
		"reply_to": "support@example.test", "subject": "Your order 42", "text": "Thanks for your order.",
		"html": "<p>Thanks for your <b>order</b>.</p>", "headers": map[string]string{"X-Order": "42"},
	}, 5)
	b.watch.Status(t, id, "done", waitFor)
	d := <-s.Received
	require.Equal(t, "shop@example.test", d.From)
	require.ElementsMatch(t, []string{"ann@example.test", "bob@example.test", "audit@example.test"}, d.Recipients)
	h := d.Header
	require.Equal(t, `"Shop" <shop@example.test>`, h.Get("From"))
	require.Equal(t, "<ann@example.test>", h.Get("To"))
	require.Contains(t, h.Get("Cc"), "bob@example.test")
	require.Empty(t, h.Get("Bcc"), "Bcc is not a header")
	require.Equal(t, "<support@example.test>", h.Get("Reply-To"))
	require.Equal(t, "Your order 42", h.Get("Subject"))
	require.Equal(t, "42", h.Get("X-Order"))
	require.Equal(t, "<"+email.MessageID(id, "shop@example.test")+">", h.Get("Message-Id"))
	require.Contains(t, h.Get("Message-Id"), "job-")
	require.Contains(t, h.Get("Content-Type"), "multipart/alternative")
	require.Contains(t, d.Body, "Thanks for your order.")
	require.Contains(t, d.Body, "<b>order</b>")
}

func TestReplyCodes(t *testing.T) {
	t.Parallel()
	s := smtptest.Start(t, user, password)
	b := setup(t, config(s, password))
	temp := b.enqueue(t, map[string]any{"to": []string{"temp@example.test"}, "subject": "s", "text": "t"}, 3)
	reject := b.enqueue(t, map[string]any{"to": []string{"reject@example.test"}, "subject": "s", "text": "t"}, 3)

	st := b.watch.Status(t, temp, "dead", waitFor)
	require.Equal(t, 3, st.Attempts, "451 retries until the attempts are used up")
	require.Contains(t, *st.Error, "451")
	require.Contains(t, *st.Error, "attempt 3 of 3")

	st = b.watch.Status(t, reject, "dead", waitFor)
	require.Equal(t, 1, st.Attempts, "550 is permanent")
	require.Contains(t, *st.Error, "550")
}

// A message whose recipients the server refused, one with a 5xx and
// another with a 4xx, is dead whatever their order: a retry would meet the
// 5xx again. The refusal with the 5xx is the result.
func TestAnyRecipientRefusedFor5xxIsPermanent(t *testing.T) {
	t.Parallel()
	s := smtptest.Start(t, user, password)
	for _, to := range [][]string{
		{"reject@example.test", "temp@example.test"},
		{"temp@example.test", "reject@example.test"},
	} {
		got, err := runAttempt(t, config(s, password), map[string]any{"to": to, "subject": "s", "text": "t"})
		require.ErrorContains(t, err, "550", to)
		var p *executors.PermanentError
		require.ErrorAs(t, err, &p, to)
		var r struct {
			SMTPCode       int    `json:"smtp_code"`
			EnhancedStatus string `json:"enhanced_status"`
			Command        string `json:"command"`
		}
		require.NoError(t, json.Unmarshal([]byte(got), &r))
		require.Equal(t, 550, r.SMTPCode, got)
		require.Equal(t, "5.1.1", r.EnhancedStatus, got)
		require.Equal(t, "RCPT TO", r.Command, got)
	}
	require.Empty(t, s.Messages())
}

func TestWrongPasswordStaysSecret(t *testing.T) {
	t.Parallel()
	s := smtptest.Start(t, user, password)
	const wrong = "Tr0ub4dor&3-wrong-password"
	b := setup(t, config(s, wrong))
	id := b.enqueue(t, map[string]any{"to": []string{"ann@example.test"}, "subject": "s", "text": "t"}, 3)
	st := b.watch.Status(t, id, "dead", waitFor)
	require.Equal(t, 1, st.Attempts, "535 is permanent")
	require.Contains(t, *st.Error, "535")
	require.NotContains(t, *st.Error, wrong)
	require.NotContains(t, *st.Error, password)
}

func TestUnreachableServerRetries(t *testing.T) {
	t.Parallel()
	e, err := email.New(email.Config{Host: "127.0.0.1", Port: 1, TLS: email.TLSNone, From: "a@example.test", Password: "pw-123"})
	require.NoError(t, err)
	err = e.Execute(context.Background(), &executors.Job{
		ID: 7, Attempt: 1,
		Payload: json.RawMessage(`{"to": ["b@example.test"], "subject": "s", "text": "t"}`),
	})
	require.Error(t, err)
	var p *executors.PermanentError
	require.NotErrorAs(t, err, &p, "connection refused is retried")
}

func TestConfig(t *testing.T) {
	t.Parallel()
	_, err := email.New(email.Config{Host: "h", TLS: "maybe"})
	require.ErrorContains(t, err, `TLS "maybe"`)
	_, err = email.New(email.Config{})
	require.ErrorContains(t, err, "Host is required")
	_, err = email.New(email.Config{Host: "h", From: "not an address"})
	require.ErrorContains(t, err, "not an email address")
	_, err = email.New(email.Config{Host: "h", From: "a@example.test", Timeout: -time.Second})
	require.ErrorContains(t, err, "Timeout -1s: must not be negative")
}

// However many email jobs run at once, the executor opens at most
// MaxConnections SMTP sessions; a job that finds none free before its
// deadline fails with a retryable error that says so.
func TestMaxConnections(t *testing.T) {
	t.Parallel()
	s := smtptest.Start(t, user, password)
	s.Delay = 100 * time.Millisecond
	cfg := config(s, password)
	cfg.MaxConnections = 3
	exec, err := email.New(cfg)
	require.NoError(t, err)

	job := func(id int64) *executors.Job {
		return &executors.Job{
			ID: id, Kind: email.Kind, Attempt: 1, MaxAttempts: 1,
			Payload: []byte(`{"to": ["ann@example.test"], "subject": "s", "text": "t"}`),
		}
	}
	var g errgroup.Group
	for i := range 12 {
		g.Go(func() error { return exec.Execute(context.Background(), job(int64(i+1))) })
	}
	// One more with almost no time, once every session is taken and the
	// other jobs queue for one.
	wait.For(t, waitFor, "s.MostAtOnce() == 3", func() bool { return s.MostAtOnce() == 3 })
	short, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	err = exec.Execute(short, job(99))
	require.ErrorContains(t, err, "no SMTP session free before the job's deadline (3 at once)")
	require.NoError(t, g.Wait())
	require.Len(t, s.Messages(), 12)
	require.Equal(t, 3, s.MostAtOnce())

	_, err = email.New(email.Config{Host: "localhost", MaxConnections: -1})
	require.ErrorContains(t, err, "MaxConnections -1")
}

// Any writer of the table sets a job's payload. By default a payload may
// send only from SMTP_FROM's address (with a display name of its own), and
// to at most 50 recipients in to, cc and bcc together; anything else is
// dead with a reason, and nothing is sent.
func TestSenderAndRecipientsAreBoundedByDefault(t *testing.T) {
	t.Parallel()
	s := smtptest.Start(t, "", "")
	cfg := config(s, "")
	cfg.Username = "" // plain SMTP without credentials needs no opt-in
	b := setup(t, cfg)
	many := make([]string, 51)
	for i := range many {
		many[i] = fmt.Sprintf("r%d@example.test", i)
	}
	spoofed := b.enqueue(t, map[string]any{"to": []string{"ann@example.test"}, "from": "CEO <ceo@bank.test>", "subject": "s", "text": "t"}, 3)
	crowd := b.enqueue(t, map[string]any{"to": many[:40], "cc": many[40:50], "bcc": many[50:], "subject": "s", "text": "t"}, 3)
	named := b.enqueue(t, map[string]any{"to": []string{"ann@example.test"}, "from": "Shop Support <SHOP@example.test>", "subject": "s", "text": "t"}, 3)
	fifty := b.enqueue(t, map[string]any{"to": many[:50], "subject": "s", "text": "t"}, 3)
	final := b.watch.Until(t, waitFor, "all finished", func(m map[int64]pgtest.JobState) bool {
		for _, id := range []int64{spoofed, crowd, named, fifty} {
			if m[id].Status != "done" && m[id].Status != "dead" {
				return false
			}
		}
		return true
	})
	var sent []string
	for _, m := range s.Messages() {
		sent = append(sent, fmt.Sprintf("from %s to %d recipients", m.From, len(m.Recipients)))
	}
	require.ElementsMatch(t, []string{"from SHOP@example.test to 1 recipients", "from shop@example.test to 50 recipients"}, sent)
	require.Equal(t, "done", final[named].Status)
	require.Equal(t, "done", final[fifty].Status)
	for id, msg := range map[int64]string{
		spoofed: `payload.from: "ceo@bank.test" is not an allowed sender`,
		crowd:   "payload.to: 51 recipients in to, cc and bcc: at most 50",
	} {
		require.Equal(t, "dead", final[id].Status)
		require.Equal(t, 1, final[id].Attempts)
		require.Contains(t, *final[id].Error, msg)
	}
}

// A payload's headers cannot name a sender past the bounds from has: the
// headers that name one, by any case, are refused as From is, and nothing
// is sent.
func TestHeadersNameNoSender(t *testing.T) {
	t.Parallel()
	s := smtptest.Start(t, user, password)
	for _, name := range []string{"Sender", "resent-from", "Resent-Sender", "FROM"} {
		_, err := runAttempt(t, config(s, password), map[string]any{
			"to": []string{"ann@example.test"}, "subject": "s", "text": "t", "headers": map[string]string{name: "CEO <ceo@example.test>"},
		})
		require.ErrorContains(t, err, "payload.headers."+name+`: set it with the payload's "from" field`)
		var p *executors.PermanentError
		require.ErrorAs(t, err, &p)
	}
	require.Empty(t, s.Messages())
}

// Credentials over plain SMTP are an explicit choice: New refuses them
// without AllowPlaintextAuth.
func TestPlaintextAuthNeedsOptIn(t *testing.T) {
	t.Parallel()
	_, err := email.New(email.Config{Host: "127.0.0.1", TLS: email.TLSNone, Username: "u", Password: "secret-pw", From: "a@example.test"})
	require.ErrorContains(t, err, "SMTP_ALLOW_PLAINTEXT_AUTH")
	require.NotContains(t, err.Error(), "secret-pw")
}

// AllowFrom names the other senders: addresses, or domains for any address
// at them (not at their subdomains); MaxRecipients sets the bound.
func TestAllowFromAndMaxRecipients(t *testing.T) {
	t.Parallel()
	s := smtptest.Start(t, user, password)
	cfg := config(s, password)
	cfg.AllowFrom = []string{"alerts@example.test", "news.example.test"}
	cfg.MaxRecipients = 2
	b := setup(t, cfg)
	job := func(from string, to ...string) int64 {
		return b.enqueue(t, map[string]any{"to": to, "from": from, "subject": "s", "text": "t"}, 3)
	}
	alerts := job("Alerts <ALERTS@example.test>", "ann@example.test", "bob@example.test")
	news := job("weekly@news.example.test", "ann@example.test")
	sub := job("x@eu.news.example.test", "ann@example.test")
	other := job("sales@example.test", "ann@example.test")
	three := job("shop@example.test", "ann@example.test", "bob@example.test", "cy@example.test")
	b.watch.Status(t, alerts, "done", waitFor)
	b.watch.Status(t, news, "done", waitFor)
	for id, msg := range map[int64]string{
		sub:   `payload.from: "x@eu.news.example.test" is not an allowed sender`,
		other: `payload.from: "sales@example.test" is not an allowed sender`,
		three: "payload.to: 3 recipients in to, cc and bcc: at most 2",
	} {
		st := b.watch.Status(t, id, "dead", waitFor)
		require.Contains(t, *st.Error, msg)
	}
	var from []string
	for _, m := range s.Messages() {
		from = append(from, m.From)
	}
	require.ElementsMatch(t, []string{"ALERTS@example.test", "weekly@news.example.test"}, from)

	any := config(s, password)
	any.AllowFrom = []string{"*"}
	e, err := email.New(any)
	require.NoError(t, err)
	require.NoError(t, e.Execute(context.Background(), &executors.Job{
		ID: 1, Attempt: 1, Payload: json.RawMessage(`{"to": ["ann@example.test"], "from": "x@anywhere.test", "subject": "s", "text": "t"}`),
	}))
}

func TestSenderConfig(t *testing.T) {
	t.Parallel()
	_, err := email.New(email.Config{Host: "h"})
	require.ErrorContains(t, err, "no sender is allowed: set From (SMTP_FROM), or AllowFrom (SMTP_ALLOW_FROM)")
	_, err = email.New(email.Config{Host: "h", AllowFrom: []string{"example.test"}})
	require.NoError(t, err, "a domain alone will do")
	for _, bad := range []string{"not an address@", "exa mple.test", "ex@mple@test", "-"} {
		_, err = email.New(email.Config{Host: "h", From: "a@example.test", AllowFrom: []string{bad}})
		require.ErrorContains(t, err, "AllowFrom", bad)
	}
	_, err = email.New(email.Config{Host: "h", From: "a@example.test", MaxRecipients: -1})
	require.ErrorContains(t, err, "MaxRecipients -1")
}
