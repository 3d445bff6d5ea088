package httpcallback_test

// A receiver that quotes the request back in an ordinary way (JSON-escaped,
// wrapped, re-encoded) gets no payload secret into last_error, the result,
// or what `jobs show` shows of them.

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/admin"
	"github.com/pgdispatch/pgdispatch/executors/httpcallback"
)

func runQuoting(t *testing.T, handle func(w http.ResponseWriter, r *http.Request), payload func(url string) map[string]any) (outs []string) {
	t.Helper()
	rc := httptest.NewServer(http.HandlerFunc(handle))
	t.Cleanup(rc.Close)
	e, err := httpcallback.New(httpcallback.Config{AllowNetworks: loopback})
	require.NoError(t, err)
	p := payload(rc.URL)
	got, _, err := runAttempt(t, e, 10*time.Second, p)
	require.Error(t, err)
	body, _ := got["body"].(string)
	// What `jobs show` and the console show without --reveal: the same
	// last_error, masked once more by Job.Mask.
	raw, _ := json.Marshal(p)
	le := err.Error()
	j := admin.Job{Payload: raw, LastError: &le}
	j.Mask()
	t.Logf("last_error: %s", err)
	t.Logf("result body: %s", body)
	t.Logf("jobs show last_error: %s", *j.LastError)
	return []string{err.Error(), body, *j.LastError}
}

// A Go receiver that answers json.Marshal(r.Header): encoding/json
// writes & < > as \u0026 \u003c \u003e, and a header's value is an array,
// which no JSON member rule reads: the key is masked in that form.
func TestQuotedJSONEscapedHeader(t *testing.T) {
	t.Parallel()
	const key = "ak&live<2026>Zq9"
	outs := runQuoting(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		_ = json.NewEncoder(w).Encode(map[string]any{"error": "bad request", "headers": r.Header})
	}, func(u string) map[string]any {
		return map[string]any{"url": u, "data": 1, "headers": map[string]string{"X-Api-Key": key}}
	})
	for _, out := range outs {
		require.NotContains(t, out, "live\\u003c2026\\u003eZq9", "the key, JSON-escaped")
	}
}

// httpbin's echo: the raw body as a JSON string ("data"), so the
// password's `"` and `\` are escaped twice, under a key that names no
// secret.
func TestQuotedBodyEscapedTwice(t *testing.T) {
	t.Parallel()
	const pw = `pa"ss\word-77`
	outs := runQuoting(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
		raw, _ := io.ReadAll(r.Body)
		_ = json.NewEncoder(w).Encode(map[string]any{"data": string(raw), "method": r.Method})
	}, func(u string) map[string]any {
		return map[string]any{"url": u, "data": map[string]any{"password": pw, "user": "bob"}}
	})
	for _, out := range outs {
		require.NotContains(t, out, `word-77`, "the password, JSON-escaped twice")
	}
}

// A query value (Google's ?key=, Azure SAS ?sig=) quoted bare: every query
// value of the payload's URLs is a known secret.
func TestQuotedBareQueryValue(t *testing.T) {
	t.Parallel()
	const key = "AIzaSyD-SECRET-0042"
	outs := runQuoting(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusForbidden)
		_, _ = fmt.Fprintf(w, "API key %s is not valid for this project", r.URL.Query().Get("key"))
	}, func(u string) map[string]any {
		return map[string]any{"url": u + "/v1/notify?key=" + key, "data": 1}
	})
	for _, out := range outs {
		require.NotContains(t, out, key)
	}
}

// A Bearer token with '/' (base64 tokens) quoted by a PHP-style
// json_encode, which writes "/" as "\/", under a key that is not a
// secret's: the Bearer rule alone would stop at the backslash.
func TestQuotedEscapedSlash(t *testing.T) {
	t.Parallel()
	const tok = "eyJhbGciOi/Jpc3MiOiJ/zZWNyZXQtdGFpbA"
	outs := runQuoting(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
		b, _ := json.Marshal(map[string]string{"received": r.Header.Get("Authorization")})
		_, _ = w.Write([]byte(strings.ReplaceAll(string(b), "/", `\/`)))
	}, func(u string) map[string]any {
		return map[string]any{"url": u, "data": 1, "headers": map[string]string{"Authorization": "Bearer " + tok}}
	})
	for _, out := range outs {
		require.NotContains(t, out, `zZWNyZXQtdGFpbA`, "the token's tail")
	}
}

// A secret in the URL's path (Slack, Discord, Teams webhooks: the path
// is the credential) is masked in last_error's target.
func TestPathTokenNotInLastError(t *testing.T) {
	t.Parallel()
	const tok = "XoXb9sEcReTwEbHoOkToKeN"
	outs := runQuoting(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNotFound)
	}, func(u string) map[string]any {
		return map[string]any{"url": u + "/services/T0001/B0001/" + tok, "data": 1}
	})
	for _, out := range outs[:1] {
		require.NotContains(t, out, tok)
	}
}

// A long token (a JWT) quoted in a page that wraps its lines: the Bearer
// rule masks the first line's part, and the known token the rest.
func TestQuotedWrappedToken(t *testing.T) {
	t.Parallel()
	const tok = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJib2IiLCJyb2xlIjoiYWRtaW4ifQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
	outs := runQuoting(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnauthorized)
		line := "rejected credentials: " + r.Header.Get("Authorization")
		for len(line) > 64 {
			_, _ = fmt.Fprintln(w, line[:64])
			line = line[64:]
		}
		_, _ = fmt.Fprintln(w, line)
	}, func(u string) map[string]any {
		return map[string]any{"url": u, "data": 1, "headers": map[string]string{"Authorization": "Bearer " + tok}}
	})
	for _, out := range outs {
		require.NotContains(t, out, "SflKxwRJSMeKKF2QT4fwpMeJf36POk6", "the JWT signature")
	}
}

// A refused redirect's Location is masked as the receiver sent it, before
// url.URL.String percent-encodes it (and ';' not as url.PathEscape does).
func TestRefusedLocationAsReceived(t *testing.T) {
	t.Parallel()
	const key = "ak<live>;2026 Zq9"
	outs := runQuoting(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", "http://localhost:1/keys/"+r.Header.Get("X-Api-Key"))
		w.WriteHeader(http.StatusTemporaryRedirect)
	}, func(u string) map[string]any {
		return map[string]any{"url": u, "data": 1, "headers": map[string]string{"X-Api-Key": key}}
	})
	for _, out := range outs[:1] {
		require.NotContains(t, out, "2026%20Zq9")
		require.Contains(t, out, "http://localhost:1/keys/xxxxx")
	}
}
