package httpcallback_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/executors/httpcallback"
)

// runAttempt runs one attempt of a job with payload, as a worker would,
// and returns the result it recorded (nil when none) and its error.
func runAttempt(t *testing.T, e *httpcallback.Executor, timeout time.Duration, payload any) (map[string]any, string, error) {
	t.Helper()
	raw, err := json.Marshal(payload)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	ctx, a := executors.WithAttempt(ctx)
	err = e.Execute(ctx, &executors.Job{ID: 7, Attempt: 1, Payload: raw})
	if a.Result() == nil {
		return nil, "", err
	}
	var got map[string]any
	require.NoError(t, json.Unmarshal(a.Result(), &got), "%s", a.Result())
	return got, string(a.Result()), err
}

// Every response is recorded, 2xx or not: its status, how long it took,
// and the first bytes of its body when there are any.
func TestResultOfAResponse(t *testing.T) {
	t.Parallel()
	const slow = 50 * time.Millisecond
	rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		switch r.URL.Path {
		case "/500":
			http.Error(w, "database is down", http.StatusInternalServerError)
		case "/503":
			w.WriteHeader(http.StatusServiceUnavailable)
		case "/200":
			time.Sleep(slow) // a receiver that takes its time
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"id": 42, "status": "queued"}` + "\n"))
		}
	})
	e, err := httpcallback.New(httpcallback.Config{SigningSecret: secret, AllowNetworks: loopback})
	require.NoError(t, err)
	// The URL's user info and query, the headers and the signature stay out
	// of the result.
	base := strings.Replace(rc.URL, "http://", "http://user:hunter2@", 1)
	headers := map[string]string{"Authorization": "Bearer sekrit-bearer"}

	got, raw, err := runAttempt(t, e, waitFor, map[string]any{"url": base + "/500?token=sekrit", "data": 1, "headers": headers})
	require.ErrorContains(t, err, "HTTP 500 Internal Server Error: database is down")
	require.Equal(t, map[string]any{"status": 500.0, "duration_ms": got["duration_ms"], "body": "database is down"}, got)
	require.GreaterOrEqual(t, got["duration_ms"], 0.0)
	for _, s := range []string{"hunter2", "sekrit", "Webhook", "v1,"} {
		require.NotContains(t, raw, s)
	}

	got, _, err = runAttempt(t, e, waitFor, map[string]any{"url": rc.URL + "/503", "data": 1})
	require.ErrorContains(t, err, "HTTP 503")
	require.Equal(t, map[string]any{"status": 503.0, "duration_ms": got["duration_ms"]}, got, "no body, no excerpt")

	got, _, err = runAttempt(t, e, waitFor, map[string]any{"url": rc.URL + "/200", "data": 1})
	require.NoError(t, err)
	require.Equal(t, map[string]any{"status": 200.0, "duration_ms": got["duration_ms"], "body": `{"id": 42, "status": "queued"}`}, got)
	require.GreaterOrEqual(t, got["duration_ms"], float64(slow.Milliseconds()), "from sending to the response's headers")
}

// A body is hostile: its excerpt in the result is printable, at most 256
// bytes, cut between characters, and masked of what looks like a secret,
// even one that straddles the cut.
func TestResultOfAHostileBody(t *testing.T) {
	t.Parallel()
	head := "\x1b]0;owned\x07\x1b[2J\r\n\u202eexe\xff\xfe \"next\": \"https://bob:hunter2@h.test/x?sig=s1gnature\", "
	pad := strings.Repeat("é", (202-len(head))/2) // the secret starts some 20 bytes before the cut
	body := head + pad + `"access_token": "` + strings.Repeat("SECRET", 10) + `"` + strings.Repeat("ü", 300)
	rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		if r.URL.Path == "/ok" {
			w.WriteHeader(http.StatusOK)
		} else {
			w.WriteHeader(http.StatusBadGateway)
		}
		_, _ = w.Write([]byte(body))
	})
	e, err := httpcallback.New(httpcallback.Config{AllowNetworks: loopback})
	require.NoError(t, err)
	for _, path := range []string{"/ok", "/fail"} {
		got, _, err := runAttempt(t, e, waitFor, map[string]any{"url": rc.URL + path, "data": 1})
		if path == "/ok" {
			require.NoError(t, err)
		} else {
			require.ErrorContains(t, err, "HTTP 502")
			require.ErrorContains(t, err, `"access_token": "xxxxx"`, "last_error's excerpt is masked as the result's is")
			require.NotContains(t, err.Error(), "SECRET")
		}
		excerpt, ok := got["body"].(string)
		require.True(t, ok, "%v", got)
		require.LessOrEqual(t, len(excerpt), 256)
		require.True(t, utf8.ValidString(excerpt))
		requireNoControls(t, excerpt)
		require.True(t, strings.HasPrefix(excerpt, `\x1b]0;owned\x07\x1b[2J  \u202eexe`+"\uFFFD"), excerpt)
		require.Contains(t, excerpt, "https://bob:xxxxx@h.test/x?sig=xxxxx")
		require.Contains(t, excerpt, `"access_token": "xxxxx"`)
		for _, s := range []string{"hunter2", "s1gnature", "SECRET"} {
			require.NotContains(t, excerpt, s)
		}
	}
}

// Without a response, an attempt that sent its request records how long it
// waited; one that sent nothing records nothing.
func TestResultWithoutAResponse(t *testing.T) {
	t.Parallel()
	hung := make(chan struct{})
	t.Cleanup(func() { close(hung) })
	rc := newReceiver(t, func(_ http.ResponseWriter, r *http.Request, _ int) {
		select {
		case <-hung:
		case <-r.Context().Done():
		}
	})
	e, err := httpcallback.New(httpcallback.Config{AllowNetworks: loopback})
	require.NoError(t, err)

	const timeout = 300 * time.Millisecond
	got, _, err := runAttempt(t, e, timeout, map[string]any{"url": rc.URL + "/hang", "data": 1})
	require.ErrorContains(t, err, "no response before the job's timeout")
	require.Equal(t, []string{"duration_ms"}, keys(got))
	require.GreaterOrEqual(t, got["duration_ms"], float64(timeout.Milliseconds())*0.9)

	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := "http://" + l.Addr().String() + "/"
	require.NoError(t, l.Close())
	got, _, err = runAttempt(t, e, waitFor, map[string]any{"url": closed, "data": 1})
	require.ErrorContains(t, err, "connection refused")
	require.Nil(t, got, "nothing was sent")

	public, err := httpcallback.New(httpcallback.Config{})
	require.NoError(t, err)
	got, _, err = runAttempt(t, public, waitFor, map[string]any{"url": rc.URL, "data": 1})
	require.ErrorContains(t, err, "refused")
	require.Nil(t, got, "the network guard refused the address: nothing was sent")
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
