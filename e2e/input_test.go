package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	"github.com/pgdispatch/pgdispatch/internal/amqptest"
	"github.com/pgdispatch/pgdispatch/internal/smtptest"
)

// Scenario 6: producers insert with colliding dedup keys and update pending
// rows, in id order as every well-behaved writer does, while workers
// complete batches, heartbeats renew short leases, one worker is killed so
// that the sweeper rescues its jobs, and a third of the callbacks fail and
// retry. No statement of pgdispatch's may deadlock.
func TestDeadlockHunt(t *testing.T) {
	s := newScenario(t, "deadlock", map[string]string{
		"LEASE": "600ms", "SWEEP_INTERVAL": "100ms", "RETAIN_DONE": "0", "MAX_ATTEMPTS": "3",
	})
	s.dumpLogsOnFailure()
	r := newReceiver(t)
	ws := s.startWorkers(3)

	ctx, stop := context.WithTimeout(context.Background(), streamFor)
	defer stop()
	var enqueued, updated atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	loop := func(stmt string, args []any, count *atomic.Int64) func() error {
		return func() error {
			conn, err := s.connect()
			if err != nil {
				return err
			}
			defer func() { _ = conn.Close(context.Background()) }()
			for gctx.Err() == nil {
				callCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				tag, err := conn.Exec(callCtx, stmt, args...)
				cancel()
				if err != nil {
					return fmt.Errorf("%s: %w", stmt, err)
				}
				count.Add(tag.RowsAffected())
			}
			return nil
		}
	}
	enqueue := "SELECT " + s.ident() + ".enqueue($1, $2::jsonb, dedup_key => $3 || (random() * 40)::int)"
	for range 2 {
		g.Go(loop(enqueue, []any{"noop", `{"sleep": "150ms"}`, "dk-"}, &enqueued))
	}
	g.Go(loop(enqueue, []any{"http_callback", fmt.Sprintf(`{"url": %q, "data": {"k": "flaky"}}`, r.url("/flaky")), "hk-"}, &enqueued))
	g.Go(loop(`WITH l AS (
		SELECT id FROM `+s.jobs()+` WHERE status = 'pending' ORDER BY id LIMIT 20 FOR UPDATE
	) UPDATE `+s.jobs()+` j SET priority = (random() * 3)::int, run_at = now() FROM l WHERE j.id = l.id`, nil, &updated))
	g.Go(func() error {
		select {
		case <-gctx.Done():
		case <-time.After(streamFor / 2):
			var held int
			_ = s.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+s.jobs()+" WHERE locked_by = $1", ws[0].id).Scan(&held)
			t.Logf("killing %s, which holds %d jobs", ws[0].id, held)
			s.fault(ws[0].kill9)
			ws[0] = s.startWorker(s.name + "-1-r1")
		}
		return nil
	})
	require.NoError(t, g.Wait())
	s.waitListening(ws[0])
	s.drain(60 * time.Second)

	var rescued int64
	for _, w := range ws {
		rescued += int64(strings.Count(w.log.String(), "lease expired"))
	}
	t.Logf("summary %s: enqueue calls=%d pending rows updated=%d flaky callbacks=%d rescued=%d deadlocks=0",
		s.name, enqueued.Load(), updated.Load(), r.flakyCount(), rescued)
	require.Positive(t, enqueued.Load())
	require.Positive(t, updated.Load())
	require.Positive(t, rescued, "the sweeper rescued nothing: the scenario did not exercise it")
	s.grepLogs()
	s.checkServing(r, slots)
}

// corpusCase is one row of bad input and what must become of it.
type corpusCase struct {
	name    string
	kind    string
	payload string // JSON text, cast by the server
	cols    map[string]string
	// want is "dead" (with last_error containing wantErr), "reject" (the
	// INSERT fails with wantErr), "done" or "scheduled" (stays pending in
	// the future).
	want, wantErr string
}

// Scenario 7: a corpus of bad rows in a stream of good ones. Every bad row is
// refused at INSERT with a clear message or ends dead with a clear
// last_error; the good jobs all run; no worker exits or spins.
func TestBadInput(t *testing.T) {
	mail := smtptest.Start(t, "mailer", "s3cret-pass")
	s := newScenario(t, "badinput", map[string]string{
		"RABBITMQ_URL":  amqptest.URL(t),
		"SMTP_HOST":     mail.Host,
		"SMTP_PORT":     strconv.Itoa(mail.Port),
		"SMTP_USERNAME": "mailer",
		"SMTP_PASSWORD": "s3cret-pass",
		"SMTP_TLS":      "none",
		"SMTP_FROM":     "pgdispatch@example.test",
	})
	s.dumpLogsOnFailure()
	r := newReceiver(t)
	amqptest.Queue(t, amqptest.URL(t), "e2e_badinput")
	ws := s.startWorkers(2)

	ok := r.url("/hook")
	huge := strings.Repeat("x", 1<<20)
	corpus := []corpusCase{
		// Payloads that are not objects.
		{name: "array payload", kind: "http_callback", payload: `[]`, want: "dead", wantErr: "payload"},
		{name: "string payload", kind: "http_callback", payload: `"https://example.test"`, want: "dead", wantErr: "payload"},
		{name: "number payload", kind: "rabbitmq", payload: `42`, want: "dead", wantErr: "payload"},
		{name: "JSON null payload", kind: "email", payload: `null`, want: "dead", wantErr: "payload"},
		{name: "not JSON", kind: "http_callback", payload: `{url: x}`, want: "reject", wantErr: "invalid input syntax for type json"},
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
		{name: "unknown field", kind: "http_callback", payload: fmt.Sprintf(`{"url": %q, "dta": {}}`, ok), want: "dead", wantErr: "dta"},
		{name: "cloud metadata address", kind: "http_callback", payload: `{"url": "http://169.254.169.254/latest/meta-data"}`, want: "dead", wantErr: "refused"},
		{name: "unreachable url", kind: "http_callback", payload: `{"url": "http://127.0.0.1:1/closed"}`, want: "dead", wantErr: "refused", cols: map[string]string{"max_attempts": "2"}},
		{name: "huge payload, 1 MB", kind: "http_callback", payload: fmt.Sprintf(`{"url": %q, "data": {"k": "huge", "blob": %q}}`, ok, huge), want: "done"},
		{name: "invalid UTF-8", kind: "http_callback", payload: "{\"url\": \"http://example.test/\xff\xfe\"}", want: "reject", wantErr: "invalid byte sequence"},
		// rabbitmq fields.
		{name: "no routing_key", kind: "rabbitmq", payload: `{"body": {}}`, want: "dead", wantErr: "payload.routing_key"},
		{name: "routing_key a number", kind: "rabbitmq", payload: `{"routing_key": 5, "body": {}}`, want: "dead", wantErr: "payload.routing_key"},
		{name: "no body", kind: "rabbitmq", payload: `{"routing_key": "e2e_badinput"}`, want: "dead", wantErr: "payload.body"},
		{name: "no such exchange", kind: "rabbitmq", payload: `{"exchange": "e2e-no-such-exchange", "routing_key": "x", "body": {}}`, want: "dead", wantErr: "exchange", cols: map[string]string{"max_attempts": "2"}},
		{name: "unroutable", kind: "rabbitmq", payload: `{"routing_key": "e2e-no-such-queue", "body": {}}`, want: "dead", wantErr: "unroutable", cols: map[string]string{"max_attempts": "2"}},
		// email fields.
		{name: "to a string", kind: "email", payload: `{"to": "ann@example.test", "subject": "s", "text": "t"}`, want: "dead", wantErr: "payload.to"},
		{name: "bad address", kind: "email", payload: `{"to": ["not an address"], "subject": "s", "text": "t"}`, want: "dead", wantErr: "payload.to"},
		{name: "no subject", kind: "email", payload: `{"to": ["ann@example.test"], "text": "t"}`, want: "dead", wantErr: "payload.subject"},
		{name: "no text nor html", kind: "email", payload: `{"to": ["ann@example.test"], "subject": "s"}`, want: "dead", wantErr: "text"},
		{name: "forbidden header", kind: "email", payload: `{"to": ["ann@example.test"], "subject": "s", "text": "t", "headers": {"Bcc": "eve@example.test"}}`, want: "dead", wantErr: "Bcc"},
		{name: "recipient rejected", kind: "email", payload: `{"to": ["reject@example.test"], "subject": "s", "text": "t"}`, want: "dead", wantErr: "550"},
		// Kinds and columns.
		{name: "noop sleep a word", kind: "noop", payload: `{"sleep": "a while"}`, want: "dead", wantErr: "sleep"},
		{name: "unknown kind", kind: "no_such_kind", payload: `{}`, want: "dead", wantErr: "unknown kind"},
		{name: "empty kind", kind: "", payload: `{}`, want: "reject", wantErr: "jobs_kind_check"},
		{name: "empty queue", kind: "noop", payload: `{}`, cols: map[string]string{"queue": ""}, want: "reject", wantErr: "jobs_queue_check"},
		{name: "negative max_attempts", kind: "noop", payload: `{}`, cols: map[string]string{"max_attempts": "-1"}, want: "reject", wantErr: "jobs_max_attempts_check"},
		{name: "zero max_attempts", kind: "noop", payload: `{}`, cols: map[string]string{"max_attempts": "0"}, want: "reject", wantErr: "jobs_max_attempts_check"},
		{name: "unknown status", kind: "noop", payload: `{}`, cols: map[string]string{"status": "later"}, want: "reject", wantErr: "jobs_status_check"},
		{name: "priority out of range", kind: "noop", payload: `{}`, cols: map[string]string{"priority": "40000"}, want: "reject", wantErr: "out of range for type smallint"},
		{name: "run_at infinity", kind: "noop", payload: `{}`, cols: map[string]string{"run_at": "infinity"}, want: "reject", wantErr: "jobs_run_at_check"},
		{name: "run_at -infinity", kind: "noop", payload: `{}`, cols: map[string]string{"run_at": "-infinity"}, want: "reject", wantErr: "jobs_run_at_check"},
		{name: "run_at in year 9999", kind: "noop", payload: `{}`, cols: map[string]string{"run_at": "9999-12-31 00:00:00+00"}, want: "scheduled"},
	}
	require.GreaterOrEqual(t, len(corpus), 30)

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
		id, err := s.insert(c, fmt.Sprintf("bad-%d", i))
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
	s.drain(60 * time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, c := range corpus {
		id, inserted := ids[c.name]
		if !inserted {
			continue
		}
		var (
			status  string
			lastErr *string
			runAt   time.Time
		)
		require.NoError(t, s.pool.QueryRow(ctx, "SELECT status, last_error, run_at FROM "+s.jobs()+" WHERE id = $1", id).Scan(&status, &lastErr, &runAt))
		switch c.want {
		case "dead":
			if assert.Equal(t, "dead", status, "%s: last_error %s", c.name, deref(lastErr)) && assert.NotNil(t, lastErr, c.name) {
				assert.Contains(t, *lastErr, c.wantErr, "%s: a clear last_error", c.name)
				assert.NotContains(t, *lastErr, "s3cret-pass", "%s: the SMTP password leaked", c.name)
			}
		case "done":
			assert.Equal(t, "done", status, "%s: last_error %s", c.name, deref(lastErr))
		case "scheduled":
			assert.Equal(t, "pending", status, c.name)
			assert.Equal(t, 9999, runAt.Year(), c.name)
		}
	}
	got := r.deliveries()
	for _, k := range append(goodKeys, "huge") {
		assert.Equal(t, 1, got[k], "good job %s", k)
	}
	require.Empty(t, mail.Messages(), "no bad email may have been sent")

	// Idle now, with a job due in the year 9999: the workers must sleep,
	// not spin.
	for _, w := range ws {
		before := cpuTime(t, w)
		start := time.Now()
		<-time.After(2 * time.Second)
		used := cpuTime(t, w) - before
		t.Logf("worker %s: %s of CPU in %s while idle", w.id, used, time.Since(start).Round(time.Millisecond))
		assert.Less(t, used, 150*time.Millisecond, "worker %s used %s of CPU in %s while idle: it spins", w.id, used, time.Since(start).Round(time.Millisecond))
	}
	t.Logf("summary %s: bad rows=%d (rejected at INSERT %d, dead %d, done %d, scheduled %d) good jobs=%d delivered=%d lost=0",
		s.name, len(corpus), countWant(corpus, "reject"), countWant(corpus, "dead"), countWant(corpus, "done"), countWant(corpus, "scheduled"),
		len(goodKeys), len(goodKeys))
	s.checkServing(r, slots)
	s.grepLogs()
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

// insert writes one row with the server casting every value, so that bad
// values fail there, as they would for any writer.
func (s *scenario) insert(c corpusCase, key string) (int64, error) {
	col := func(name string) *string {
		if v, ok := c.cols[name]; ok {
			return &v
		}
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var id int64
	err := s.pool.QueryRow(ctx, "INSERT INTO "+s.jobs()+
		" (kind, payload, dedup_key, queue, max_attempts, status, priority, run_at) VALUES ($1, $2::text::jsonb, $3,"+
		" coalesce($4::text, 'default'), $5::text::int, coalesce($6::text, 'pending'), coalesce($7::text::smallint, 0), coalesce($8::text::timestamptz, now()))"+
		" RETURNING id",
		c.kind, c.payload, key, col("queue"), col("max_attempts"), col("status"), col("priority"), col("run_at")).Scan(&id)
	return id, err
}

func (s *scenario) insertCase(t *testing.T, c corpusCase, key string) {
	t.Helper()
	_, err := s.insert(c, key)
	require.NoError(t, err)
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
