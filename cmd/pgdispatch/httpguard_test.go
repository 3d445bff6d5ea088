package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

// HTTP_ALLOW_NETWORKS reaches the executor: by default a receiver on this
// machine is refused, with a last_error that names the setting; with
// loopback allowed it is reached; a value that is no network stops the
// worker at start.
func TestHTTPAllowNetworks(t *testing.T) {
	t.Parallel()
	hits := make(chan string, 10)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits <- r.URL.Path
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(receiver.Close)

	for _, tc := range []struct {
		env, path, status, want string
	}{
		{"HTTP_ALLOW_NETWORKS=", "/default", "dead", "refused: 127.0.0.1 is not in HTTP_ALLOW_NETWORKS (public)"},
		{"HTTP_ALLOW_NETWORKS=public,10.0.0.0/8", "/private", "dead", "refused: 127.0.0.1 is not in HTTP_ALLOW_NETWORKS (public,10.0.0.0/8)"},
		{"HTTP_ALLOW_NETWORKS=loopback", "/loopback", "done", ""},
	} {
		schema := pgtest.Schema(t)
		w := pgtest.Watch(t, schema)
		p := start(t, dbEnv(schema, "POLL_INTERVAL=1h", tc.env), "run")
		p.stderr.waitFor(t, "worker started", 30*time.Second)
		id := insert(t, schema, fmt.Sprintf(`INSERT INTO {jobs} (kind, payload) VALUES ('http_callback', '{"url": "%s%s"}') RETURNING id`, receiver.URL, tc.path))
		s := w.Status(t, id, tc.status, 30*time.Second)
		if tc.want != "" {
			require.Contains(t, *s.Error, tc.want, tc.env)
		}
	}
	require.Equal(t, "/loopback", <-hits)
	require.Empty(t, hits, "only the allowed job reached the receiver")

	schema := pgtest.Schema(t)
	p := start(t, dbEnv(schema, "HTTP_ALLOW_NETWORKS=public,everything"), "run")
	require.Equal(t, 1, p.wait(t, 30*time.Second))
	require.Contains(t, p.stderr.String(), `allowed network "everything": want a CIDR such as 10.0.0.0/8, an IP, or public, private or loopback`)
	require.NotContains(t, p.stderr.String(), "panic")
}
