package httpcallback_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/executors/httpcallback"
	"github.com/pgdispatch/pgdispatch/internal/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/workertest"
)

func TestMain(m *testing.M) { pgtest.MainNoLeaks(m) }

const waitFor = 20 * time.Second

var secret = "whsec_" + base64.StdEncoding.EncodeToString([]byte("a test secret of thirty-two byte"))

// received is one request a test server saw.
type received struct {
	method, path, body string
	header             http.Header
}

// receiver is a real HTTP server whose answer per path the test scripts.
type receiver struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []received
	got  chan received
}

func newReceiver(t *testing.T, handle func(w http.ResponseWriter, r *http.Request, n int)) *receiver {
	rc := &receiver{got: make(chan received, 100)}
	var count atomic.Int64
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rec := received{r.Method, r.URL.Path, string(body), r.Header.Clone()}
		rc.mu.Lock()
		rc.reqs = append(rc.reqs, rec)
		rc.mu.Unlock()
		rc.got <- rec
		handle(w, r, int(count.Add(1)))
	}))
	t.Cleanup(rc.Close)
	return rc
}

type bundle struct {
	schema string
	jobs   string
	watch  *pgtest.Watcher
}

func setup(t *testing.T, cfg httpcallback.Config) *bundle {
	t.Helper()
	exec, err := httpcallback.New(cfg)
	require.NoError(t, err)
	reg := executors.NewRegistry()
	reg.Register(httpcallback.Kind, exec)
	schema := workertest.Start(t, "http-test", reg)
	return &bundle{schema: schema, jobs: pgx.Identifier{schema, "jobs"}.Sanitize(), watch: pgtest.Watch(t, schema)}
}

func (b *bundle) enqueue(t *testing.T, payload any, maxAttempts int) int64 {
	t.Helper()
	return workertest.Enqueue(t, b.schema, "http_callback", payload, maxAttempts)
}

func TestSuccessAndRawData(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, func(w http.ResponseWriter, _ *http.Request, _ int) { w.WriteHeader(http.StatusNoContent) })
	b := setup(t, httpcallback.Config{})

	id := b.enqueue(t, map[string]any{"url": rc.URL + "/hook", "data": map[string]any{"param1": "data1"}}, 5)
	s := b.watch.Status(t, id, "done", waitFor)
	require.Equal(t, 1, s.Attempts)
	got := <-rc.got
	require.Equal(t, "POST", got.method)
	require.Equal(t, "/hook", got.path)
	require.JSONEq(t, `{"param1": "data1"}`, got.body)
	require.Equal(t, "application/json", got.header.Get("Content-Type"))
	require.Equal(t, fmt.Sprint(id), got.header.Get("Pgdispatch-Job-Id"))
	require.Equal(t, "1", got.header.Get("Pgdispatch-Attempt"))
	require.Equal(t, fmt.Sprintf("pgdispatch-job-%d", id), got.header.Get("Idempotency-Key"))

	// A JSON string is sent raw.
	raw := b.enqueue(t, map[string]any{
		"url": rc.URL + "/raw", "data": `a=1&b=<raw>`, "content_type": "application/x-www-form-urlencoded",
		"method": "put", "headers": map[string]string{"X-Custom": "yes"},
	}, 5)
	b.watch.Status(t, raw, "done", waitFor)
	got = <-rc.got
	require.Equal(t, "PUT", got.method)
	require.Equal(t, "a=1&b=<raw>", got.body)
	require.Equal(t, "application/x-www-form-urlencoded", got.header.Get("Content-Type"))
	require.Equal(t, "yes", got.header.Get("X-Custom"))
}

func TestRetrySemantics(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		switch {
		case r.URL.Path == "/flaky" && r.Header.Get("Pgdispatch-Attempt") == "1":
			http.Error(w, "database is down", http.StatusInternalServerError)
		case r.URL.Path == "/missing":
			http.Error(w, "no such hook", http.StatusNotFound)
		case r.URL.Path == "/busy" && r.Header.Get("Pgdispatch-Attempt") == "1":
			w.Header().Set("Retry-After", "3")
			w.WriteHeader(http.StatusTooManyRequests)
		case r.URL.Path == "/slow":
			<-r.Context().Done() // answers only when the client gives up
		default:
			w.WriteHeader(http.StatusOK)
		}
	})
	b := setup(t, httpcallback.Config{})

	flaky := b.enqueue(t, map[string]any{"url": rc.URL + "/flaky", "data": 1}, 5)
	missing := b.enqueue(t, map[string]any{"url": rc.URL + "/missing", "data": 1}, 5)
	busy := b.enqueue(t, map[string]any{"url": rc.URL + "/busy", "data": 1}, 5)
	slow := b.enqueue(t, map[string]any{"url": rc.URL + "/slow", "data": 1, "timeout": "300ms"}, 1)

	s := b.watch.Status(t, flaky, "done", waitFor)
	require.Equal(t, 2, s.Attempts)
	var firstErr string
	for _, h := range b.watch.History(flaky) {
		if h.Error != nil && firstErr == "" {
			firstErr = *h.Error
		}
	}
	require.Contains(t, firstErr, "HTTP 500 Internal Server Error: database is down")

	s = b.watch.Status(t, missing, "dead", waitFor)
	require.Equal(t, 1, s.Attempts)
	require.Contains(t, *s.Error, "HTTP 404 Not Found: no such hook")

	s = b.watch.Status(t, busy, "done", waitFor)
	require.Equal(t, 2, s.Attempts)
	var delay float64
	for _, h := range b.watch.History(busy) {
		if h.Status == "pending" && h.Attempts == 1 {
			delay = h.Delay
		}
	}
	require.InDelta(t, 3.0, delay, 0.01, "Retry-After: 3 sets run_at 3 s later")

	s = b.watch.Status(t, slow, "dead", waitFor)
	require.Contains(t, *s.Error, "no response before the job's timeout")
	require.Contains(t, *s.Error, "timed out after 300ms")
}

// A Standard Webhooks signature, verified by the specification's own Go
// library rather than by this package's code.
func TestSignatureVerifiesIndependently(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, func(w http.ResponseWriter, _ *http.Request, _ int) { w.WriteHeader(http.StatusOK) })
	b := setup(t, httpcallback.Config{SigningSecret: secret})
	id := b.enqueue(t, map[string]any{"url": rc.URL, "data": map[string]any{"order": 42}}, 5)
	b.watch.Status(t, id, "done", waitFor)
	got := <-rc.got

	wh, err := standardwebhooks.NewWebhook(secret)
	require.NoError(t, err)
	require.NoError(t, wh.Verify([]byte(got.body), got.header))
	require.Equal(t, fmt.Sprintf("pgdispatch-job-%d", id), got.header.Get("Webhook-Id"))

	// A tampered body fails verification.
	require.Error(t, wh.Verify([]byte(got.body+" "), got.header))
	other, err := standardwebhooks.NewWebhook("whsec_" + base64.StdEncoding.EncodeToString([]byte("another secret")))
	require.NoError(t, err)
	require.Error(t, other.Verify([]byte(got.body), got.header))
}

func TestRefusedTargets(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		if r.URL.Path == "/to-metadata" {
			http.Redirect(w, r, "http://169.254.169.254/latest/meta-data/", http.StatusFound)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	b := setup(t, httpcallback.Config{})
	metadata := b.enqueue(t, map[string]any{"url": "http://169.254.169.254/latest/meta-data/", "data": 1}, 5)
	s := b.watch.Status(t, metadata, "dead", waitFor)
	require.Equal(t, 1, s.Attempts)
	require.Contains(t, *s.Error, "refused: 169.254.169.254 is in the denied range 169.254.0.0/16")

	redirected := b.enqueue(t, map[string]any{"url": rc.URL + "/to-metadata", "data": 1}, 5)
	s = b.watch.Status(t, redirected, "dead", waitFor)
	require.Contains(t, *s.Error, "refused: 169.254.169.254")

	v6 := b.enqueue(t, map[string]any{"url": "http://[fd00:ec2::254]/latest/", "data": 1}, 5)
	s = b.watch.Status(t, v6, "dead", waitFor)
	require.Contains(t, *s.Error, "fd00:ec2::254/128")
}

func TestAllowHosts(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, func(w http.ResponseWriter, _ *http.Request, _ int) { w.WriteHeader(http.StatusOK) })
	b := setup(t, httpcallback.Config{AllowHosts: []string{"127.0.0.1", "*.example.test"}})
	allowed := b.enqueue(t, map[string]any{"url": rc.URL, "data": 1}, 5)
	b.watch.Status(t, allowed, "done", waitFor)
	refused := b.enqueue(t, map[string]any{"url": strings.Replace(rc.URL, "127.0.0.1", "localhost", 1), "data": 1}, 5)
	s := b.watch.Status(t, refused, "dead", waitFor)
	require.Contains(t, *s.Error, `refused: host "localhost" is not in HTTP_ALLOW_HOSTS`)
}

func TestSecretsStayOutOfErrors(t *testing.T) {
	t.Parallel()
	b := setup(t, httpcallback.Config{SigningSecret: secret})
	// Nothing listens on port 1: a connection error, retried, then dead.
	id := b.enqueue(t, map[string]any{
		"url": "http://user:hunter2@127.0.0.1:1/path?token=sekrit", "data": 1,
		"headers": map[string]string{"Authorization": "Bearer sekrit-bearer"},
	}, 1)
	s := b.watch.Status(t, id, "dead", waitFor)
	require.Contains(t, *s.Error, "POST http://127.0.0.1:1/path")
	require.Contains(t, *s.Error, "connection refused")
	for _, secret := range []string{"hunter2", "sekrit", "sekrit-bearer", secret} {
		require.NotContains(t, *s.Error, secret)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	_, err := httpcallback.New(httpcallback.Config{SigningSecret: "not base64 at all!"})
	require.ErrorContains(t, err, "signing secret must be base64")
	require.NotContains(t, err.Error(), "not base64 at all!")
	_, err = httpcallback.New(httpcallback.Config{AllowHosts: []string{"http://x/y"}})
	require.Error(t, err)
}

// A burst of jobs for one receiver shares MaxConnsPerHost connections: the
// jobs beyond it wait for one, and all are delivered.
func TestConnectionsPerHostAreCapped(t *testing.T) {
	t.Parallel()
	const perHost, jobs = 2, 6
	var inflight, conns atomic.Int64
	release := make(chan struct{})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inflight.Add(1)
		defer inflight.Add(-1)
		select {
		case <-release:
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)

	b := setup(t, httpcallback.Config{MaxConnsPerHost: perHost})
	// Let the handlers go before the worker stops (cleanups run last in,
	// first out), or a failing test would wait for its shutdown timeout.
	var releaseOnce sync.Once
	releaseAll := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(releaseAll)
	// One transaction, so that one claim takes them all and they run at once.
	rows, err := pgtest.Pool(t).Query(context.Background(),
		"INSERT INTO "+b.jobs+" (kind, payload, max_attempts) SELECT 'http_callback', $1, 1 FROM generate_series(1, $2) RETURNING id",
		map[string]any{"url": srv.URL + "/hook"}, jobs)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	b.watch.Until(t, waitFor, "all jobs running", func(s map[int64]pgtest.JobState) bool {
		for _, id := range ids {
			if s[id].Status != "running" {
				return false
			}
		}
		return true
	})
	// Only perHost of them reach the server; the rest wait for a connection.
	// (At least perHost, so that a broken cap fails here at once rather than
	// after waitFor; the counts below are exact.)
	require.Eventually(t, func() bool { return inflight.Load() >= perHost }, waitFor, time.Millisecond)
	require.Equal(t, int64(perHost), conns.Load(), "connections opened while %d jobs ran", jobs)
	require.Equal(t, int64(perHost), inflight.Load(), "requests in flight while %d jobs ran", jobs)
	releaseAll()
	for _, id := range ids {
		b.watch.Status(t, id, "done", waitFor)
	}
	require.Equal(t, int64(perHost), conns.Load(), "the waiting jobs reuse the connections")
}
