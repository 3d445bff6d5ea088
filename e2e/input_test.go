package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/pgdispatch/pgdispatch/executors/email"
	"github.com/pgdispatch/pgdispatch/internal/testkit/amqptest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/smtptest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/timing"
	"github.com/pgdispatch/pgdispatch/migrations"
)

// Scenario 6: producers insert with colliding dedup keys and update pending
// rows, in id order as every well-behaved writer does, and cancel() stops
// pending and running jobs, while workers complete batches, heartbeats
// renew short leases, one worker is killed so that the sweeper rescues its
// jobs, and a third of the callbacks fail and retry, all while a
// transaction is held open. Dead and cancelled jobs are deleted within
// 100 ms, as done jobs at once, so that the dedup keys recycle. No
// statement of pgdispatch's may deadlock, and every job runs.
func TestDeadlockHunt(t *testing.T) {
	skipShort(t)
	deadlockHunt(t, "deadlock", nil)
}

// Scenario 6 under flow limits: every job has one of eight flow keys, each
// at most 2 running, one of them strict and one also limited to 10 starts
// a second, so that claim_flow, with its advisory locks and its flow_keys
// rows, runs beside the completer, the sweeper (which also deletes
// flow_keys rows) and cancel(). No key runs more jobs than its limit in
// the database.
func TestDeadlockHuntWithLimits(t *testing.T) {
	skipShort(t)
	deadlockHunt(t, "deadlock_flow", &flowLimits{keys: 8, concurrency: 2, strict: "f3", rated: "f5", rate: 10, per: time.Second})
}

func deadlockHunt(t *testing.T, name string, limits *flowLimits) {
	s := newScenario(t, name, map[string]string{
		"LEASE": "600ms", "SWEEP_INTERVAL": "100ms", "RETAIN_DONE": "0", "RETAIN_DEAD": "100ms", "MAX_ATTEMPTS": "3",
	})
	s.dumpLogsOnFailure()
	r := newReceiver(t)
	// flowPrefix is NULL without limits: every job's flow key is NULL.
	var (
		flowPrefix *string
		running    *runningSampler
	)
	if limits != nil {
		s.declareLimits(limits)
		flowPrefix = new("f")
		running = s.sampleRunning()
	}
	// Each worker names its sessions, so that the kill below can wait for
	// the killed one's to end: a statement it sent just before, such as
	// an outcome, may still commit.
	start := func(id string) *worker {
		u, err := url.Parse(s.url)
		require.NoError(t, err)
		q := u.Query()
		q.Set("application_name", "pgdispatch-"+id)
		u.RawQuery = q.Encode()
		return s.startWorker(id, "DATABASE_URL="+u.String())
	}
	ws := make([]*worker, 3)
	for i := range ws {
		ws[i] = start(fmt.Sprintf("%s-%d", s.name, i+1))
	}
	for _, w := range ws {
		s.waitListening(w)
	}
	// A transaction held open from the start to the end of the drain, as a
	// report's: no row version the claims and outcomes leave behind can be
	// removed, so the workers claim from their cursors, and the jobs the
	// sweeper gives back and the rows moved to another priority land
	// behind them.
	hold, err := s.connect()
	require.NoError(t, err)
	defer func() { _ = hold.Close(context.Background()) }()
	for _, sql := range []string{"SET idle_in_transaction_session_timeout = 0", "BEGIN", "SELECT txid_current()"} {
		_, err := hold.Exec(context.Background(), sql)
		require.NoError(t, err)
	}

	ctx, stop := context.WithTimeout(context.Background(), streamFor)
	defer stop()
	var enqueued, updated, cancelled atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	execCount := func(conn *pgx.Conn, stmt string, args []any, count *atomic.Int64) error {
		callCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		tag, err := conn.Exec(callCtx, stmt, args...)
		if err != nil {
			return fmt.Errorf("%s: %w", stmt, err)
		}
		count.Add(tag.RowsAffected())
		return nil
	}
	// loop runs stmt again and again, every interval (0: at once).
	loop := func(stmt string, args []any, count *atomic.Int64, interval time.Duration) func() error {
		return func() error {
			conn, err := s.connect()
			if err != nil {
				return err
			}
			defer func() { _ = conn.Close(context.Background()) }()
			for gctx.Err() == nil {
				if err := execCount(conn, stmt, args, count); err != nil {
					return err
				}
				if interval > 0 {
					select {
					case <-gctx.Done():
					case <-time.After(interval):
					}
				}
			}
			return nil
		}
	}
	// A dedup key's jobs all have the same flow key ($4 || n % 8; NULL
	// without limits).
	enqueue := "SELECT " + s.ident() + ".enqueue($1, $2::jsonb, dedup_key => $3 || n, flow_key => $4::text || n % 8) " +
		"FROM (SELECT (random() * 40)::int n) r"
	for range 2 {
		g.Go(loop(enqueue, []any{"noop", `{"sleep": "150ms"}`, "dk-", flowPrefix}, &enqueued, 0))
	}
	g.Go(loop(enqueue, []any{"http_callback", fmt.Sprintf(`{"url": %q, "data": {"k": "flaky"}}`, r.url("/flaky")), "hk-", flowPrefix}, &enqueued, 0))
	g.Go(loop(`WITH l AS (
		SELECT id FROM `+s.jobs()+` WHERE status = 'pending' ORDER BY id LIMIT 20 FOR UPDATE
	) UPDATE `+s.jobs()+` j SET priority = (random() * 3)::int, run_at = now() FROM l WHERE j.id = l.id`, nil, &updated, 0))
	// cancel() on two jobs, pending or running, every 20 ms: it locks them in
	// id order, and tells a running job's worker to stop it. It spares the
	// jobs of the first worker (and of its restarts), which is killed so that
	// the sweeper rescues its jobs.
	g.Go(loop(`SELECT c.id FROM `+s.ident()+`.cancel(VARIADIC ARRAY(
		SELECT id FROM `+s.jobs()+` WHERE status IN ('pending', 'running') AND NOT starts_with(coalesce(locked_by, ''), $1)
		ORDER BY random() LIMIT 2)) c
	WHERE c.cancelled`, []any{ws[0].id}, &cancelled, 20*time.Millisecond))
	// Halfway, kill the first worker while it runs jobs; if it held none
	// once dead (they had just ended), start it again and try once more.
	g.Go(func() error {
		select {
		case <-gctx.Done():
			return nil
		case <-time.After(streamFor / 2):
		}
		for try := 1; ; try++ {
			if !s.waitRunning(gctx, ws[0].id) {
				return nil // the stream is over
			}
			s.fault(ws[0].kill9)
			var held int
			callCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := waitGone(callCtx, s.pool, "pgdispatch-"+ws[0].id)
			if err == nil {
				err = s.pool.QueryRow(callCtx, "SELECT count(*) FROM "+s.jobs()+" WHERE status = 'running' AND locked_by = $1", ws[0].id).Scan(&held)
			}
			cancel()
			if err != nil {
				return fmt.Errorf("count the jobs of the killed worker: %w", err)
			}
			t.Logf("killed %s, which held %d jobs", ws[0].id, held)
			ws[0] = start(fmt.Sprintf("%s-1-r%d", s.name, try))
			if held > 0 {
				return nil
			}
		}
	})
	require.NoError(t, g.Wait())
	s.waitListening(ws[0])
	s.drain(60 * time.Second)

	var rescued int64
	for _, w := range ws {
		rescued += int64(strings.Count(w.log.String(), "lease expired"))
	}
	t.Logf("summary %s: enqueue calls=%d pending rows updated=%d cancelled=%d flaky callbacks=%d rescued=%d deadlocks=0",
		s.name, enqueued.Load(), updated.Load(), cancelled.Load(), r.flakyCount(), rescued)
	require.Positive(t, enqueued.Load())
	require.Positive(t, updated.Load())
	require.Positive(t, cancelled.Load())
	require.Positive(t, rescued, "the sweeper rescued nothing: the scenario did not exercise it")
	if limits != nil {
		most, samples, failed := running.end()
		checkRunning(t, s.name, limits, most, samples, failed)
	}
	s.grepLogs()
	s.checkServing(r, slots)
}

// waitRunning waits until the worker id runs a job; it returns false if
// ctx ends first.
func (s *scenario) waitRunning(ctx context.Context, id string) bool {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var running bool
		err := s.pool.QueryRow(callCtx, "SELECT EXISTS (SELECT FROM "+s.jobs()+" WHERE status = 'running' AND locked_by = $1)", id).Scan(&running)
		cancel()
		if err == nil && running {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-tick.C:
		}
	}
}

// corpusCase is one row of bad input and what must become of it.
type corpusCase struct {
	name    string
	kind    string
	payload string // JSON text, cast by the server
	// cols sets other columns, as text the server casts: queue, attempts,
	// max_attempts, status, priority, run_at, and dedup_key in place of the
	// case's own key.
	cols map[string]string
	// viaTemp stores the payload in a temporary table first and inserts the
	// row with INSERT ... SELECT from it, so that the payload reaches the
	// jobs table compressed, as a writer's own table would send it.
	viaTemp bool
	// want is "dead" (with last_error containing wantErr), "reject" (the
	// INSERT fails with wantErr), "done" or "scheduled" (stays pending in
	// the future).
	want, wantErr string
	// attempts, when not 0, is the attempts the row must end with.
	attempts int
}

// Scenario 7: a corpus of bad rows in a stream of good ones. Every bad row is
// refused at INSERT with a clear message or ends dead with a clear
// last_error; the good jobs all run; no worker exits or spins, and no
// worker's memory grows past a bound.
func TestBadInput(t *testing.T) {
	skipShort(t)
	mail := smtptest.Start(t, "mailer", "s3cret-pass")
	s := newScenario(t, "badinput", map[string]string{
		"RABBITMQ_URL":              amqptest.URL(t),
		"SMTP_HOST":                 mail.Host,
		"SMTP_PORT":                 strconv.Itoa(mail.Port),
		"SMTP_USERNAME":             "mailer",
		"SMTP_PASSWORD":             "s3cret-pass",
		"SMTP_TLS":                  "none",
		"SMTP_ALLOW_PLAINTEXT_AUTH": "true", // the SMTP server is smtptest's, on this machine
		"SMTP_FROM":                 "pgdispatch@example.test",
	})
	s.dumpLogsOnFailure()
	r := newReceiver(t)
	amqptest.Queue(t, amqptest.URL(t), "e2e_badinput")
	amqptest.Queue(t, amqptest.URL(t), "e2e_badinput_other") // what CC and BCC would reach
	ws := s.startWorkers(2)
	// A third worker sends its email to a hostile SMTP server, one job at a
	// time from the queue hostile_smtp, so that its i-th connection serves
	// the i-th such row. It serves no other queue: a good email job of the
	// default queue would go to that server too.
	hostile := smtptest.StartHostile(t, 0, smtptest.EndlessLine, smtptest.EndlessMultiline, smtptest.EndlessEHLO, smtptest.EchoAuth)
	hw := s.startWorkerWith(s.name+"-hostile-smtp", map[string]string{
		"SMTP_HOST": hostile.Host, "SMTP_PORT": strconv.Itoa(hostile.Port), "QUEUES": "hostile_smtp:1",
	})
	hw.aside = true
	ws = append(ws, hw)
	echo := newEchoReceiver(t)

	ok := r.url("/hook")
	port := r.srv.Listener.Addr().(*net.TCPAddr).Port
	// Within the payload limit once the URL is added, and over it.
	huge := strings.Repeat("x", 1_040_000)
	overLimit := strings.Repeat("x", migrations.PayloadLimit)
	// 40 MB of one letter: pglz stores it in about 460 kB.
	big := fmt.Sprintf(`{"a": %q}`, strings.Repeat("a", 40_000_000))
	recipients := make([]string, email.DefaultMaxRecipients+1)
	for i := range recipients {
		recipients[i] = fmt.Sprintf("r%d@example.test", i)
	}
	manyTo, err := json.Marshal(recipients)
	require.NoError(t, err)
	// A hostile receiver's failures retry, and the workers' MAX_ATTEMPTS is
	// high: such rows get one attempt.
	once := map[string]string{"max_attempts": "1"}
	hostileSMTP := map[string]string{"max_attempts": "1", "queue": "hostile_smtp"}
	const hostileMail = `{"to": ["ann@example.test"], "subject": "s", "text": "t"}`
	limit := strconv.Itoa(migrations.AttemptsLimit)
	corpus := []corpusCase{
		// Payloads that are not objects.
		{name: "array payload", kind: "http_callback", payload: `[]`, want: "dead", wantErr: "payload"},
		{name: "string payload", kind: "http_callback", payload: `"https://example.test"`, want: "dead", wantErr: "payload"},
		{name: "number payload", kind: "rabbitmq", payload: `42`, want: "dead", wantErr: "payload"},
		{name: "JSON null payload", kind: "email", payload: `null`, want: "dead", wantErr: "payload"},
		{name: "not JSON", kind: "http_callback", payload: `{url: x}`, want: "reject", wantErr: "invalid input syntax for type json"},
		// Payload sizes.
		{name: "huge payload, 1 MB", kind: "http_callback", payload: fmt.Sprintf(`{"url": %q, "data": {"k": "huge", "blob": %q}}`, ok, huge), want: "done"},
		{name: "payload over 1 MiB", kind: "http_callback", payload: fmt.Sprintf(`{"url": %q, "data": {"k": "over", "blob": %q}}`, ok, overLimit), want: "reject", wantErr: "jobs_payload_size_check"},
		{name: "payload of 40 MB", kind: "http_callback", payload: big, want: "reject", wantErr: "jobs_payload_size_check"},
		{name: "payload of 40 MB, compressed", kind: "http_callback", payload: big, viaTemp: true, want: "reject", wantErr: "jobs_payload_size_check"},
		// http_callback fields.
		{name: "no url", kind: "http_callback", payload: `{"data": {}}`, want: "dead", wantErr: "payload.url"},
		{name: "url a number", kind: "http_callback", payload: `{"url": 42}`, want: "dead", wantErr: "payload.url"},
		{name: "url not absolute", kind: "http_callback", payload: `{"url": "/hooks/x"}`, want: "dead", wantErr: "payload.url"},
		{name: "url ftp", kind: "http_callback", payload: `{"url": "ftp://example.test/x"}`, want: "dead", wantErr: "payload.url"},
		{name: "method TRACE", kind: "http_callback", payload: fmt.Sprintf(`{"url": %q, "method": "TRACE"}`, ok), want: "dead", wantErr: "payload.method"},
		{name: "header a number", kind: "http_callback", payload: fmt.Sprintf(`{"url": %q, "headers": {"X-N": 1}}`, ok), want: "dead", wantErr: "payload.headers.X-N"},
		{name: "headers a string", kind: "http_callback", payload: fmt.Sprintf(`{"url": %q, "headers": "X-N: 1"}`, ok), want: "dead", wantErr: "payload.headers"},
		{name: "newline in a header", kind: "http_callback", payload: fmt.Sprintf(`{"url": %q, "headers": {"X-N": "a\r\nX-Injected: 1"}}`, ok), want: "dead", wantErr: "X-N"},
		{name: "NUL in a header", kind: "http_callback", payload: fmt.Sprintf(`{"url": %q, "headers": {"X-N": "a\u0000b"}}`, ok), want: "reject", wantErr: `unsupported Unicode escape sequence`},
		{name: "timeout a word", kind: "http_callback", payload: fmt.Sprintf(`{"url": %q, "timeout": "forever"}`, ok), want: "dead", wantErr: "timeout"},
		{name: "timeout negative", kind: "http_callback", payload: fmt.Sprintf(`{"url": %q, "timeout": -5}`, ok), want: "dead", wantErr: "timeout"},
		{name: "timeout past MAX_JOB_TIMEOUT", kind: "http_callback", payload: fmt.Sprintf(`{"url": %q, "data": {"k": "timeout-100000h"}, "timeout": "100000h"}`, ok), want: "dead", wantErr: "MAX_JOB_TIMEOUT", attempts: 1},
		{name: "unknown field", kind: "http_callback", payload: fmt.Sprintf(`{"url": %q, "dta": {}}`, ok), want: "dead", wantErr: "dta"},
		{name: "cloud metadata address", kind: "http_callback", payload: `{"url": "http://169.254.169.254/latest/meta-data"}`, want: "dead", wantErr: "refused"},
		{name: "zoned IPv6 address", kind: "http_callback", payload: fmt.Sprintf(`{"url": "http://[::1%%25lo]:%d/hook"}`, port), want: "dead", wantErr: "IPv6 zone", attempts: 1},
		{name: "unreachable url", kind: "http_callback", payload: `{"url": "http://127.0.0.1:1/closed"}`, want: "dead", wantErr: "refused", cols: map[string]string{"max_attempts": "2"}},
		{name: "invalid UTF-8", kind: "http_callback", payload: "{\"url\": \"http://example.test/\xff\xfe\"}", want: "reject", wantErr: "invalid byte sequence"},
		// Hostile receivers.
		{name: "slow trickle, 500", kind: "http_callback", payload: fmt.Sprintf(`{"url": %q, "timeout": "1h"}`, r.url("/trickle")), cols: once, want: "dead", wantErr: "HTTP 500 Internal Server Error: first bytes", attempts: 1},
		{name: "slow trickle, 200", kind: "http_callback", payload: fmt.Sprintf(`{"url": %q, "timeout": "1h"}`, r.url("/trickle?status=200")), cols: once, want: "done"},
		{name: "huge headers", kind: "http_callback", payload: fmt.Sprintf(`{"url": %q}`, r.url("/huge-headers")), cols: once, want: "dead", wantErr: "response headers exceeded", attempts: 1},
		// The refusal is permanent: the row has the workers' MAX_ATTEMPTS and must end after one.
		{name: "redirect to another host", kind: "http_callback", payload: fmt.Sprintf(`{"url": %q, "headers": {"X-Api-Key": "k"}, "data": {"k": "stolen"}}`, r.url("/redirect-away")), want: "dead", wantErr: "refused: redirect", attempts: 1},
		{name: "ANSI in the body", kind: "http_callback", payload: fmt.Sprintf(`{"url": %q}`, r.url("/ansi")), cols: once, want: "dead", wantErr: `\x1b[31mboom`, attempts: 1},
		{name: "echoing receiver", kind: "http_callback", payload: fmt.Sprintf(`{"url": %q, "headers": {"Authorization": "Bearer %s", "X-Api-Key": %q, "Cookie": "session=%s"}, "data": {"password": %q}}`,
			echo.URL, echoed[0], echoed[1], echoed[2], echoed[3]), cols: once, want: "dead", wantErr: "HTTP 500 Internal Server Error: <html>", attempts: 1},
		// Hostile SMTP servers, in the order of their connections.
		{name: "SMTP greeting that never ends", kind: "email", payload: hostileMail, cols: hostileSMTP, want: "dead", wantErr: "reply ran past", attempts: 1},
		{name: "SMTP multi-line greeting that never ends", kind: "email", payload: hostileMail, cols: hostileSMTP, want: "dead", wantErr: "reply ran past", attempts: 1},
		{name: "SMTP EHLO reply that never ends", kind: "email", payload: hostileMail, cols: hostileSMTP, want: "dead", wantErr: "reply ran past", attempts: 1},
		{name: "SMTP server echoing AUTH", kind: "email", payload: hostileMail, cols: hostileSMTP, want: "dead", wantErr: "535", attempts: 1},
		// rabbitmq fields.
		{name: "no routing_key", kind: "rabbitmq", payload: `{"body": {}}`, want: "dead", wantErr: "payload.routing_key"},
		{name: "routing_key a number", kind: "rabbitmq", payload: `{"routing_key": 5, "body": {}}`, want: "dead", wantErr: "payload.routing_key"},
		{name: "no body", kind: "rabbitmq", payload: `{"routing_key": "e2e_badinput"}`, want: "dead", wantErr: "payload.body"},
		{name: "no such exchange", kind: "rabbitmq", payload: `{"exchange": "e2e-no-such-exchange", "routing_key": "x", "body": {}}`, want: "dead", wantErr: "exchange", cols: map[string]string{"max_attempts": "2"}},
		{name: "unroutable", kind: "rabbitmq", payload: `{"routing_key": "e2e-no-such-queue", "body": {}}`, want: "dead", wantErr: "unroutable", cols: map[string]string{"max_attempts": "2"}},
		{name: "CC header", kind: "rabbitmq", payload: `{"routing_key": "e2e_badinput", "body": {"k": "cc"}, "headers": {"CC": ["e2e_badinput_other"]}}`, want: "dead", wantErr: "payload.headers.CC: is refused", attempts: 1},
		{name: "bcc header", kind: "rabbitmq", payload: `{"routing_key": "e2e_badinput", "body": {"k": "bcc"}, "headers": {"bcc": ["e2e_badinput_other"]}}`, want: "dead", wantErr: "payload.headers.bcc: is refused", attempts: 1},
		// email fields.
		{name: "to a string", kind: "email", payload: `{"to": "ann@example.test", "subject": "s", "text": "t"}`, want: "dead", wantErr: "payload.to"},
		{name: "bad address", kind: "email", payload: `{"to": ["not an address"], "subject": "s", "text": "t"}`, want: "dead", wantErr: "payload.to"},
		{name: "no subject", kind: "email", payload: `{"to": ["ann@example.test"], "text": "t"}`, want: "dead", wantErr: "payload.subject"},
		{name: "no text nor html", kind: "email", payload: `{"to": ["ann@example.test"], "subject": "s"}`, want: "dead", wantErr: "text"},
		{name: "forbidden header", kind: "email", payload: `{"to": ["ann@example.test"], "subject": "s", "text": "t", "headers": {"Bcc": "eve@example.test"}}`, want: "dead", wantErr: "Bcc"},
		{name: "recipient rejected", kind: "email", payload: `{"to": ["reject@example.test"], "subject": "s", "text": "t"}`, want: "dead", wantErr: "550"},
		{name: "51 recipients", kind: "email", payload: fmt.Sprintf(`{"to": %s, "subject": "s", "text": "t"}`, manyTo), want: "dead", wantErr: "at most 50", attempts: 1},
		{name: "from another sender", kind: "email", payload: `{"to": ["ann@example.test"], "from": "CEO <ceo@bank.test>", "subject": "s", "text": "t"}`, want: "dead", wantErr: "not an allowed sender", attempts: 1},
		// Kinds and columns.
		{name: "noop sleep a word", kind: "noop", payload: `{"sleep": "a while"}`, want: "dead", wantErr: "sleep"},
		{name: "unknown kind", kind: "no_such_kind", payload: `{}`, want: "dead", wantErr: "unknown kind"},
		{name: "empty kind", kind: "", payload: `{}`, want: "reject", wantErr: "jobs_kind_check"},
		{name: "kind of 129 characters", kind: strings.Repeat("k", 129), payload: `{}`, want: "reject", wantErr: "jobs_kind_check"},
		{name: "empty queue", kind: "noop", payload: `{}`, cols: map[string]string{"queue": ""}, want: "reject", wantErr: "jobs_queue_check"},
		{name: "queue of 9000 characters", kind: "noop", payload: `{}`, cols: map[string]string{"queue": strings.Repeat("q", 9000)}, want: "reject", wantErr: "jobs_queue_check"},
		// A schedule's slot key: a writer that could take one ahead of its
		// slot would run its own payload in the schedule's place.
		{
			name: "dedup_key of a schedule's slot", kind: "http_callback", payload: fmt.Sprintf(`{"url": %q, "data": {"k": "slot-taken"}}`, ok),
			cols: map[string]string{"dedup_key": "schedule:e2e-nightly:2030-01-01T00:00:00Z"}, want: "reject", wantErr: `dedup_key "schedule:e2e-nightly:2030-01-01T00:00:00Z" is reserved for the schedules' jobs`,
		},
		{name: "dedup_key of 600 characters", kind: "noop", payload: `{}`, cols: map[string]string{"dedup_key": strings.Repeat("d", 600)}, want: "reject", wantErr: "jobs_dedup_key_check"},
		{name: "attempts 2^31-1", kind: "noop", payload: `{}`, cols: map[string]string{"attempts": "2147483647"}, want: "reject", wantErr: "jobs_attempts_check"},
		{name: "attempts at the limit", kind: "http_callback", payload: `{"url": "http://127.0.0.1:1/closed"}`, cols: map[string]string{"attempts": limit, "max_attempts": limit}, want: "dead", wantErr: "refused", attempts: migrations.AttemptsLimit},
		{name: "max_attempts 2^31-1", kind: "noop", payload: `{}`, cols: map[string]string{"max_attempts": "2147483647"}, want: "reject", wantErr: "jobs_max_attempts_check"},
		{name: "negative max_attempts", kind: "noop", payload: `{}`, cols: map[string]string{"max_attempts": "-1"}, want: "reject", wantErr: "jobs_max_attempts_check"},
		{name: "zero max_attempts", kind: "noop", payload: `{}`, cols: map[string]string{"max_attempts": "0"}, want: "reject", wantErr: "jobs_max_attempts_check"},
		{name: "unknown status", kind: "noop", payload: `{}`, cols: map[string]string{"status": "later"}, want: "reject", wantErr: "jobs_status_check"},
		{name: "priority out of range", kind: "noop", payload: `{}`, cols: map[string]string{"priority": "40000"}, want: "reject", wantErr: "out of range for type smallint"},
		{name: "run_at infinity", kind: "noop", payload: `{}`, cols: map[string]string{"run_at": "infinity"}, want: "reject", wantErr: "jobs_run_at_check"},
		{name: "run_at -infinity", kind: "noop", payload: `{}`, cols: map[string]string{"run_at": "-infinity"}, want: "reject", wantErr: "jobs_run_at_check"},
		{name: "run_at in year 294276", kind: "noop", payload: `{}`, cols: map[string]string{"run_at": "294276-01-01 00:00:00+00"}, want: "reject", wantErr: "jobs_run_at_check"},
		{name: "run_at in 4713 BC", kind: "noop", payload: `{}`, cols: map[string]string{"run_at": "4713-01-01 00:00:00+00 BC"}, want: "reject", wantErr: "jobs_run_at_check"},
		{name: "run_at in year 9999", kind: "noop", payload: `{}`, cols: map[string]string{"run_at": "9999-01-01 00:00:00+00"}, want: "reject", wantErr: "jobs_run_at_check"},
		{name: "run_at in year 9998", kind: "noop", payload: `{}`, cols: map[string]string{"run_at": "9998-12-31 00:00:00+00"}, want: "scheduled"},
	}
	require.GreaterOrEqual(t, len(corpus), 60)

	// Good jobs before, between and after the bad ones.
	var goodKeys []string
	good := func() {
		key := fmt.Sprintf("%s-good-%d", s.name, len(goodKeys))
		s.insertCase(t, corpusCase{kind: "http_callback", payload: fmt.Sprintf(`{"url": %q, "data": {"k": %q}}`, ok, key)}, key)
		goodKeys = append(goodKeys, key)
	}
	ids := map[string]int64{}
	for i, c := range corpus {
		good()
		id, err := s.insert(t, c, fmt.Sprintf("bad-%d", i))
		if c.want == "reject" {
			require.Error(t, err, "%s: the INSERT was accepted", c.name)
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr, c.name)
			assert.Contains(t, pgErr.Error(), c.wantErr, "%s: a clear message", c.name)
			continue
		}
		require.NoError(t, err, c.name)
		ids[c.name] = id
	}
	good()
	// A schedule's payload is measured as a job's, decompressed: its
	// payload becomes its jobs'.
	func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := s.pool.Exec(ctx, "SELECT "+s.ident()+".schedule('e2e-huge', '0 3 * * *', 'noop', $1::text::jsonb)", big)
		var pgErr *pgconn.PgError
		if assert.ErrorAs(t, err, &pgErr, "a schedule of a 40 MB payload") {
			assert.Contains(t, pgErr.Error(), "schedules_payload_size_check", "a schedule of a 40 MB payload: a clear message")
		}
	}()
	s.drain(60 * time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, c := range corpus {
		id, inserted := ids[c.name]
		if !inserted {
			continue
		}
		var (
			status   string
			lastErr  *string
			runAt    time.Time
			attempts int
		)
		require.NoError(t, s.pool.QueryRow(ctx, "SELECT status, last_error, run_at, attempts FROM "+s.jobs()+" WHERE id = $1", id).
			Scan(&status, &lastErr, &runAt, &attempts))
		switch c.want {
		case "dead":
			if assert.Equal(t, "dead", status, "%s: last_error %s", c.name, deref(lastErr)) && assert.NotNil(t, lastErr, c.name) {
				assert.Contains(t, *lastErr, c.wantErr, "%s: a clear last_error", c.name)
				for _, secret := range leaks {
					assert.Empty(t, around(*lastErr, secret), "%s: %q in last_error", c.name, secret)
				}
				assert.Empty(t, controls(*lastErr), "%s: control characters in last_error %q", c.name, *lastErr)
			}
		case "done":
			assert.Equal(t, "done", status, "%s: last_error %s", c.name, deref(lastErr))
		case "scheduled":
			assert.Equal(t, "pending", status, c.name)
			assert.Equal(t, 9998, runAt.UTC().Year(), c.name)
		}
		if c.attempts != 0 {
			assert.Equal(t, c.attempts, attempts, "%s: attempts", c.name)
		}
	}
	for _, name := range []string{"echoing receiver", "SMTP server echoing AUTH"} {
		var history string
		require.NoError(t, s.pool.QueryRow(ctx, "SELECT errors::text FROM "+s.jobs()+" WHERE id = $1", ids[name]).Scan(&history))
		out, err := s.command(ctx, "jobs", "show", strconv.FormatInt(ids[name], 10)).CombinedOutput()
		require.NoError(t, err, "jobs show: %s", out)
		for _, secret := range leaks {
			assert.Empty(t, around(history, secret), "%s: %q in the errors history", name, secret)
			assert.Empty(t, around(string(out), secret), "%s: %q in jobs show", name, secret)
		}
	}
	for _, secret := range leaks {
		assert.Empty(t, around(s.logs(), secret), "%q in the workers' logs", secret)
	}
	assert.Equal(t, 1, echo.requests(), "one request for the echoing receiver's row")
	require.Len(t, hostile.Conns, 4, "one connection for each hostile SMTP row")
	for range 4 {
		c := <-hostile.Conns
		select {
		case <-c.Closed: // the hostile server holds a connection until the worker closes it
			t.Logf("hostile SMTP server, %s: the worker closed the connection; the server sent %d bytes", c.Behaviour, c.Written())
		case <-time.After(10 * time.Second):
			t.Errorf("hostile SMTP server, %s: the job is dead, and the worker still holds its connection", c.Behaviour)
		}
	}

	got := r.deliveries()
	for _, k := range append(goodKeys, "huge") {
		assert.Equal(t, 1, got[k], "good job %s", k)
	}
	assert.Zero(t, got["timeout-100000h"], "the job whose timeout is past MAX_JOB_TIMEOUT ran")
	assert.Zero(t, r.stolen.Load(), "a redirect reached another host")
	trickles := r.trickleTimes()
	assert.Len(t, trickles, 2, "one request for each trickle row")
	for _, d := range trickles {
		// The worker reads a body for 2 s after its status: far from the
		// hour the payload allows.
		assert.Less(t, d, 10*time.Second, "the worker read a trickling body for %s", d)
	}
	require.Empty(t, mail.Messages(), "no bad email may have been sent")
	for _, q := range []string{"e2e_badinput", "e2e_badinput_other"} {
		assert.Empty(t, amqptest.Drain(t, amqptest.URL(t), q), "a bad rabbitmq job published to %s", q)
	}

	// Idle now, with a job due in the year 9998: the workers must sleep,
	// not spin. They are watched over the same 2 s.
	before := make([]time.Duration, len(ws))
	for i, w := range ws {
		before[i] = cpuTime(t, w)
	}
	start := time.Now()
	<-time.After(2 * time.Second)
	for i, w := range ws {
		used := cpuTime(t, w) - before[i]
		idle := time.Since(start).Round(time.Millisecond)
		// A spinning worker takes a core: half the window is far from
		// what a sleeping one uses, however loaded the machine.
		assert.Less(t, used, idle/2, "worker %s used %s of CPU in %s while idle: it spins", w.id, used, idle)
		timing.Below(t, fmt.Sprintf("worker %s's CPU in %s while idle", w.id, idle), used, 150*time.Millisecond)
	}
	s.checkServing(r, slots)

	// Peak memory: a claim loads at most CONCURRENCY payloads of at most
	// 1 MiB, a reply's headers are cut at 64 KiB, and an SMTP reply at
	// 64 KiB. Each worker stays near 25 MB; the bound is 5 times that, and
	// the two 40 MB payloads, were they accepted, take a worker to about
	// 280 MB; an endless SMTP reply read to its end, to gigabytes.
	var peaks []string
	for _, w := range ws {
		peak := peakRSS(t, w)
		peaks = append(peaks, fmt.Sprintf("%s=%.0fMB", w.id, float64(peak)/1e6))
		assert.Less(t, peak, int64(150e6), "worker %s reached %d bytes of resident memory", w.id, peak)
	}
	t.Logf("summary %s: bad rows=%d (rejected at INSERT %d, dead %d, done %d, scheduled %d) good jobs=%d delivered=%d lost=0 trickles=%v peak_rss=%s",
		s.name, len(corpus), countWant(corpus, "reject"), countWant(corpus, "dead"), countWant(corpus, "done"), countWant(corpus, "scheduled"),
		len(goodKeys), len(goodKeys), roundAll(trickles), strings.Join(peaks, ","))
	s.grepLogs()
}

// echoed are the secrets the echoing receiver's row sends, and leaks
// every secret that must stay out of last_error, the errors history, the
// logs and jobs show: those, the SMTP password, and its base64 in AUTH
// PLAIN, whole and as the part that stands for the password.
var (
	echoed    = []string{"e2e-bearer-0ne", "e2e-api-key-tw0", "e2e-cookie-thr33", "e2e-data-passw0rd"}
	authPlain = base64.StdEncoding.EncodeToString([]byte("\x00mailer\x00s3cret-pass"))
	leaks     = append([]string{"s3cret-pass", authPlain, authPlain[12:]}, echoed...)
)

// around is the text around the first secret in s, or "" when s holds
// none.
func around(s, secret string) string {
	i := strings.Index(s, secret)
	if i < 0 {
		return ""
	}
	return s[max(0, i-100):min(len(s), i+len(secret)+20)]
}

// echoReceiver answers every request with a 500 and an error page that
// quotes the request's headers and body, as httpbin's pages and many a
// framework's debug page do.
type echoReceiver struct {
	*httptest.Server
	count atomic.Int64
}

func newEchoReceiver(t *testing.T) *echoReceiver {
	t.Helper()
	e := &echoReceiver{}
	e.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		e.count.Add(1)
		body, _ := io.ReadAll(io.LimitReader(req.Body, 4096))
		var b strings.Builder
		b.WriteString("<html><h1>Internal Server Error</h1><table>")
		for _, name := range []string{"Authorization", "X-Api-Key", "Cookie"} {
			fmt.Fprintf(&b, "<tr><td>%s</td><td>%s</td></tr>", name, html.EscapeString(req.Header.Get(name)))
		}
		fmt.Fprintf(&b, "</table><pre>%s</pre></html>", html.EscapeString(string(body)))
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, b.String())
	}))
	t.Cleanup(e.Close)
	return e
}

func (e *echoReceiver) requests() int { return int(e.count.Load()) }

// startWorkerWith starts a worker with settings of its own on top of the
// scenario's, and waits until it listens.
func (s *scenario) startWorkerWith(id string, env map[string]string) *worker {
	s.t.Helper()
	saved := maps.Clone(s.env)
	maps.Copy(s.env, env)
	w := s.startWorker(id)
	s.env = saved
	s.waitListening(w)
	return w
}

func countWant(corpus []corpusCase, want string) int {
	n := 0
	for _, c := range corpus {
		if c.want == want {
			n++
		}
	}
	return n
}

// controls is the control characters in s other than tab and newline: what
// a terminal would act on.
func controls(s string) []rune {
	var out []rune
	for _, r := range s {
		if unicode.IsControl(r) && r != '\n' && r != '\t' {
			out = append(out, r)
		}
	}
	return out
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(10 * time.Millisecond)
	}
	return out
}

// insert writes one row with the server casting every value, so that bad
// values fail there, as they would for any writer.
func (s *scenario) insert(t *testing.T, c corpusCase, key string) (int64, error) {
	t.Helper()
	args := pgx.NamedArgs{
		"kind": c.kind, "payload": c.payload, "dedup_key": key,
		"queue": nil, "attempts": nil, "max_attempts": nil, "status": nil, "priority": nil, "run_at": nil,
	}
	for name, v := range c.cols {
		args[name] = v
	}
	payload, from := "@payload::text::jsonb", ""
	if c.viaTemp {
		payload, from = "p.payload", " FROM e2e_payload p"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var id int64
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if c.viaTemp {
			if _, err := tx.Exec(ctx, "CREATE TEMPORARY TABLE e2e_payload ON COMMIT DROP AS SELECT $1::text::jsonb AS payload", c.payload); err != nil {
				return err
			}
			var stored int
			if err := tx.QueryRow(ctx, "SELECT pg_column_size(payload) FROM e2e_payload").Scan(&stored); err != nil {
				return err
			}
			require.LessOrEqual(t, stored, migrations.PayloadLimit, "%s: the payload is stored uncompressed, so the case tests no more than the CHECK", c.name)
		}
		return tx.QueryRow(ctx, "INSERT INTO "+s.jobs()+" (kind, payload, dedup_key, queue, attempts, max_attempts, status, priority, run_at)"+
			" SELECT @kind, "+payload+", @dedup_key, coalesce(@queue::text, 'default'), coalesce(@attempts::text::int, 0),"+
			" @max_attempts::text::int, coalesce(@status::text, 'pending'), coalesce(@priority::text::smallint, 0),"+
			" coalesce(@run_at::text::timestamptz, now())"+from+" RETURNING id", args).Scan(&id)
	})
	return id, err
}

func (s *scenario) insertCase(t *testing.T, c corpusCase, key string) {
	t.Helper()
	_, err := s.insert(t, c, key)
	require.NoError(t, err)
}

// peakRSS is the most resident memory the worker's process has held, in
// bytes (VmHWM).
func peakRSS(t *testing.T, w *worker) int64 {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", w.cmd.Process.Pid))
	require.NoError(t, err)
	for line := range strings.Lines(string(raw)) {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kB, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			require.NoError(t, err, "VmHWM %q", v)
			return kB << 10
		}
	}
	t.Fatalf("no VmHWM in /proc/%d/status", w.cmd.Process.Pid)
	return 0
}

// cpuTime is the user and system CPU time the worker's process has used.
func cpuTime(t *testing.T, w *worker) time.Duration {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", w.cmd.Process.Pid))
	require.NoError(t, err)
	// Fields after the command name, which is in parentheses.
	fields := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	require.NoError(t, errors.Join(err1, err2))
	return time.Duration(utime+stime) * 10 * time.Millisecond // USER_HZ is 100 on Linux
}

// waitGone waits until no session of the database named app is left: the
// sessions of a killed process end once the statements it sent have.
func waitGone(ctx context.Context, pool *pgxpool.Pool, app string) error {
	for {
		var n int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("sessions of %s still open: %w", app, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
