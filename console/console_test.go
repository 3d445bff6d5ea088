package console

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
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
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
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
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, "GET", b.url+"events", nil)
	require.NoError(t, err)
	req.SetBasicAuth("vic", viewerToken)
	resp, err := http.DefaultClient.Do(req) //nolint:bodyclose // closed by the func returned
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	r := bufio.NewReader(resp.Body)
	for {
		line, err := r.ReadString('\n')
		require.NoError(t, err)
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			return data, func() {
				cancel()
				_ = resp.Body.Close()
			}
		}
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
