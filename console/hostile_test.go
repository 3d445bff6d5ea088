package console

import (
	"html"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The characters a browser hides or acts on (bidirectional overrides,
// zero-width and other format characters) in a job's payload and results
// show as escapes, as in its other fields: a writer cannot make the payload
// read other than it is (a URL whose end shows reversed).
func TestJobDocumentsShowHiddenCharacters(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.exec(t, `INSERT INTO {jobs} (queue, kind, status, finished_at, payload, result, errors)
		VALUES ('q', 'k', 'done', now(), '{"url": "https://example.com/\u202egnp.exe", "to": "a\u200bb"}',
		'{"body": "\u2066ok\u2069"}',
		jsonb_build_array(jsonb_build_object('attempt', 1, 'worker', 'w', 'error', 'e', 'result', '{"body": "\u202dx"}'::jsonb)))`)
	hidden := "\u202e\u200b\u2066\u2069\u202d"
	check := func(what string, code int, body string) {
		t.Helper()
		require.Equal(t, http.StatusOK, code, what)
		require.False(t, strings.ContainsAny(body, hidden), "%s shows a hidden character as it is", what)
		for _, esc := range []string{`\u202egnp.exe`, `a\u200bb`, `\u2066ok\u2069`, `\u202dx`} {
			require.Contains(t, body, esc, what)
		}
	}
	code, body := b.request(t, "GET", "/jobs/1", "vic", viewerToken, nil, nil)
	check("the masked page", code, body)
	code, body = b.request(t, "POST", "/jobs/1/reveal", "ann", operatorToken,
		map[string][]string{"csrf": {b.srv.csrfToken(user{Name: "ann", role: operator})}}, nil)
	check("the page revealed", code, body)
}

// The overview lists the first queues by name, as the live state does, and
// counts the others: a writer who makes a queue of each job cannot make the
// page as large as the table.
func TestOverviewBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.srv.hub.mu.Lock()
	b.srv.hub.maxQueues = 2
	b.srv.hub.mu.Unlock()
	b.exec(t, `INSERT INTO {jobs} (queue, kind) SELECT 'q' || i, 'k' FROM generate_series(1, 5) i`)
	code, body := b.request(t, "GET", "/", "vic", viewerToken, nil, nil)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, 2, strings.Count(body, "<tr data-queue="), body)
	require.Contains(t, body, `data-queue="q1"`)
	require.Contains(t, body, `data-queue="q2"`)
	require.Contains(t, body, `<p class="note" id="more-queues">3 more queues follow`)
}

// A host may hold what a shell acts on ($, ( and ;, which url.Parse
// accepts in a name, and check_endpoint too): the commands the console
// gives to copy, on a job's page and after an enable, quote it, so that
// pasting one runs pgdispatch and nothing else.
func TestEndpointCommandsQuoteTheHost(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	const ep = "https://x$(id);y:443"
	b.exec(t, `SELECT {schema}.disable_endpoint($1)`, ep)
	b.exec(t, `INSERT INTO {jobs} (queue, kind, payload) VALUES ('q', 'http_callback', $1)`, `{"url": "https://x$(id);y/hook"}`)
	_, body := b.request(t, "GET", "/jobs/1", "ann", operatorToken, nil, nil)
	require.Contains(t, body, "<code>pgdispatch endpoints enable "+html.EscapeString(`'https://x$(id);y:443'`)+"</code>")

	_, msg := b.post(t, "/actions/endpoints", url.Values{"action": {"enable"}, "endpoint": {ep}})
	require.Contains(t, msg, `'pgdispatch jobs retry --all-dead --host 'x$(id);y:443'' counts them`)
}
