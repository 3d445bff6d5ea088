package httpcallback_test

import (
	"encoding/base64"
	"fmt"
	"html"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/executors/httpcallback"
)

// A receiver that echoes the request it got (an httpbin-style error page)
// sends the payload's secrets back: neither last_error nor the result holds
// them, in whatever form the page quotes them.
func TestEchoedSecretsAreMasked(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		var b strings.Builder
		b.WriteString("<table>")
		for _, name := range []string{"Authorization", "X-Api-Key", "Cookie"} {
			fmt.Fprintf(&b, "<tr><td>%s</td><td>%s</td></tr>", name, html.EscapeString(r.Header.Get(name)))
		}
		for _, c := range r.Cookies() {
			fmt.Fprintf(&b, "<tr><td>cookie %s</td><td>%s</td></tr>", c.Name, c.Value)
		}
		if user, pw, ok := r.BasicAuth(); ok {
			fmt.Fprintf(&b, "<tr><td>user</td><td>%s %s</td></tr>", user, pw)
		}
		b.WriteString("</table>")
		status := http.StatusInternalServerError
		if r.URL.Path == "/ok" {
			status = http.StatusOK
		}
		w.WriteHeader(status)
		_, _ = w.Write([]byte(b.String()))
	})
	e, err := httpcallback.New(httpcallback.Config{AllowNetworks: loopback})
	require.NoError(t, err)
	secrets := []string{"bearer-0ne", "api-key-tw0", "cookie-thr33", "url-pass-f0ur"}
	for _, path := range []string{"/error", "/ok"} {
		for _, headers := range []map[string]string{
			{"Authorization": "Bearer bearer-0ne", "X-Api-Key": "api-key-tw0", "Cookie": "session=cookie-thr33"},
			{"X-Api-Key": "api-key-tw0"},
		} {
			u := strings.Replace(rc.URL, "http://", "http://bob:url-pass-f0ur@", 1) + path
			if headers["Authorization"] != "" {
				u = rc.URL + path
			}
			got, raw, err := runAttempt(t, e, 10*time.Second, map[string]any{"url": u, "data": 1, "headers": headers})
			require.NotNil(t, got)
			body, _ := got["body"].(string)
			outs := []string{raw, body}
			if path == "/error" {
				require.ErrorContains(t, err, "HTTP 500")
				outs = append(outs, err.Error())
			} else {
				require.NoError(t, err)
			}
			for _, out := range outs {
				t.Log(out)
				require.Contains(t, out, "Api-Key", "the page is quoted")
				for _, s := range secrets {
					require.NotContains(t, out, s)
					require.NotContains(t, out, base64.StdEncoding.EncodeToString([]byte("bob:" + s))[4:12])
				}
			}
		}
	}
}

// A receiver's response is read to a bound, however it is sent: a header
// line that never ends, endless 1xx responses, and a chunked body whose
// trailer never ends each fail or end the attempt, having read a bounded
// number of bytes, and close the connection.
func TestEndlessResponses(t *testing.T) {
	t.Parallel()
	const limit = 64 << 20
	for name, c := range map[string]struct{ head, line, want string }{
		"header line":  {"HTTP/1.1 200 OK\r\nX-Long: ", "x", "exceeded"},
		"1xx":          {"", "HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n", "exceeded"},
		"trailer line": {"HTTP/1.1 500 Oops\r\nTransfer-Encoding: chunked\r\nTrailer: X-T\r\n\r\n4\r\nboom\r\n0\r\nX-T: ", "y", "HTTP 500"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			written := make(chan int64, 1)
			url := newRawReceiver(t, func(conn net.Conn, _ <-chan struct{}) {
				var n int64
				defer func() { written <- n }()
				m, err := conn.Write([]byte(c.head))
				n += int64(m)
				chunk := []byte(strings.Repeat(c.line, max(1, 32<<10/len(c.line))))
				for err == nil && n < limit {
					m, err = conn.Write(chunk)
					n += int64(m)
				}
			})
			e, err := httpcallback.New(httpcallback.Config{AllowNetworks: loopback})
			require.NoError(t, err)
			_, _, err = runAttempt(t, e, 20*time.Second, map[string]any{"url": url, "data": 1})
			require.ErrorContains(t, err, c.want)
			var n int64
			select {
			case n = <-written:
			case <-time.After(10 * time.Second):
				t.Fatal("the attempt has ended, and its connection is still open")
			}
			t.Logf("%s: %v; the receiver sent %d bytes", name, err, n)
			require.Less(t, n, int64(16<<20), "the client read on")
		})
	}
}

// A redirect to another host is refused, and its Location quoted: masked of
// the payload's secrets, which an echoing receiver may have put in it.
func TestEchoedSecretInARefusedRedirect(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		http.Redirect(w, r, "http://localhost:1/keys/"+r.Header.Get("X-Api-Key"), http.StatusTemporaryRedirect)
	})
	e, err := httpcallback.New(httpcallback.Config{AllowNetworks: loopback})
	require.NoError(t, err)
	_, _, err = runAttempt(t, e, 10*time.Second, map[string]any{"url": rc.URL, "data": 1, "headers": map[string]string{"X-Api-Key": "api-key-f1ve"}})
	require.ErrorContains(t, err, "refused: redirect")
	require.ErrorContains(t, err, "http://localhost:1/keys/xxxxx")
	require.NotContains(t, err.Error(), "api-key-f1ve")
}
