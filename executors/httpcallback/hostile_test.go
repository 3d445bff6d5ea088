package httpcallback_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgdispatch/pgdispatch/executors/httpcallback"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/wait"
)

// Receivers that behave as an attacker's would. Each job ends with a clear
// last_error, in bounded time and memory.

// A 307 to another host is not followed: the payload's headers, its body
// and the signature reach only the host the job names. A redirect within
// the host is followed and keeps them.
func TestRedirectToAnotherHost(t *testing.T) {
	t.Parallel()
	other := newReceiver(t, func(w http.ResponseWriter, _ *http.Request, _ int) { w.WriteHeader(http.StatusOK) })
	first := newReceiver(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		switch r.URL.Path {
		case "/to-other-port":
			http.Redirect(w, r, other.URL+"/stolen", http.StatusTemporaryRedirect)
		case "/to-other-name": // the same listener under another name
			http.Redirect(w, r, "http://localhost:"+r.Host[strings.LastIndex(r.Host, ":")+1:]+"/moved", http.StatusTemporaryRedirect)
		case "/old":
			http.Redirect(w, r, "/new", http.StatusTemporaryRedirect)
		default:
			w.WriteHeader(http.StatusOK)
		}
	})
	b := setup(t, httpcallback.Config{SigningSecret: secret, AllowNetworks: loopback})
	job := func(path string) map[string]any {
		return map[string]any{"url": first.URL + path, "data": map[string]any{"card": "4242"}, "headers": map[string]string{"X-Api-Key": "k-secret"}}
	}

	for path, want := range map[string]string{
		"/to-other-port": "refused: redirect from " + first.URL + " to another host, " + other.URL + "/stolen",
		"/to-other-name": "to another host, http://localhost:",
	} {
		id := b.enqueue(t, job(path), 5)
		s := b.watch.Status(t, id, "dead", waitFor)
		require.Equal(t, 1, s.Attempts, "a refused redirect is permanent")
		require.Contains(t, *s.Error, want)
		require.Contains(t, *s.Error, "point the job's url at the new location")
	}
	require.Empty(t, other.requests(), "the other host got nothing")
	for _, r := range first.requests() {
		require.NotEqual(t, "/moved", r.path, "the other name got nothing")
	}

	id := b.enqueue(t, job("/old"), 5)
	b.watch.Status(t, id, "done", waitFor)
	reqs := first.requests()
	last := reqs[len(reqs)-1]
	require.Equal(t, "/new", last.path)
	require.Equal(t, "k-secret", last.header.Get("X-Api-Key"))
	wh, err := standardwebhooks.NewWebhook(secret)
	require.NoError(t, err)
	require.NoError(t, wh.Verify([]byte(last.body), last.header), "the same host gets the same signed request")
}

// A receiver that sends megabytes of headers fails the attempt once it has
// sent MaxResponseHeaderBytes: the client reads no more than that.
func TestHugeResponseHeaders(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, func(w http.ResponseWriter, _ *http.Request, _ int) {
		for i := range 32 {
			w.Header().Set(fmt.Sprintf("X-Big-%d", i), strings.Repeat("a", 256<<10)) // 8 MB in all
		}
		w.WriteHeader(http.StatusOK)
	})
	b := setup(t, httpcallback.Config{AllowNetworks: loopback})
	id := b.enqueue(t, map[string]any{"url": rc.URL, "data": 1}, 1)
	s := b.watch.Status(t, id, "dead", waitFor)
	require.Contains(t, *s.Error, fmt.Sprintf("server response headers exceeded %d bytes", httpcallback.MaxResponseHeaderBytes))
}

// A body that trickles in after the status holds a job no longer than
// bodyWait, whatever the job's timeout: the status is the outcome, and
// last_error has what came of the body.
func TestSlowTrickleBody(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		status := http.StatusOK
		if r.URL.Path == "/error" {
			status = http.StatusInternalServerError
		}
		w.WriteHeader(status)
		_, _ = w.Write([]byte("first bytes"))
		w.(http.Flusher).Flush()
		tick := time.NewTicker(50 * time.Millisecond) // the hostile receiver's pace
		defer tick.Stop()
		for {
			select {
			case <-r.Context().Done():
				return
			case <-tick.C:
				_, _ = w.Write([]byte("."))
				w.(http.Flusher).Flush()
			}
		}
	})
	b := setup(t, httpcallback.Config{AllowNetworks: loopback})
	ok := b.enqueue(t, map[string]any{"url": rc.URL + "/ok", "data": 1, "timeout": "1h"}, 1)
	failed := b.enqueue(t, map[string]any{"url": rc.URL + "/error", "data": 1, "timeout": "1h"}, 1)
	b.watch.Status(t, ok, "done", waitFor)
	s := b.watch.Status(t, failed, "dead", waitFor)
	require.Contains(t, *s.Error, "HTTP 500 Internal Server Error: first bytes")
}

// A receiver that trickles its status line and headers holds a job until
// the job's timeout, which ends it with a clear error.
func TestSlowTrickleHeaders(t *testing.T) {
	t.Parallel()
	rc := newRawReceiver(t, func(conn net.Conn, done <-chan struct{}) {
		_, _ = conn.Write([]byte("HTTP/1.1 200 OK\r\n"))
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				if _, err := conn.Write([]byte("X-Slow: a\r\n")); err != nil {
					return
				}
			}
		}
	})
	b := setup(t, httpcallback.Config{AllowNetworks: loopback})
	id := b.enqueue(t, map[string]any{"url": rc, "data": 1, "timeout": "500ms"}, 1)
	s := b.watch.Status(t, id, "dead", waitFor)
	require.Contains(t, *s.Error, "no response before the job's timeout")
}

// Control characters a receiver sends, in its status line or its body,
// reach last_error escaped.
func TestEscapesInResponse(t *testing.T) {
	t.Parallel()
	raw := newRawReceiver(t, func(conn net.Conn, _ <-chan struct{}) {
		body := "\x1b]0;owned\x07\x1b[2J\x1b[31mboom\r\n\u202eexe.txt\x9b"
		_, _ = fmt.Fprintf(conn, "HTTP/1.1 500 \x1b[5mBad\x1b[0m\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
	})
	rc := newReceiver(t, func(w http.ResponseWriter, _ *http.Request, _ int) {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte("\x1b[2J\x1b[31mred\x07 and \x7f"))
	})
	b := setup(t, httpcallback.Config{AllowNetworks: loopback})
	first := b.enqueue(t, map[string]any{"url": raw, "data": 1}, 1)
	second := b.enqueue(t, map[string]any{"url": rc.URL, "data": 1}, 1)

	s := b.watch.Status(t, first, "dead", waitFor)
	requireNoControls(t, *s.Error)
	require.Contains(t, *s.Error, `HTTP 500 \x1b[5mBad\x1b[0m: \x1b]0;owned\x07\x1b[2J\x1b[31mboom  \u202eexe.txt`)
	s = b.watch.Status(t, second, "dead", waitFor)
	requireNoControls(t, *s.Error)
	require.Contains(t, *s.Error, `HTTP 400 Bad Request: \x1b[2J\x1b[31mred\x07 and \x7f`)
}

func requireNoControls(t *testing.T, s string) {
	t.Helper()
	for _, r := range s {
		require.False(t, unicode.IsControl(r) || unicode.Is(unicode.Cf, r), "last_error holds %U: %q", r, s)
	}
}

// newRawReceiver serves each connection with serve, on a bare TCP
// listener, after reading the request's head. done closes when the test
// ends. It returns the receiver's URL.
func newRawReceiver(t *testing.T, serve func(conn net.Conn, done <-chan struct{})) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() {
		close(done)
		_ = l.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer func() { _ = conn.Close() }()
				if _, err := http.ReadRequest(bufio.NewReader(conn)); err != nil {
					return
				}
				serve(conn, done)
			})
		}
	})
	return "http://" + l.Addr().String() + "/"
}

// One host whose connections are all held by hung requests makes only its
// own jobs wait: a job for another host runs at once. The waits show in a
// warning that names the host, and in the executor's metrics.
func TestBusyHostDoesNotBlockOthers(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var releaseOnce sync.Once
	releaseAll := func() { releaseOnce.Do(func() { close(release) }) }
	hung := newReceiver(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusOK)
	})
	fine := newReceiver(t, func(w http.ResponseWriter, _ *http.Request, _ int) { w.WriteHeader(http.StatusOK) })

	core, logs := observer.New(zapcore.WarnLevel)
	exec, err := httpcallback.New(httpcallback.Config{AllowNetworks: loopback, MaxConnsPerHost: 1, Logger: zap.New(core)})
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(exec))
	b := setupWith(t, exec)
	t.Cleanup(releaseAll)

	const hungJobs = 3
	rows, err := pgtest.Pool(t).Query(context.Background(),
		"INSERT INTO "+b.jobs+" (kind, payload, max_attempts) SELECT 'http_callback', $1, 1 FROM generate_series(1, $2) RETURNING id",
		map[string]any{"url": hung.URL + "/hang", "timeout": "1h"}, hungJobs)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	<-hung.got // one holds the host's only connection
	waiting := func() float64 {
		families, err := reg.Gather()
		require.NoError(t, err)
		for _, f := range families {
			if f.GetName() == "pgdispatch_http_jobs_waiting_for_connection" {
				return f.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("no pgdispatch_http_jobs_waiting_for_connection")
		return 0
	}
	wait.For(t, waitFor, "waiting() == hungJobs-1", func() bool { return waiting() == hungJobs-1 })

	other := b.enqueue(t, map[string]any{"url": fine.URL, "data": 1}, 1)
	b.watch.Status(t, other, "done", waitFor)
	for _, id := range ids {
		require.Equal(t, "running", b.watch.Status(t, id, "running", waitFor).Status, "the hung host's jobs still run")
	}

	host := strings.TrimPrefix(hung.URL, "http://")
	warnings := logs.FilterMessageSnippet("wait for a connection").All()
	require.Len(t, warnings, 1, "one warning per host and minute")
	require.Equal(t, host, warnings[0].ContextMap()["host"])
	require.Equal(t, int64(1), warnings[0].ContextMap()["max_connections_per_host"])
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(fmt.Sprintf(`
# HELP pgdispatch_http_connection_waits_total http_callback jobs that had to wait for a connection to their host.
# TYPE pgdispatch_http_connection_waits_total counter
pgdispatch_http_connection_waits_total %d
# HELP pgdispatch_http_hosts_saturated Hosts whose HTTP_MAX_CONNECTIONS_PER_HOST are all busy with http_callback jobs waiting for them.
# TYPE pgdispatch_http_hosts_saturated gauge
pgdispatch_http_hosts_saturated 1
`, hungJobs-1)), "pgdispatch_http_connection_waits_total", "pgdispatch_http_hosts_saturated"))

	releaseAll()
	for _, id := range ids {
		b.watch.Status(t, id, "done", waitFor)
	}
	wait.For(t, waitFor, "waiting() == 0", func() bool { return waiting() == 0 })
}

// A job that finds no connection to its host before its timeout fails with
// an error that says so, and is retried.
func TestBusyHostTimeout(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	hung := newReceiver(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusOK)
	})
	b := setup(t, httpcallback.Config{AllowNetworks: loopback, MaxConnsPerHost: 1})
	t.Cleanup(func() { close(release) })
	holder := b.enqueue(t, map[string]any{"url": hung.URL, "timeout": "1h"}, 1)
	<-hung.got
	waiter := b.enqueue(t, map[string]any{"url": hung.URL, "timeout": "300ms"}, 1)
	s := b.watch.Status(t, waiter, "dead", waitFor)
	require.Contains(t, *s.Error, fmt.Sprintf("no connection to %s free before the job's timeout: all 1 (HTTP_MAX_CONNECTIONS_PER_HOST) were busy",
		strings.TrimPrefix(hung.URL, "http://")))
	require.Equal(t, "running", b.watch.Status(t, holder, "running", waitFor).Status)
}
