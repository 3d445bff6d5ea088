package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/internal/testkit/amqptest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/smtptest"
)

// Malformed payloads across the three kinds, in one stream with good jobs, on
// a worker configured as a user configures it. Each bad one is dead after one
// attempt with an error that names the field; the good ones are delivered.
func TestMalformedPayloadsDieAndGoodOnesRun(t *testing.T) {
	t.Parallel()
	brokerURL := amqptest.URL(t)
	schema := pgtest.Schema(t)
	queue := "pgdispatch-test-" + schema
	amqptest.Queue(t, brokerURL, queue)
	mail := smtptest.Start(t, "mailer", "secret-pw")
	hits := make(chan string, 10)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits <- r.Header.Get("Pgdispatch-Job-Id")
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(receiver.Close)

	long := strings.Repeat("q", 300)
	bad := []struct{ kind, payload, want string }{
		{"http_callback", `{}`, "payload.url: is required"},
		{"http_callback", `{"url": 5}`, "payload.url: must be a string, not a number"},
		{"http_callback", `{"url": "ftp://files.example.test/x"}`, "payload.url: must be an absolute http(s) URL"},
		{"http_callback", `{"url": "/relative/path"}`, "payload.url: must be an absolute http(s) URL"},
		{"http_callback", `{"url": "http://x.test", "method": "TRACE"}`, "payload.method: must be one of"},
		{"http_callback", `{"url": "http://x.test", "headers": {"Bad Name": "v"}}`, "payload.headers.Bad Name: is not a valid header name"},
		{"http_callback", `{"url": "http://x.test", "headers": {"X-A": "a\r\nInjected: 1"}}`, "payload.headers.X-A: must not contain CR, LF or NUL"},
		{"http_callback", `{"url": "http://x.test", "headers": {"X-A": 1}}`, "payload.headers.X-A: must be a string, not a number"},
		{"http_callback", `{"url": "http://x.test", "timeout": "soon"}`, "payload.timeout: must be a duration"},
		{"http_callback", `{"url": "http://x.test", "urll": "typo"}`, "payload.urll: unknown field"},
		{"http_callback", `[1, 2]`, "payload: must be a JSON object, not an array"},
		{"rabbitmq", `{"body": 1}`, "payload.routing_key: is required"},
		{"rabbitmq", `{"routing_key": "q"}`, "payload.body: is required"},
		{"rabbitmq", `{"routing_key": 7, "body": 1}`, "payload.routing_key: must be a string, not a number"},
		{"rabbitmq", `{"routing_key": "", "body": 1}`, "payload.routing_key: must name a queue"},
		{"rabbitmq", `{"routing_key": "` + long + `", "body": 1}`, "payload.routing_key: must be at most 255 bytes"},
		{"rabbitmq", `"just a string"`, "payload: must be a JSON object, not a string"},
		{"email", `{"subject": "s", "text": "t"}`, "payload.to: needs at least one address"},
		{"email", `{"to": "a@example.test", "subject": "s", "text": "t"}`, "payload.to: must be an array, not a string"},
		{"email", `{"to": ["not-an-address"], "subject": "s", "text": "t"}`, `payload.to[0]: "not-an-address" is not an email address`},
		{"email", `{"to": ["a@example.test"], "text": "t"}`, "payload.subject: is required"},
		{"email", `{"to": ["a@example.test"], "subject": "s"}`, "payload.text: or html is required"},
		{"email", `{"to": ["a@example.test"], "subject": "s\r\nBcc: evil@example.test", "text": "t"}`, "payload.subject: must not contain CR, LF or NUL"},
		{"email", `{"to": ["a@example.test"], "subject": "s", "text": "t", "headers": {"Bcc": "x@example.test"}}`, `payload.headers.Bcc: set it with the payload's "bcc" field`},
		{"email", `{"to": ["a@example.test"], "subject": "s", "text": "t", "from": "nope"}`, `payload.from: "nope" is not an email address`},
		{"email", `null`, "payload: must be a JSON object, not null"},
		{"email", `{"to": ["a@example.test"], "subject": "s", "text": "t", "from": "CEO <ceo@bank.test>"}`, `payload.from: "ceo@bank.test" is not an allowed sender`},
		{"email", `{"to": ["a@example.test", "b@example.test"], "cc": ["c@example.test"], "bcc": ["d@example.test"], "subject": "s", "text": "t"}`, "payload.to: 4 recipients in to, cc and bcc: at most 3"},
		{"rabbitmq", `{"routing_key": "q", "body": 1, "headers": {"CC": ["other"]}}`, "payload.headers.CC: is refused"},
		{"rabbitmq", `{"routing_key": "q", "body": 1, "headers": {"bcc": ["other"]}}`, "payload.headers.bcc: is refused"},
		{"no_such_kind", `{}`, `unknown kind "no_such_kind"`},
	}
	good := []struct{ kind, payload string }{
		{"http_callback", fmt.Sprintf(`{"url": %q, "data": {"ok": true}}`, receiver.URL)},
		{"rabbitmq", fmt.Sprintf(`{"routing_key": %q, "body": {"ok": true}}`, queue)},
		{"email", `{"to": ["ann@example.test"], "subject": "ok", "text": "ok"}`},
	}

	w := pgtest.Watch(t, schema)
	p := start(t, dbEnv(schema, "POLL_INTERVAL=1h", "WORKER_ID=payloads",
		"HTTP_ALLOW_NETWORKS=loopback", // the receiver is on this machine
		"RABBITMQ_URL="+brokerURL,
		"SMTP_HOST="+mail.Host, "SMTP_PORT="+strconv.Itoa(mail.Port), "SMTP_TLS=none",
		"SMTP_USERNAME=mailer", "SMTP_PASSWORD=secret-pw", "SMTP_ALLOW_PLAINTEXT_AUTH=true", "SMTP_FROM=shop@example.test",
		"SMTP_MAX_RECIPIENTS=3"), "run")
	p.stderr.waitFor(t, "worker started", 30*time.Second)

	// One statement, bad and good interleaved.
	var values []string
	var args []any
	for i := 0; i < len(bad) || i < len(good); i++ {
		if i < len(bad) {
			args = append(args, bad[i].kind, bad[i].payload)
			values = append(values, fmt.Sprintf("($%d, $%d::jsonb)", len(args)-1, len(args)))
		}
		if i < len(good) {
			args = append(args, good[i].kind, good[i].payload)
			values = append(values, fmt.Sprintf("($%d, $%d::jsonb)", len(args)-1, len(args)))
		}
	}
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	rows, err := pgtest.Pool(t).Query(context.Background(),
		"INSERT INTO "+jobs+" (kind, payload) VALUES "+strings.Join(values, ", ")+" RETURNING id, kind, payload::text", args...)
	require.NoError(t, err)
	type row struct {
		ID            int64
		Kind, Payload string
	}
	inserted, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	require.NoError(t, err)
	require.Len(t, inserted, len(bad)+len(good))

	i := 0
	for _, r := range inserted {
		isGood := false
		for _, g := range good {
			if g.kind == r.Kind && strings.Contains(r.Payload, `"ok": true`) || g.kind == r.Kind && r.Kind == "email" && strings.Contains(r.Payload, "ann@") {
				isGood = true
			}
		}
		if isGood {
			w.Status(t, r.ID, "done", 30*time.Second)
			continue
		}
		s := w.Status(t, r.ID, "dead", 30*time.Second)
		require.Equal(t, 1, s.Attempts, "job %d %s %s", r.ID, r.Kind, r.Payload)
		require.NotNil(t, s.Error)
		found := false
		for _, b := range bad {
			if strings.Contains(*s.Error, b.want) && b.kind == r.Kind {
				found = true
			}
		}
		require.True(t, found, "job %d (%s %s) died with %q, which names no expected field", r.ID, r.Kind, r.Payload, *s.Error)
		i++
	}
	require.Equal(t, len(bad), i, "every malformed job is dead")
	require.NotEmpty(t, <-hits)
	require.Len(t, mail.Messages(), 1)

	// The worker is still serving, and stops cleanly.
	var id int64
	require.NoError(t, pgtest.Pool(t).QueryRow(context.Background(), "INSERT INTO "+jobs+" (kind, payload) VALUES ('http_callback', $1) RETURNING id",
		fmt.Sprintf(`{"url": %q}`, receiver.URL)).Scan(&id))
	w.Status(t, id, "done", 30*time.Second)
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 0, p.wait(t, 30*time.Second))
	require.NotContains(t, p.stderr.String(), "secret-pw")
}
