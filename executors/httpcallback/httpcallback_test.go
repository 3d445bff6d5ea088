package httpcallback_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
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
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/wait"
	"github.com/pgdispatch/pgdispatch/internal/testkit/workertest"
	"github.com/pgdispatch/pgdispatch/signing"
)

func TestMain(m *testing.M) { pgtest.MainNoLeaks(m) }

const waitFor = 20 * time.Second

// loopback lets the executor reach this machine's test receivers, which
// the default (public addresses only) refuses.
var loopback = []string{httpcallback.NetworksLoopback}

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

// requests returns what the receiver has seen so far.
func (rc *receiver) requests() []received {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return slices.Clone(rc.reqs)
}

// v6Receiver is a receiver on [::1], with its URL and the same URL with the
// zone "lo".
type v6Receiver struct {
	*receiver
	zoned string
}

func newV6Receiver(t *testing.T) *v6Receiver {
	t.Helper()
	l, err := net.Listen("tcp", "[::1]:0")
	require.NoError(t, err)
	rc := &receiver{got: make(chan received, 100)}
	rc.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc.mu.Lock()
		rc.reqs = append(rc.reqs, received{r.Method, r.URL.Path, "", r.Header.Clone()})
		rc.mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	rc.Listener = l
	rc.Start()
	t.Cleanup(rc.Close)
	return &v6Receiver{rc, fmt.Sprintf("http://[::1%%25lo]:%d/", l.Addr().(*net.TCPAddr).Port)}
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
	return setupWith(t, exec)
}

func setupWith(t *testing.T, exec *httpcallback.Executor) *bundle {
	t.Helper()
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
	b := setup(t, httpcallback.Config{AllowNetworks: loopback})

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
	b := setup(t, httpcallback.Config{AllowNetworks: loopback})

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
	b := setup(t, httpcallback.Config{SigningSecret: secret, AllowNetworks: loopback})
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

// The guard with loopback stand-ins for the addresses it must refuse: with
// the default networks (public only), a loopback receiver is refused by
// its literal address, its IPv4-mapped and zoned forms, a name that
// resolves to it, and a redirect to any of them. Metadata addresses are
// checked without a dial, in guard_internal_test.go.
func TestLoopbackStandInsAreRefused(t *testing.T) {
	t.Parallel()
	v4 := newReceiver(t, func(w http.ResponseWriter, _ *http.Request, _ int) { w.WriteHeader(http.StatusOK) })
	v6 := newV6Receiver(t)
	port := v4.Listener.Addr().(*net.TCPAddr).Port
	b := setup(t, httpcallback.Config{AllowHosts: []string{"localhost", "127.0.0.1", "::1", "*.test"}})

	for _, c := range []struct{ url, want string }{
		{v4.URL, "refused: 127.0.0.1 is not in HTTP_ALLOW_NETWORKS (public)"},
		{fmt.Sprintf("http://localhost:%d/", port), "refused: 127.0.0.1 is not in HTTP_ALLOW_NETWORKS (public)"},
		{fmt.Sprintf("http://[::ffff:127.0.0.1]:%d/", port), "refused: 127.0.0.1 is not in HTTP_ALLOW_NETWORKS"},
		{v6.zoned, "refused: ::1%lo has an IPv6 zone, which is never dialled"},
		{v6.URL, "refused: ::1 is not in HTTP_ALLOW_NETWORKS (public)"},
	} {
		id := b.enqueue(t, map[string]any{"url": c.url, "data": 1}, 5)
		s := b.watch.Status(t, id, "dead", waitFor)
		require.Equal(t, 1, s.Attempts, c.url)
		require.Contains(t, *s.Error, c.want, c.url)
	}
	require.Empty(t, v4.requests())
	require.Empty(t, v6.requests())
}

// Zoned IPv6 addresses are refused even where their address is allowed,
// and so is a redirect to one.
func TestZonedAddressesAreRefused(t *testing.T) {
	t.Parallel()
	v6 := newV6Receiver(t)
	hop := newReceiver(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		http.Redirect(w, r, v6.zoned, http.StatusTemporaryRedirect)
	})
	b := setup(t, httpcallback.Config{AllowNetworks: []string{"127.0.0.1/32"}})
	direct := b.enqueue(t, map[string]any{"url": v6.zoned, "data": 1}, 5)
	s := b.watch.Status(t, direct, "dead", waitFor)
	require.Contains(t, *s.Error, "refused: ::1%lo has an IPv6 zone")
	redirected := b.enqueue(t, map[string]any{"url": hop.URL, "data": 1}, 5)
	s = b.watch.Status(t, redirected, "dead", waitFor)
	require.Contains(t, *s.Error, "refused: ::1%lo has an IPv6 zone")
	require.Empty(t, v6.requests())

	// The same receiver without the zone, with ::1 allowed, is reached.
	b = setup(t, httpcallback.Config{AllowNetworks: []string{"::1"}})
	id := b.enqueue(t, map[string]any{"url": v6.URL, "data": 1}, 5)
	b.watch.Status(t, id, "done", waitFor)
	zoned := b.enqueue(t, map[string]any{"url": v6.zoned, "data": 1}, 5)
	s = b.watch.Status(t, zoned, "dead", waitFor)
	require.Contains(t, *s.Error, "has an IPv6 zone")
	require.Len(t, v6.requests(), 1)
}

// An allowed name is checked again by the address it resolves to: the
// networks apply after DNS, on the address dialled.
func TestAllowedNameResolvingToADeniedAddress(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, func(w http.ResponseWriter, _ *http.Request, _ int) { w.WriteHeader(http.StatusOK) })
	byName := strings.Replace(rc.URL, "127.0.0.1", "localhost", 1)
	b := setup(t, httpcallback.Config{AllowHosts: []string{"localhost"}, AllowNetworks: []string{"public", "::1"}})
	id := b.enqueue(t, map[string]any{"url": byName, "data": 1}, 5)
	s := b.watch.Status(t, id, "dead", waitFor)
	require.Contains(t, *s.Error, "refused: 127.0.0.1 is not in HTTP_ALLOW_NETWORKS (public,::1)")
	require.Empty(t, rc.requests())

	b = setup(t, httpcallback.Config{AllowHosts: []string{"localhost"}, AllowNetworks: []string{"127.0.0.0/8"}})
	id = b.enqueue(t, map[string]any{"url": byName, "data": 1}, 5)
	b.watch.Status(t, id, "done", waitFor)
}

func TestAllowHosts(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, func(w http.ResponseWriter, _ *http.Request, _ int) { w.WriteHeader(http.StatusOK) })
	b := setup(t, httpcallback.Config{AllowHosts: []string{"127.0.0.1", "*.example.test"}, AllowNetworks: loopback})
	allowed := b.enqueue(t, map[string]any{"url": rc.URL, "data": 1}, 5)
	b.watch.Status(t, allowed, "done", waitFor)
	refused := b.enqueue(t, map[string]any{"url": strings.Replace(rc.URL, "127.0.0.1", "localhost", 1), "data": 1}, 5)
	s := b.watch.Status(t, refused, "dead", waitFor)
	require.Contains(t, *s.Error, `refused: host "localhost" is not in HTTP_ALLOW_HOSTS`)

	// An IPv6 entry matches with or without brackets.
	v6 := newV6Receiver(t)
	for _, entry := range []string{"[::1]", "::1", "0:0::1"} {
		b := setup(t, httpcallback.Config{AllowHosts: []string{entry}, AllowNetworks: loopback})
		id := b.enqueue(t, map[string]any{"url": v6.URL, "data": 1}, 5)
		b.watch.Status(t, id, "done", waitFor)
	}
}

func TestSecretsStayOutOfErrors(t *testing.T) {
	t.Parallel()
	b := setup(t, httpcallback.Config{SigningSecret: secret, AllowNetworks: loopback})
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
	for _, hosts := range [][]string{{"http://x/y"}, {"x.test:8080"}, {"*"}, {"fe80::1%eth0"}} {
		_, err = httpcallback.New(httpcallback.Config{AllowHosts: hosts})
		require.ErrorContains(t, err, "want a host name, an IP or *.domain", hosts)
	}
	for _, networks := range [][]string{{"everything"}, {"10.0.0.0/33"}, {"fe80::1%eth0"}, {"::ffff:10.0.0.0/104"}, {" ", ""}} {
		_, err = httpcallback.New(httpcallback.Config{AllowNetworks: networks})
		require.Error(t, err, networks)
	}
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

	b := setup(t, httpcallback.Config{MaxConnsPerHost: perHost, AllowNetworks: loopback})
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
	wait.For(t, waitFor, "inflight.Load() >= perHost", func() bool { return inflight.Load() >= perHost })
	require.Equal(t, int64(perHost), conns.Load(), "connections opened while %d jobs ran", jobs)
	require.Equal(t, int64(perHost), inflight.Load(), "requests in flight while %d jobs ran", jobs)
	releaseAll()
	for _, id := range ids {
		b.watch.Status(t, id, "done", waitFor)
	}
	require.Equal(t, int64(perHost), conns.Load(), "the waiting jobs reuse the connections")
}

// Every secret in force signs, the keyring's newest first and then
// SigningSecret's, each verified by the specification's own library; an
// expired secret no longer signs.
func TestEverySecretInForceSigns(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, func(w http.ResponseWriter, _ *http.Request, _ int) { w.WriteHeader(http.StatusOK) })
	old, current := signing.Generate(), signing.Generate()
	keyring := signing.NewKeyring()
	t.Cleanup(keyring.Stop)
	keyring.Set([]signing.Key{{ID: 1, Secret: old, ExpiresAt: time.Now().Add(time.Hour)}, {ID: 2, Secret: current}})
	b := setup(t, httpcallback.Config{SigningSecret: secret, Keyring: keyring, AllowNetworks: loopback})

	id := b.enqueue(t, map[string]any{"url": rc.URL, "data": "during the overlap"}, 5)
	b.watch.Status(t, id, "done", waitFor)
	got := <-rc.got
	require.Len(t, strings.Fields(got.header.Get("Webhook-Signature")), 3)
	for _, s := range []string{current.Text(), old.Text(), secret} {
		wh, err := standardwebhooks.NewWebhook(s)
		require.NoError(t, err)
		require.NoError(t, wh.Verify([]byte(got.body), got.header))
	}
	require.True(t, strings.HasPrefix(got.header.Get("Webhook-Signature"),
		"v1,"+signing.Sign(current, got.header.Get("Webhook-Id"), got.header.Get("Webhook-Timestamp"), []byte(got.body))+" "),
		"the newest secret signs first")

	// The old secret's overlap is over.
	changed := keyring.Changed()
	keyring.Set([]signing.Key{{ID: 1, Secret: old, ExpiresAt: time.Now()}, {ID: 2, Secret: current}})
	<-changed
	id = b.enqueue(t, map[string]any{"url": rc.URL, "data": "after the overlap"}, 5)
	b.watch.Status(t, id, "done", waitFor)
	got = <-rc.got
	require.Len(t, strings.Fields(got.header.Get("Webhook-Signature")), 2)
	wh, err := standardwebhooks.NewWebhook(old.Text())
	require.NoError(t, err)
	require.Error(t, wh.Verify([]byte(got.body), got.header))
	for _, s := range []string{current.Text(), secret} {
		wh, err := standardwebhooks.NewWebhook(s)
		require.NoError(t, err)
		require.NoError(t, wh.Verify([]byte(got.body), got.header))
	}
}
