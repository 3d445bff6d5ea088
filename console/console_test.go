package console

import (
	"bufio"
	"cmp"
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/pgdispatch/pgdispatch/internal/stmtcount"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.MainNoLeaks(m) }

const (
	operatorToken = "operator-token-for-tests"
	viewerToken   = "viewer-token-for-tests"
)

// bundle is what a test of the console needs: a schema, a console serving
// it, and a counter of every statement the console sends.
type bundle struct {
	schema string
	url    string // the console's, ending in /
	srv    *Server
	count  *stmtcount.Counter
	// pool is the test's own, for seeding and checking rows.
	pool *pgxpool.Pool
	// stop stops the console and returns what Serve returned.
	stop func() error
}

func setup(t *testing.T, cfg Config, opts ...func(*pgxpool.Config)) *bundle {
	t.Helper()
	b := &bundle{schema: pgtest.Schema(t), count: &stmtcount.Counter{}, pool: pgtest.Pool(t)}
	pc, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	pc.MaxConns = 4
	pc.ConnConfig.Tracer = b.count
	for _, o := range opts {
		o(pc)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	lc, err := pgx.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	lc.Tracer = b.count

	cfg.Pool, cfg.Schema, cfg.ListenConfig = pool, b.schema, lc
	cfg.OperatorToken, cfg.ViewerToken = operatorToken, viewerToken
	if cfg.Logger == nil {
		cfg.Logger = zaptest.NewLogger(t)
	}
	b.srv, err = New(cfg)
	require.NoError(t, err)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	b.url = "http://" + ln.Addr().String() + "/"
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.srv.Serve(ctx, ln) }()
	b.stop = sync.OnceValue(func() error {
		cancel()
		return <-done
	})
	t.Cleanup(func() { require.NoError(t, b.stop()) })
	return b
}

// exec runs sql on the test's schema, {jobs} naming its table.
func (b *bundle) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := b.pool.Exec(ctx, b.sql(sql), args...)
	require.NoError(t, err)
}

func (b *bundle) sql(s string) string {
	return strings.NewReplacer("{jobs}", pgx.Identifier{b.schema, "jobs"}.Sanitize(),
		"{schema}", pgx.Identifier{b.schema}.Sanitize()).Replace(s)
}

func (b *bundle) queryInt(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var n int64
	require.NoError(t, b.pool.QueryRow(ctx, b.sql(sql), args...).Scan(&n))
	return n
}

func (b *bundle) queryString(t *testing.T, sql string, args ...any) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var s string
	require.NoError(t, b.pool.QueryRow(ctx, b.sql(sql), args...).Scan(&s))
	return s
}

// request sends a request as name with token, and returns the status and
// body.
func (b *bundle) request(t *testing.T, method, path, name, token string, form url.Values, header http.Header) (int, string) {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, b.url+strings.TrimPrefix(path, "/"), body)
	require.NoError(t, err)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if token != "" {
		req.SetBasicAuth(name, token)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	out, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(out)
}

// Without the token a request is refused; a viewer reads but may not act;
// an operator's POST needs its page's CSRF token and the console's origin.
func TestAuth(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.exec(t, `INSERT INTO {jobs} (queue, kind, status, finished_at, last_error) VALUES ('q', 'k', 'dead', now(), 'boom')`)
	id := b.queryInt(t, `SELECT id FROM {jobs}`)

	code, _ := b.request(t, "GET", "/", "", "", nil, nil)
	require.Equal(t, http.StatusUnauthorized, code, "no credentials")
	code, _ = b.request(t, "GET", "/", "ann", "wrong", nil, nil)
	require.Equal(t, http.StatusUnauthorized, code, "a wrong token")
	code, _ = b.request(t, "GET", "/", "", operatorToken, nil, nil)
	require.Equal(t, http.StatusUnauthorized, code, "no user name")
	code, body := b.request(t, "GET", "/", "vic", viewerToken, nil, nil)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "vic · viewer")
	require.NotContains(t, body, `value="pause"`, "a viewer is offered no action")

	retry := func(name, token, csrf string, header http.Header) int {
		form := url.Values{"action": {"retry"}, "id": {itoa(id)}}
		if csrf != "" {
			form.Set("csrf", csrf)
		}
		code, _ := b.request(t, "POST", "/actions/jobs", name, token, form, header)
		return code
	}
	viewerCSRF := b.srv.csrfToken(user{Name: "vic", role: viewer})
	require.Equal(t, http.StatusForbidden, retry("vic", viewerToken, viewerCSRF, nil), "a viewer's POST")
	require.Equal(t, http.StatusForbidden, retry("ann", operatorToken, "", nil), "a POST without the CSRF token")
	require.Equal(t, http.StatusForbidden, retry("ann", operatorToken, b.srv.csrfToken(user{Name: "bob", role: operator}), nil),
		"a POST with another user's CSRF token")
	annCSRF := b.srv.csrfToken(user{Name: "ann", role: operator})
	require.Equal(t, http.StatusForbidden, retry("ann", operatorToken, annCSRF, http.Header{"Sec-Fetch-Site": {"cross-site"}}),
		"a POST from another site")
	require.Equal(t, "dead", b.queryString(t, `SELECT status FROM {jobs}`), "no refused POST changed the job")

	require.Equal(t, http.StatusSeeOther, retry("ann", operatorToken, annCSRF, nil))
	require.Equal(t, "pending", b.queryString(t, `SELECT status FROM {jobs}`))

	code, body = b.request(t, "GET", "/", "ann", operatorToken, nil, nil)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, annCSRF, "the page carries the user's CSRF token")

	// A link from elsewhere cannot put words on a page: only the messages
	// the console signed show.
	_, body = b.request(t, "GET", "/jobs?msg=Your+token+expired%2C+sign+in+at+evil.example", "ann", operatorToken, nil, nil)
	require.NotContains(t, body, "evil.example")
	_, body = b.request(t, "GET", "/jobs?msg=retried+1+job&sig="+b.srv.sign("retried 1 job"), "ann", operatorToken, nil, nil)
	require.Contains(t, body, `<p class="flash">retried 1 job</p>`)
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// openEvents connects to the live updates as a browser does, and returns
// the first event's data and the stream's close.
func (b *bundle) openEvents(t *testing.T) (string, func()) {
	t.Helper()
	code, r, leave := b.stream(t, "vic", viewerToken)
	require.Equal(t, http.StatusOK, code)
	for {
		line, err := r.ReadString('\n')
		require.NoError(t, err)
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			return data, leave
		}
	}
}

// stream opens the live updates as name, and returns the status, the
// stream and its close.
func (b *bundle) stream(t *testing.T, name, token string) (int, *bufio.Reader, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, "GET", b.url+"events", nil)
	require.NoError(t, err)
	req.SetBasicAuth(name, token)
	resp, err := http.DefaultClient.Do(req) //nolint:bodyclose // closed by the func returned
	require.NoError(t, err)
	return resp.StatusCode, bufio.NewReader(resp.Body), func() {
		cancel()
		_ = resp.Body.Close()
	}
}

// With no browser connected the console sends the database nothing: not
// before the first viewer, and not after the last has left. While one is
// connected it reads the state about once a PollInterval.
func TestIdleCostsNothing(t *testing.T) {
	t.Parallel()
	const poll = 50 * time.Millisecond
	stopped := make(chan struct{}, 10)
	b := setup(t, Config{PollInterval: poll})
	b.srv.hub.onStop = func() { stopped <- struct{}{} }
	b.exec(t, `INSERT INTO {jobs} (queue, kind) VALUES ('q', 'k')`)

	// A guard: 20 poll intervals in which a poll would have been counted.
	idle := func(what string) {
		t.Helper()
		before := b.count.Statements.Load()
		<-time.After(20 * poll)
		require.Equal(t, before, b.count.Statements.Load(), "statements sent %s", what)
	}
	idle("before any viewer")

	data, leave := b.openEvents(t)
	require.Contains(t, data, `"queue":"q"`)
	start, before := time.Now(), b.count.Statements.Load()
	require.Positive(t, before, "the counter counts the console's statements")
	second, leave2 := b.openEvents(t)
	require.JSONEq(t, data, second, "a second viewer gets the shared state")
	<-time.After(20 * poll)
	n := b.count.Statements.Load() - before
	t.Logf("with viewers connected: %d statements in %s (poll %s)", n, time.Since(start).Round(time.Millisecond), poll)
	leave2()
	leave()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the live updates did not stop when the last viewer left")
	}
	require.False(t, b.srv.hub.running())
	idle("after the last viewer left")
}

// Every page comes with a Content-Security-Policy that allows no inline
// script and nothing from elsewhere, and may not be framed.
func TestSecurityHeaders(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	for _, path := range []string{"", "jobs", "schedules", "static/console.js"} {
		req, err := http.NewRequest("GET", b.url+path, nil)
		require.NoError(t, err)
		req.SetBasicAuth("vic", viewerToken)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
		csp := resp.Header.Get("Content-Security-Policy")
		require.Contains(t, csp, "script-src 'self'", path)
		require.NotContains(t, csp, "unsafe-inline", path)
		require.Contains(t, csp, "frame-ancestors 'none'", path)
		require.Equal(t, "nosniff", resp.Header.Get("X-Content-Type-Options"), path)
	}
}

// A token shorter than MinTokenLen is refused at start, with a message
// that says so.
func TestShortTokenRefused(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	lc, err := pgx.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	base := Config{Pool: pool, Schema: "s", ListenConfig: lc}
	for _, c := range []struct {
		operator, viewer, want string
	}{
		{"pw1", "", "console: the operator's token is 3 bytes: use 16 or more"},
		{operatorToken, "yy", "console: the viewer's token is 2 bytes: use 16 or more"},
		{"", "fifteen-bytes-x", "console: the viewer's token is 15 bytes: use 16 or more"},
	} {
		cfg := base
		cfg.OperatorToken, cfg.ViewerToken = c.operator, c.viewer
		_, err := New(cfg)
		require.ErrorContains(t, err, c.want)
		require.NotContains(t, err.Error(), cmp.Or(c.viewer, c.operator), "the token is not in the message")
	}
	cfg := base
	cfg.ViewerToken = "sixteen-bytes-xy"
	_, err = New(cfg)
	require.NoError(t, err)
}

// Failed sign-ins from an address are limited: past a burst, the address
// is refused for a while, before its token is compared (the right one
// too), and told when to try again.
func TestFailedSignInsLimited(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	for i := range failedSignInBurst {
		code, _ := b.request(t, "GET", "/", "mallory", "guess-"+strconv.Itoa(i), nil, nil)
		require.Equal(t, http.StatusUnauthorized, code, "guess %d", i)
	}
	code, body := b.request(t, "GET", "/", "mallory", "guess-again", nil, nil)
	require.Equal(t, http.StatusTooManyRequests, code, body)
	require.Contains(t, body, "too many failed sign-ins")
	code, _ = b.request(t, "GET", "/", "ann", operatorToken, nil, nil)
	require.Equal(t, http.StatusTooManyRequests, code, "the right token from the address, while it is refused")
	code, _ = b.request(t, "GET", "/", "", "", nil, nil)
	require.Equal(t, http.StatusTooManyRequests, code)
}

// The event streams are limited: so many per user and in all (the next
// is refused with 429), a heartbeat on a quiet stream, and so many queues
// in the state (the rest counted).
func TestEventStreamLimits(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	h := b.srv.hub
	h.mu.Lock()
	h.maxStreams, h.maxPerUser, h.heartbeat, h.maxQueues = 3, 2, 50*time.Millisecond, 2
	h.mu.Unlock()
	b.exec(t, `INSERT INTO {jobs} (queue, kind) VALUES ('a', 'k'), ('b', 'k'), ('c', 'k')`)

	data, leave := b.openEvents(t)
	defer leave()
	require.Contains(t, data, `"queue":"b"`)
	require.NotContains(t, data, `"queue":"c"`)
	require.Contains(t, data, `"more_queues":1`)
	code, r, leave2 := b.stream(t, "vic", viewerToken)
	defer leave2()
	require.Equal(t, http.StatusOK, code)
	code, _, leave3 := b.stream(t, "vic", viewerToken)
	leave3()
	require.Equal(t, http.StatusTooManyRequests, code, "a third stream of vic's")
	code, _, leave4 := b.stream(t, "ann", operatorToken)
	defer leave4()
	require.Equal(t, http.StatusOK, code, "ann's first")
	code, _, leave5 := b.stream(t, "bob", operatorToken)
	leave5()
	require.Equal(t, http.StatusTooManyRequests, code, "a fourth in all")

	for {
		line, err := r.ReadString('\n')
		require.NoError(t, err)
		if line == ": heartbeat\n" {
			break
		}
	}
}

// A browser that stops reading loses its stream at the write deadline,
// and holds up no shutdown.
func TestEventsSlowReader(t *testing.T) {
	t.Parallel()
	stopped := make(chan struct{}, 10)
	b := setup(t, Config{PollInterval: 50 * time.Millisecond})
	h := b.srv.hub
	var written, completed atomic.Int64 // bytes each stream was sent, with the write in progress, and without
	h.mu.Lock()
	h.writeTimeout, h.maxQueues = time.Second, 5000
	h.onStop = func() { stopped <- struct{}{} }
	h.onWrite = func(n int, done bool) {
		if done {
			completed.Store(int64(n))
		} else {
			written.Store(int64(n))
		}
	}
	h.mu.Unlock()
	// 5000 queues with long names: a state of about 1.6 MB.
	b.exec(t, `INSERT INTO {jobs} (queue, kind) SELECT repeat('q', 120) || g, 'k' FROM generate_series(1, 5000) g`)

	// A reader that reads nothing, with a small receive buffer.
	slowReader := func() net.Conn {
		d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
			return c.Control(func(fd uintptr) { _ = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		}}
		conn, err := d.Dial("tcp", strings.TrimPrefix(strings.TrimSuffix(b.url, "/"), "http://"))
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close() })
		req, err := http.NewRequest("GET", b.url+"events", nil)
		require.NoError(t, err)
		req.SetBasicAuth("vic", viewerToken)
		require.NoError(t, req.Write(conn))
		return conn
	}
	// Each job changes the state, which the stream is sent until the
	// socket's buffers are full.
	feed := func(until <-chan struct{}) {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		guard := time.After(60 * time.Second)
		for {
			select {
			case <-until:
				return
			case <-guard:
				t.Fatalf("a guard: the stream was not stuck or did not end (%d bytes written)", written.Load())
			case <-tick.C:
				b.exec(t, `INSERT INTO {jobs} (queue, kind) VALUES ('q1', 'k')`)
			}
		}
	}

	slowReader()
	start := time.Now()
	feed(stopped)
	t.Logf("the stream ended at its write deadline, the live updates stopped, %s after it opened; %d bytes sent to it",
		time.Since(start).Round(time.Millisecond), written.Load())

	// Again, with a write deadline longer than the shutdown's: the console
	// stops with the stream stuck in a write as the first one was (sent
	// about as many bytes, a write in progress).
	stuckAt := written.Load()
	h.mu.Lock()
	h.writeTimeout = time.Minute
	h.mu.Unlock()
	written.Store(0)
	completed.Store(0)
	slowReader()
	stuck := make(chan struct{})
	go func() {
		defer close(stuck)
		for end := time.Now().Add(60 * time.Second); (written.Load() < stuckAt*3/4 || completed.Load() == written.Load()) && time.Now().Before(end); {
			<-time.After(10 * time.Millisecond) // polls the counter
		}
	}()
	feed(stuck)
	start = time.Now()
	require.NoError(t, b.stop(), "the console shuts down with a stream stuck in a write")
	require.Less(t, completed.Load(), written.Load(), "the stream was stuck in a write when the console stopped")
	t.Logf("shutdown with a stream stuck in a write took %s", time.Since(start).Round(time.Millisecond))
}
