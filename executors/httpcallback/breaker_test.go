package httpcallback_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/pgdispatch/pgdispatch/endpoints"
	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/executors/httpcallback"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

// newBreaker is a breaker of schema (a fresh one when "") that opens at
// MinAttempts failures of as many attempts, and the schema's endpoints
// table.
func newBreaker(t *testing.T, schema string, minAttempts int) (*endpoints.Breaker, string) {
	t.Helper()
	if schema == "" {
		schema = pgtest.Schema(t)
	}
	br, err := endpoints.New(endpoints.Config{
		DB: pgtest.Pool(t), Schema: schema, MinAttempts: minAttempts, FailureRatio: 1, CoolDown: time.Hour,
		Logger: zaptest.NewLogger(t),
	})
	require.NoError(t, err)
	return br, pgx.Identifier{schema, "endpoints"}.Sanitize()
}

// hostileTLSReceiver is a TLS receiver whose certificate names a host
// with a NUL and control characters in it, which the client quotes raw in
// its error.
func hostileTLSReceiver(t *testing.T) *httptest.Server {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "hostile"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: []string{"evil\x00\x1b[31m.example"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the client refuses its certificate
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// A receiver's bytes that the client quotes raw in its error (here a
// certificate's names, with a NUL) are stored as the endpoint's reason
// made printable: they neither fail the write of every endpoint's
// outcomes nor reach the table as they came.
func TestBreakerReasonFromAHostileReceiver(t *testing.T) {
	t.Parallel()
	srv := hostileTLSReceiver(t)
	br, table := newBreaker(t, "", 1)
	e, err := httpcallback.New(httpcallback.Config{AllowNetworks: loopback, Breaker: br})
	require.NoError(t, err)
	port := strconv.Itoa(srv.Listener.Addr().(*net.TCPAddr).Port)
	_, _, err = runAttempt(t, e, waitFor, map[string]any{"url": "https://localhost:" + port + "/"})
	require.ErrorContains(t, err, "certificate is valid for evil\x00")

	// An honest endpoint's outcome, counted by the same worker.
	br.Record("https://honest.example:443", false, "")
	require.NoError(t, br.Flush(context.Background()))
	var attempts int
	require.NoError(t, pgtest.Pool(t).QueryRow(context.Background(), "SELECT attempts FROM "+table+" WHERE endpoint = $1",
		"https://honest.example:443").Scan(&attempts))
	require.Equal(t, 1, attempts)
	var state, reason string
	require.NoError(t, pgtest.Pool(t).QueryRow(context.Background(), "SELECT state, reason FROM "+table+" WHERE endpoint = $1",
		"https://localhost:"+port).Scan(&state, &reason))
	require.Equal(t, "open", state)
	require.Contains(t, reason, `evil\x00\x1b[31m.example`)
}

// A job's own making cannot open its endpoint: a header value the client
// refuses before it sends anything, and a timeout the payload shortened
// (here to a nanosecond, so that nothing is sent), fail the job, not the
// receiver, which answers every request it gets. A port where nothing
// listens still counts: no connection is the endpoint's failure.
func TestBreakerCountsOnlyTheEndpointsFailures(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, func(w http.ResponseWriter, _ *http.Request, _ int) { w.WriteHeader(http.StatusNoContent) })
	br, table := newBreaker(t, "", 2)
	e, err := httpcallback.New(httpcallback.Config{AllowNetworks: loopback, Breaker: br})
	require.NoError(t, err)
	u, err := url.Parse(rc.URL)
	require.NoError(t, err)
	healthy := endpoints.Of(u)

	for range 2 {
		_, _, err := runAttempt(t, e, waitFor, map[string]any{"url": rc.URL, "headers": map[string]string{"X-Tag": "a\x01b"}})
		require.Error(t, err)
		_, _, err = runAttempt(t, e, time.Nanosecond, map[string]any{"url": rc.URL, "timeout": "1ns"})
		require.ErrorContains(t, err, "no response before the job's timeout")
	}
	require.NoError(t, br.Flush(context.Background()))
	require.Empty(t, rc.requests())
	var n int
	require.NoError(t, pgtest.Pool(t).QueryRow(context.Background(),
		"SELECT count(*) FROM "+table+" WHERE endpoint = $1 AND (state <> 'closed' OR failures > 0)", healthy).Scan(&n))
	require.Zero(t, n, "the healthy endpoint is open or counts failures")
	require.Equal(t, "closed", br.State(healthy))

	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	nobody := "http://" + l.Addr().String() + "/"
	require.NoError(t, l.Close())
	for range 2 {
		_, _, err := runAttempt(t, e, waitFor, map[string]any{"url": nobody})
		require.ErrorContains(t, err, "connection refused")
	}
	require.NoError(t, br.Flush(context.Background()))
	u, err = url.Parse(nobody)
	require.NoError(t, err)
	require.Equal(t, "open", br.State(endpoints.Of(u)))
}

// A receiver that gives no response counts against its endpoint when the
// job's timeout ran out, the payload's own too once it is a second or
// more: writers who set a timeout do not hide a hanging receiver.
func TestBreakerCountsAHangingReceiverUnderThePayloadsTimeout(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, func(_ http.ResponseWriter, r *http.Request, _ int) { <-r.Context().Done() })
	br, _ := newBreaker(t, "", 2)
	e, err := httpcallback.New(httpcallback.Config{AllowNetworks: loopback, Breaker: br})
	require.NoError(t, err)
	u, err := url.Parse(rc.URL)
	require.NoError(t, err)
	for range 2 {
		_, _, err := runAttempt(t, e, httpcallback.CountedTimeout, map[string]any{"url": rc.URL, "timeout": httpcallback.CountedTimeout.String()})
		require.ErrorContains(t, err, "no response before the job's timeout")
	}
	require.NoError(t, br.Flush(context.Background()))
	require.Equal(t, "open", br.State(endpoints.Of(u)))
}

// A probe whose request says nothing of its endpoint (here its job is
// cancelled while the receiver has not answered) is given back: the next
// job, on any worker, takes the probe at once rather than after the
// cancelled job's timeout.
func TestBreakerProbeCutShortIsGivenBack(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, func(_ http.ResponseWriter, r *http.Request, _ int) { <-r.Context().Done() })
	schema := pgtest.Schema(t)
	br, table := newBreaker(t, schema, 1)
	u, err := url.Parse(rc.URL)
	require.NoError(t, err)
	ep := endpoints.Of(u)
	ctx := context.Background()
	_, err = pgtest.Pool(t).Exec(ctx, "INSERT INTO "+table+
		` (endpoint, state, opened_at, open_until, cool_down) VALUES ($1, 'open', now(), now(), interval '1 hour')`, ep)
	require.NoError(t, err)
	require.NoError(t, br.Load(ctx))
	e, err := httpcallback.New(httpcallback.Config{AllowNetworks: loopback, Breaker: br})
	require.NoError(t, err)

	jobCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		<-rc.got // the probe reached the receiver
		cancel()
	}()
	err = e.Execute(jobCtx, &executors.Job{ID: 1, Attempt: 1, Payload: []byte(`{"url": "` + rc.URL + `"}`), Timeout: time.Hour})
	require.ErrorIs(t, err, context.Canceled)

	other, _ := newBreaker(t, schema, 1) // another worker's
	require.NoError(t, other.Load(ctx))
	a := other.Admit(ctx, ep, time.Minute)
	require.True(t, a.Probe, "the cancelled job's probe is held: %+v", a)
}
