package console

import (
	"context"
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgdispatch/pgdispatch/admin"
	"github.com/pgdispatch/pgdispatch/endpoints"
)

// The endpoints breakEndpoints leaves, as the workers' breaker writes them.
const (
	// epHealthy is closed: one failure in five attempts. By name alone it
	// would sort first.
	epHealthy = "https://a-healthy.example.com:443"
	// epDown is open for an hour: four failures in four attempts.
	epDown = "https://down.example.com:443"
	// epFlaky is half-open: its cool-down is over and its probe in
	// flight for an hour.
	epFlaky = "http://flaky.example.com:8080"
	// reasonSecret is a token quoted in epDown's reason.
	reasonSecret = "tok-9f8e7d6c5b4a"
)

// breakEndpoints makes epHealthy, epDown and epFlaky with the breaker of
// package endpoints, as two workers would: their outcomes are written by
// record_endpoint_outcomes, and epFlaky's probe is taken by Admit.
func (b *bundle) breakEndpoints(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	breaker := func(coolDown time.Duration) *endpoints.Breaker {
		br, err := endpoints.New(endpoints.Config{DB: b.pool, Schema: b.schema, MinAttempts: 4, FailureRatio: 0.5, CoolDown: coolDown})
		require.NoError(t, err)
		return br
	}
	slow := breaker(time.Hour)
	for range 4 {
		// A reason the executor did not mask: the console masks it again.
		slow.Record(epDown, true, `POST https://down.example.com/hook: HTTP 503 Service Unavailable: {"access_token": "`+reasonSecret+`"}`)
		slow.Record(epHealthy, false, "")
	}
	slow.Record(epHealthy, true, "HTTP 500 Internal Server Error")
	require.NoError(t, slow.Flush(ctx))

	quick := breaker(time.Microsecond)
	for range 4 {
		quick.Record(epFlaky, true, "dial tcp 10.0.0.7:8080: connect: connection refused")
	}
	require.NoError(t, quick.Flush(ctx))
	require.NoError(t, quick.Load(ctx)) // the cool-down is over
	require.True(t, quick.Admit(ctx, epFlaky, time.Hour).Probe, "the probe of epFlaky")

	for e, want := range map[string]string{epHealthy: "closed", epDown: "open", epFlaky: "half_open"} {
		require.Equal(t, want, b.queryString(t, `SELECT state FROM {schema}.endpoints WHERE endpoint = $1`, e), e)
	}
}

// The endpoints disableEndpoints adds to breakEndpoints', by the real
// breaker and SQL functions.
const (
	// epOld is disabled by the breaker: its probe failed after it had
	// been open for longer than DisableAfter. Its circuit stays open.
	epOld = "https://old.example.net:443"
	// epGone is disabled by an operator before any request: its circuit
	// is closed. Its note is goneNote.
	epGone = "https://gone.example.com:443"
	// epBack was disabled by an operator, and enabled again: closed.
	epBack = "https://back.example.com:443"
	// eventSecret is a password quoted in epOld's reasons.
	eventSecret = "pw-1a2b3c4d5e"
	// downNote is epDown's note, set by an operator.
	downNote = "on call: payments"
)

// goneNote is epGone's note: markup and an escape, as an operator may
// write.
const goneNote = "receiver retired " + hostile

// disableEndpoints makes epOld, epGone and epBack, after breakEndpoints,
// and sets epDown's note. Their events, oldest first: epDown opened,
// epFlaky opened, epOld opened, epOld disabled by breaker, epGone disabled
// by operator, epBack disabled and enabled by operator.
func (b *bundle) disableEndpoints(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	br, err := endpoints.New(endpoints.Config{
		DB: b.pool, Schema: b.schema, MinAttempts: 4, FailureRatio: 0.5,
		CoolDown: time.Microsecond, DisableAfter: time.Microsecond,
	})
	require.NoError(t, err)
	reason := `POST https://old.example.net/hook: HTTP 502 Bad Gateway: {"password": "` + eventSecret + `"}`
	for range 4 {
		br.Record(epOld, true, reason)
	}
	require.NoError(t, br.Flush(ctx))
	require.NoError(t, br.Load(ctx)) // the cool-down is over
	probe := br.Admit(ctx, epOld, time.Hour)
	require.True(t, probe.Probe, "the probe of epOld")
	require.NoError(t, br.ProbeDone(ctx, epOld, probe, true, reason))

	b.exec(t, `SELECT {schema}.disable_endpoint($1, $2)`, epGone, goneNote)
	b.exec(t, `SELECT {schema}.disable_endpoint($1)`, epBack)
	b.exec(t, `SELECT {schema}.enable_endpoint($1)`, epBack)
	b.exec(t, `SELECT {schema}.set_endpoint_note($1, $2)`, epDown, downNote)
	for e, want := range map[string]string{epOld: "open breaker", epGone: "closed operator", epBack: "closed -"} {
		require.Equal(t, want, b.queryString(t, `SELECT state || ' ' || coalesce(disabled_by, '-') FROM {schema}.endpoints WHERE endpoint = $1`, e), e)
	}
}

// stamp is a timestamp column of an endpoint as the console writes times.
func (b *bundle) stamp(t *testing.T, column, endpoint string) string {
	t.Helper()
	return b.queryString(t, `SELECT to_char(`+column+` AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.MS') FROM {schema}.endpoints WHERE endpoint = $1`, endpoint)
}

var (
	endpointRow = regexp.MustCompile(`(?s)<tr data-endpoint="([^"]*)" data-state="([^"]*)".*?</tr>`)
	badgeText   = regexp.MustCompile(`<span class="badge ep-[a-z_]+">([^<]*)</span>`)
)

// The endpoints page lists every endpoint as `pgdispatch endpoints list`
// does, those not closed first; says each state in words; shows the
// window's counts, when it opened and until when; and masks the secret in
// a reason.
func TestEndpointsPage(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	code, body := b.request(t, "GET", "/endpoints", "vic", viewerToken, nil, nil)
	require.Equal(t, 200, code)
	require.Contains(t, body, "No endpoint yet")
	_, body = b.request(t, "GET", "/", "vic", viewerToken, nil, nil)
	require.NotContains(t, body, "endpoints-note", "the overview: no endpoint is open")

	b.breakEndpoints(t)
	_, body = b.request(t, "GET", "/", "vic", viewerToken, nil, nil)
	require.Contains(t, body, `<a href="/endpoints">1 endpoint open, 1 half-open</a>`, "the overview")
	code, body = b.request(t, "GET", "/endpoints", "vic", viewerToken, nil, nil)
	require.Equal(t, 200, code)
	require.Contains(t, body, `<a href="/endpoints" class="here">Endpoints</a>`)
	var order, states, words []string
	rows := map[string]string{}
	for _, m := range endpointRow.FindAllStringSubmatch(body, -1) {
		order = append(order, m[1])
		states = append(states, m[2])
		words = append(words, badgeText.FindStringSubmatch(m[0])[1])
		rows[m[1]] = m[0]
	}
	require.Equal(t, []string{epFlaky, epDown, epHealthy}, order, "not closed first, then by name")
	require.Equal(t, []string{"half_open", "open", "closed"}, states)
	require.Equal(t, []string{"half-open", "open", "closed"}, words, "each state in words")
	require.Contains(t, body, "2 of 3 not closed")

	cell := func(endpoint, f string) string {
		t.Helper()
		m := regexp.MustCompile(`(?s)data-f="` + f + `"[^>]*>(.*?)</td>`).FindStringSubmatch(rows[endpoint])
		require.NotNil(t, m, "%s's %s", endpoint, f)
		return m[1]
	}
	require.Equal(t, "5", cell(epHealthy, "attempts"))
	require.Equal(t, "1", cell(epHealthy, "failures"))
	require.Equal(t, "—", cell(epHealthy, "opened"))
	require.Equal(t, "—", cell(epHealthy, "until"))
	require.Equal(t, "HTTP 500 Internal Server Error", cell(epHealthy, "reason"), "the last failure counted")
	require.Equal(t, "0", cell(epDown, "attempts"), "a new window began when it opened")
	require.Equal(t, b.stamp(t, "opened_at", epDown), cell(epDown, "opened"))
	require.Equal(t, b.stamp(t, "open_until", epDown)+` <span class="note">(cool-down 1h0m0s)</span>`, cell(epDown, "until"))
	require.Equal(t, "probe until "+b.stamp(t, "probe_until", epFlaky)+` <span class="note">(cool-down 1µs)</span>`, cell(epFlaky, "until"))
	require.Contains(t, cell(epFlaky, "reason"), "connection refused")

	// The reason shows its first 80 characters, and the whole of it on
	// hover, masked.
	reason := cell(epDown, "reason")
	require.Contains(t, reason, "HTTP 503 Service Unavailable")
	require.True(t, strings.HasSuffix(reason, "…"), reason)
	require.NotContains(t, body, reasonSecret, "the reason's token is masked")
	title := regexp.MustCompile(`data-f="reason" title="([^"]*)"`).FindStringSubmatch(rows[epDown])
	require.NotNil(t, title)
	require.Contains(t, html.UnescapeString(title[1]), `{"access_token": "xxxxx"}`)
}

// endpointCell is the inner HTML of an endpoint row's (or an event row's)
// cell named f.
func endpointCell(t *testing.T, row, f string) string {
	t.Helper()
	m := regexp.MustCompile(`(?s)data-f="` + f + `"[^>]*>(.*?)</td>`).FindStringSubmatch(row)
	require.NotNil(t, m, "%s in %s", f, row)
	return m[1]
}

var eventRow = regexp.MustCompile(`(?s)<tr data-id="(\d+)" data-event="([^"]*)">.*?</tr>`)

// A disabled endpoint says so in words, distinct from its circuit's
// state, by whom and since when, and no probe time; the disabled come
// first, as `pgdispatch endpoints list` sorts them; the summary and the
// overview count them; an operator's note shows as text. The events
// follow, newest first, with who wrote them, the reason masked and the
// note.
func TestEndpointsDisabled(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	_, body := b.request(t, "GET", "/endpoints", "vic", viewerToken, nil, nil)
	require.Contains(t, body, "No event kept")
	b.breakEndpoints(t)
	b.disableEndpoints(t)

	_, body = b.request(t, "GET", "/", "vic", viewerToken, nil, nil)
	require.Contains(t, body, `<a href="/endpoints" id="endpoints-disabled">2 endpoints disabled</a>`, "the overview")
	require.Contains(t, body, `<a href="/endpoints">1 endpoint open, 1 half-open</a>`, "the overview: epOld counts as disabled only")

	code, body := b.request(t, "GET", "/endpoints", "vic", viewerToken, nil, nil)
	require.Equal(t, 200, code)
	var order, words []string
	rows := map[string]string{}
	for _, m := range endpointRow.FindAllStringSubmatch(body, -1) {
		order = append(order, m[1])
		words = append(words, badgeText.FindStringSubmatch(m[0])[1])
		rows[m[1]] = m[0]
	}
	require.Equal(t, []string{epOld, epGone, epFlaky, epDown, epHealthy, epBack}, order, "the disabled first, then those not closed, then by name")
	require.Equal(t, []string{"disabled", "disabled", "half-open", "open", "closed", "closed"}, words)
	require.Contains(t, body, "<strong>2 of 6 disabled</strong>: their jobs are dead, unsent, when next claimed.")
	require.Contains(t, body, "<strong>2 of 6 not closed</strong>: their jobs wait")

	require.Contains(t, rows[epOld], `data-state="open" data-disabled="breaker" class="ep-disabled"`)
	require.Contains(t, rows[epGone], `data-state="closed" data-disabled="operator" class="ep-disabled"`)
	require.NotContains(t, rows[epBack], "data-disabled", "enabled again")
	require.Equal(t, `<span class="badge ep-disabled">disabled</span> <span class="note">circuit open</span>`, endpointCell(t, rows[epOld], "state"))
	require.Equal(t, `<span class="badge ep-disabled">disabled</span> <span class="note">circuit closed</span>`, endpointCell(t, rows[epGone], "state"))
	require.Equal(t, "by breaker since "+b.stamp(t, "disabled_at", epOld), endpointCell(t, rows[epOld], "disabled"))
	require.Equal(t, "by operator since "+b.stamp(t, "disabled_at", epGone), endpointCell(t, rows[epGone], "disabled"))
	require.Equal(t, "—", endpointCell(t, rows[epDown], "disabled"))
	require.Equal(t, `— <span class="note">(no probe goes)</span>`, endpointCell(t, rows[epOld], "until"))
	require.Equal(t, b.stamp(t, "opened_at", epOld), endpointCell(t, rows[epOld], "opened"))
	require.Equal(t, downNote, endpointCell(t, rows[epDown], "note"))
	require.Equal(t, "—", endpointCell(t, rows[epHealthy], "note"))
	require.Equal(t, html.EscapeString(visible(goneNote)), endpointCell(t, rows[epGone], "note"), "the note as text")
	require.NotContains(t, body, "<script>alert(1)")
	require.NotContains(t, body, eventSecret, "the reasons' password is masked")
	require.Contains(t, html.UnescapeString(endpointCell(t, rows[epOld], "reason")), `HTTP 502 Bad Gateway: {"password": "xxxxx"}`)

	type event struct{ endpoint, event, by, reason, note, job string }
	var events []event
	for _, m := range eventRow.FindAllStringSubmatch(body, -1) {
		require.Equal(t, m[2], html.UnescapeString(regexp.MustCompile(`<[^>]*>`).ReplaceAllString(endpointCell(t, m[0], "event"), "")))
		events = append(events, event{
			html.UnescapeString(regexp.MustCompile(`</?code>`).ReplaceAllString(endpointCell(t, m[0], "endpoint"), "")), m[2],
			regexp.MustCompile(`^(\w+) <span class="note">\(([^)]*)\)</span>$`).ReplaceAllString(endpointCell(t, m[0], "by"), "$1 $2"),
			html.UnescapeString(endpointCell(t, m[0], "reason")), endpointCell(t, m[0], "note"), endpointCell(t, m[0], "job"),
		})
	}
	role := b.queryString(t, `SELECT current_user::text`)
	masked := `POST https://old.example.net/hook: HTTP 502 Bad Gateway: {"password": "xxxxx"}`
	require.Equal(t, []event{
		{epBack, "enabled", "operator " + role, "—", "—", "—"},
		{epBack, "disabled", "operator " + role, "—", "—", "—"},
		{epGone, "disabled", "operator " + role, "—", html.EscapeString(visible(goneNote)), "—"},
		{epOld, "disabled", "breaker " + role, masked, "—", "—"},
		{epOld, "opened", "breaker " + role, masked, "—", "—"},
		{epFlaky, "opened", "breaker " + role, "dial tcp 10.0.0.7:8080: connect: connection refused", "—", "—"},
		{epDown, "opened", "breaker " + role, `POST https://down.example.com/hook: HTTP 503 Service Unavailable: {"access_token…`, "—", "—"},
	}, events, "newest first")
	at := regexp.MustCompile(`data-f="at">([^<]*)</td>`).FindStringSubmatch(body)
	require.Equal(t, b.queryString(t, `SELECT to_char(max(at) AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.MS') FROM {schema}.endpoint_events`), at[1])
}

// The page lists the first maxEndpointsShown endpoints, those not closed
// among them, and counts the others.
func TestEndpointsPageBounded(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.breakEndpoints(t)
	// as many more endpoints, closed, as the page shows, with one outcome
	// each, written as the workers write them
	b.exec(t, `SELECT {schema}.record_endpoint_outcomes(array_agg(format('https://h%s.example.com:443', lpad(g::text, 4, '0')) ORDER BY g),
		array_agg(1), array_agg(0), array_agg(NULL::text), interval '1 minute', 4, 0.5, interval '1 hour')
		FROM generate_series(1, $1) g`, maxEndpointsShown)
	_, body := b.request(t, "GET", "/endpoints", "vic", viewerToken, nil, nil)
	rows := endpointRow.FindAllStringSubmatch(body, -1)
	require.Len(t, rows, maxEndpointsShown)
	require.Equal(t, []string{epFlaky, epDown}, []string{rows[0][1], rows[1][1]}, "those not closed first")
	require.Contains(t, body, fmt.Sprintf("2 of %d not closed", maxEndpointsShown+3))
	require.Contains(t, body, `<p class="note" id="more">3 more endpoints follow, not shown here`)

	// As many more events as the page shows, and one: it shows the
	// newest.
	b.exec(t, `SELECT {schema}.disable_endpoint(format('https://e%s.example.com:443', lpad(g::text, 4, '0')))
		FROM generate_series(1, $1) g ORDER BY g`, maxEndpointEventsShown+1)
	_, body = b.request(t, "GET", "/endpoints", "vic", viewerToken, nil, nil)
	events := eventRow.FindAllStringSubmatch(body, -1)
	require.Len(t, events, maxEndpointEventsShown)
	require.Equal(t, fmt.Sprint(b.queryInt(t, `SELECT max(id) FROM {schema}.endpoint_events`)), events[0][1], "the newest first")
	require.Contains(t, events[0][0], fmt.Sprintf("https://e%04d.example.com:443", maxEndpointEventsShown+1))
	require.Contains(t, body, fmt.Sprintf("%d of %d disabled", maxEndpointEventsShown+1, maxEndpointsShown+3+maxEndpointEventsShown+1))
}

// insertHook inserts a job of kind in the queue hooks whose payload's url
// is url, and returns its id.
func (b *bundle) insertHook(t *testing.T, kind, status, url string) int64 {
	t.Helper()
	return b.queryInt(t, `INSERT INTO {jobs} (queue, kind, status, finished_at, payload)
		VALUES ('hooks', $1, $2, CASE WHEN $2 = 'dead' THEN now() END, jsonb_build_object('url', $3::text, 'data', '{}'::jsonb))
		RETURNING id`, kind, status, url)
}

// jobRows is the jobs list at path, each row by its job's id.
func (b *bundle) jobRows(t *testing.T, path string) map[int64]string {
	t.Helper()
	_, body := b.request(t, "GET", path, "vic", viewerToken, nil, nil)
	rows := map[int64]string{}
	for _, m := range regexp.MustCompile(`(?s)<tr data-id="(\d+)".*?</tr>`).FindAllStringSubmatch(body, -1) {
		var id int64
		_, err := fmt.Sscan(m[1], &id)
		require.NoError(t, err)
		rows[id] = m[0]
	}
	return rows
}

// requireNoHeldLine checks that the pages of the jobs ids say nothing of
// their endpoint.
func (b *bundle) requireNoHeldLine(t *testing.T, ids []int64) {
	t.Helper()
	for _, id := range ids {
		_, body := b.request(t, "GET", fmt.Sprintf("/jobs/%d", id), "vic", viewerToken, nil, nil)
		require.NotContains(t, body, "endpoint-held", "job %d", id)
	}
}

// A pending http_callback job whose endpoint is open or half-open says so
// on its page and in the jobs list, with the time it holds until; the
// endpoint is found as the executor finds it (case and the default port
// do not matter). A job of another status or kind, or whose endpoint is
// closed, says nothing of it.
func TestJobHeldByItsEndpoint(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.breakEndpoints(t)
	insert := func(kind, status, url string) int64 { return b.insertHook(t, kind, status, url) }
	held := map[int64]string{
		insert("http_callback", "pending", "https://down.example.com/hook?token=abc12345"): "open until " + b.stamp(t, "open_until", epDown),
		insert("http_callback", "pending", "HTTPS://Down.Example.COM:443/other"):           "open until " + b.stamp(t, "open_until", epDown),
		insert("http_callback", "pending", "http://flaky.example.com:8080/x"):              "half-open until " + b.stamp(t, "probe_until", epFlaky),
	}
	free := []int64{
		insert("http_callback", "pending", "https://a-healthy.example.com/x"),
		insert("http_callback", "pending", "http://down.example.com/x"), // port 80: another endpoint
		insert("http_callback", "dead", "https://down.example.com/hook"),
		insert("email", "pending", "https://down.example.com/hook"),
	}

	for id, want := range held {
		_, body := b.request(t, "GET", fmt.Sprintf("/jobs/%d", id), "vic", viewerToken, nil, nil)
		m := regexp.MustCompile(`(?s)<p class="waiting" id="endpoint-held">(.*?)</p>`).FindStringSubmatch(body)
		require.NotNil(t, m, "job %d", id)
		require.Contains(t, m[1], want+" UTC", "job %d", id)
		require.Contains(t, m[1], `<a href="/endpoints">`)
	}
	b.requireNoHeldLine(t, free)

	// The list, and its rows as the live updates reload them.
	for _, path := range []string{"/jobs?queue=hooks", "/jobs?queue=hooks&fragment=1"} {
		rows := b.jobRows(t, path)
		require.Len(t, rows, len(held)+len(free), path)
		for id, want := range held {
			require.Contains(t, rows[id], `<div class="held" title="endpoint `, "%s: job %d", path, id)
			require.Contains(t, rows[id], ">endpoint "+want+"</div>", "%s: job %d", path, id)
		}
		for _, id := range free {
			require.NotContains(t, rows[id], `class="held"`, "%s: job %d", path, id)
		}
	}
}

// A pending http_callback job whose endpoint is disabled, its circuit
// closed or open, says on its page and in the jobs list that it will be
// dead when claimed, and by whom and since when the endpoint is disabled;
// a job whose endpoint was enabled again, or a dead one, says nothing of
// it.
func TestJobOfDisabledEndpoint(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.breakEndpoints(t)
	b.disableEndpoints(t)
	insert := func(status, url string) int64 { return b.insertHook(t, "http_callback", status, url) }
	disabled := map[int64]string{
		insert("pending", "https://gone.example.com/hook?token=abc12345"): "disabled by operator since " + b.stamp(t, "disabled_at", epGone),
		insert("pending", "https://OLD.example.net/hook"):                 "disabled by breaker since " + b.stamp(t, "disabled_at", epOld),
	}
	free := []int64{
		insert("pending", "https://back.example.com/hook"),
		insert("dead", "https://gone.example.com/hook"),
	}
	for id, want := range disabled {
		_, body := b.request(t, "GET", fmt.Sprintf("/jobs/%d", id), "vic", viewerToken, nil, nil)
		m := regexp.MustCompile(`(?s)<p class="waiting disabled" id="endpoint-held">(.*?)</p>`).FindStringSubmatch(body)
		require.NotNil(t, m, "job %d", id)
		require.Contains(t, m[1], want+" UTC: this job will be dead, unsent, when it is next claimed, unless the endpoint is enabled first", "job %d", id)
		require.Contains(t, m[1], "<code>pgdispatch endpoints enable https://", "job %d", id)
		require.NotContains(t, m[1], "until", "job %d: no probe goes", id)
	}
	b.requireNoHeldLine(t, free)
	for _, path := range []string{"/jobs?queue=hooks", "/jobs?queue=hooks&fragment=1"} {
		rows := b.jobRows(t, path)
		require.Len(t, rows, len(disabled)+len(free), path)
		for id, want := range disabled {
			require.Contains(t, rows[id], `<div class="held disabled" title="endpoint https://`, "%s: job %d", path, id)
			require.Contains(t, rows[id], want+` UTC">endpoint disabled: dead when claimed</div>`, "%s: job %d", path, id)
		}
		for _, id := range free {
			require.NotContains(t, rows[id], `class="held`, "%s: job %d", path, id)
		}
	}
}

// An operator disables an endpoint from its row, with a note, sets and
// clears its note, and enables it again, as `pgdispatch endpoints
// disable|note|enable` do: each changes the row through the SQL
// functions, each disable and enable is an event by operator with the
// console's event job, each is logged with who did it, and a second
// disable or enable says it changed nothing. A viewer sees no form and
// may not post one.
func TestEndpointActions(t *testing.T) {
	t.Parallel()
	core, logs := observer.New(zap.InfoLevel)
	b := setup(t, Config{Logger: zap.New(core), EndpointEventJob: admin.EventJob{Kind: "endpoint_event", Queue: "ops"}})
	b.breakEndpoints(t)

	_, body := b.request(t, "GET", "/endpoints", "vic", viewerToken, nil, nil)
	require.NotContains(t, body, "/actions/endpoints", "a viewer sees no form")
	code, _ := b.request(t, "POST", "/actions/endpoints", "vic", viewerToken,
		url.Values{"action": {"disable"}, "endpoint": {epDown}, "csrf": {b.srv.csrfToken(user{Name: "vic", role: viewer})}}, nil)
	require.Equal(t, http.StatusForbidden, code)

	// The operator's row of epDown, and its buttons.
	buttons := func(endpoint string) []string {
		t.Helper()
		_, body := b.request(t, "GET", "/endpoints", "ann", operatorToken, nil, nil)
		for _, m := range endpointRow.FindAllStringSubmatch(body, -1) {
			if m[1] == endpoint {
				require.Contains(t, m[0], `<input type="hidden" name="endpoint" value="`+endpoint+`">`)
				var out []string
				for _, b := range regexp.MustCompile(`<button name="action" value="([a-z]+)"`).FindAllStringSubmatch(m[0], -1) {
					out = append(out, b[1])
				}
				return out
			}
		}
		t.Fatalf("no row of %s", endpoint)
		return nil
	}
	require.Equal(t, []string{"note", "disable"}, buttons(epDown))
	endpoint := func() string {
		return b.queryString(t, `SELECT state || ' ' || coalesce(disabled_by, '-') || ' ' || coalesce(note, '-') FROM {schema}.endpoints WHERE endpoint = $1`, epDown)
	}

	// Disable is asked again first; the confirmation posts it with the note.
	code, page := b.postPage(t, "/actions/endpoints", url.Values{"action": {"disable"}, "endpoint": {epDown}, "note": {"ask payments"}})
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, page, `id="question">Disable the endpoint `+epDown+`?<`)
	require.Equal(t, "open - -", endpoint(), "not disabled before it is confirmed")
	code, msg := b.post(t, "/actions/endpoints", confirmForm(t, page))
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, "endpoint "+epDown+": disabled; its jobs are dead, unsent, when next claimed, until it is enabled", msg)
	require.Equal(t, "open operator ask payments", endpoint())
	require.Equal(t, []string{"note", "enable"}, buttons(epDown))
	_, msg = b.post(t, "/actions/endpoints", url.Values{"action": {"disable"}, "endpoint": {epDown}, "confirmed": {"yes"}})
	require.Equal(t, "endpoint "+epDown+" was disabled already", msg)

	_, msg = b.post(t, "/actions/endpoints", url.Values{"action": {"note"}, "endpoint": {epDown}, "note": {"ask payments, then ops"}})
	require.Equal(t, "endpoint "+epDown+": note set", msg)
	require.Equal(t, "open operator ask payments, then ops", endpoint())
	_, msg = b.post(t, "/actions/endpoints", url.Values{"action": {"note"}, "endpoint": {epDown}, "note": {""}})
	require.Equal(t, "endpoint "+epDown+": note cleared", msg)
	require.Equal(t, "open operator -", endpoint())

	_, msg = b.post(t, "/actions/endpoints", url.Values{"action": {"enable"}, "endpoint": {epDown}})
	require.Equal(t, "endpoint "+epDown+": enabled; the jobs that died while it was disabled: "+
		"'pgdispatch jobs retry --all-dead --host down.example.com:443' counts them, --yes retries them", msg)
	require.Equal(t, "closed - -", endpoint())
	require.Equal(t, []string{"note", "disable"}, buttons(epDown))
	_, msg = b.post(t, "/actions/endpoints", url.Values{"action": {"enable"}, "endpoint": {epDown}})
	require.Equal(t, "endpoint "+epDown+" was not disabled", msg)

	// The events, with their jobs.
	require.Equal(t, "disabled operator ask payments endpoint_event ops; enabled operator - endpoint_event ops",
		b.queryString(t, `SELECT string_agg(e.event || ' ' || e.actor || ' ' || coalesce(e.note, '-') || ' ' || j.kind || ' ' || j.queue, '; ' ORDER BY e.id)
			FROM {schema}.endpoint_events e JOIN {jobs} j ON j.id = e.job_id WHERE e.actor = 'operator'`))

	// What is not an endpoint, or no action.
	_, msg = b.post(t, "/actions/endpoints", url.Values{"action": {"disable"}, "endpoint": {"https://down.example.com/hook"}, "confirmed": {"yes"}})
	require.Contains(t, msg, "could not disable endpoint")
	require.Contains(t, msg, "not an endpoint")
	code, _ = b.postLocation(t, "/actions/endpoints", url.Values{"action": {"drop"}, "endpoint": {epDown}})
	require.Equal(t, http.StatusBadRequest, code)

	actions := logs.FilterMessage("console action").All()
	require.Len(t, actions, 7)
	for _, e := range actions {
		require.Equal(t, "ann", e.ContextMap()["who"])
	}
	require.Equal(t, epDown, actions[5].ContextMap()["endpoint"])
	require.Equal(t, "disable endpoint", actions[0].ContextMap()["action"])
}

// The endpoint of a job that cannot be read is no error: the page shows.
func TestJobWithUnreadableURL(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.breakEndpoints(t)
	id := b.queryInt(t, `INSERT INTO {jobs} (queue, kind, payload) VALUES ('hooks', 'http_callback', '{"url": 42}') RETURNING id`)
	code, body := b.request(t, "GET", fmt.Sprintf("/jobs/%d", id), "vic", viewerToken, nil, nil)
	require.Equal(t, 200, code)
	require.False(t, strings.Contains(body, "endpoint-held") || strings.Contains(body, `class="error"`), body)
}

// A viewer opens the Endpoints page from the navigation and sees each
// endpoint's state in words, the disabled first (by whom, since when, in
// a colour of their own), then those not closed, in colours that differ;
// the counts, times, reasons and notes; the events, newest first; no
// secret of a reason; and a writer's markup as text. A job whose endpoint
// is open says until when on its page, with a link to the endpoints, and
// in the jobs list; a job whose endpoint is disabled says it will be dead
// when claimed.
func TestBrowserEndpoints(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.breakEndpoints(t)
	b.disableEndpoints(t)
	// An endpoint no URL makes, written by the same function as the
	// workers' outcomes: markup and an escape in its name and reason.
	b.exec(t, `SELECT {schema}.record_endpoint_outcomes(ARRAY[$1], ARRAY[4], ARRAY[4], ARRAY[$1],
		interval '1 minute', 4, 0.5, interval '1 hour')`, hostile)
	job := b.queryInt(t, `INSERT INTO {jobs} (queue, kind, payload) VALUES ('hooks', 'http_callback',
		'{"url": "https://down.example.com/hook?token=abc12345", "data": {}}') RETURNING id`)
	gone := b.queryInt(t, `INSERT INTO {jobs} (queue, kind, payload) VALUES ('hooks', 'http_callback',
		'{"url": "https://gone.example.com/hook", "data": {}}') RETURNING id`)
	b.exec(t, `INSERT INTO {jobs} (queue, kind, payload) VALUES ('hooks', 'http_callback', '{"url": "https://a-healthy.example.com/x", "data": {}}')`)

	br := newBrowser(t, "vic", viewerToken)
	br.do(t, "open the overview", chromedp.Navigate(b.url), chromedp.WaitVisible("#queues"))
	require.Equal(t, "2 endpoints disabled: their http_callback jobs are dead, unsent, when next claimed. "+
		"2 endpoints open, 1 half-open: their http_callback jobs wait, pending, without spending attempts.",
		br.eval(t, `document.querySelector('#endpoints-note').innerText`))
	br.do(t, "open the endpoints from the navigation", chromedp.Click(`header nav a[href="/endpoints"]`), chromedp.WaitVisible("#endpoints"))
	require.Equal(t, "/endpoints", br.eval(t, `window.location.pathname`))
	require.Equal(t, "Endpoints", br.eval(t, `document.querySelector('header nav a.here').textContent`))

	list := func(table, expr string) []string {
		t.Helper()
		var out []string
		require.NoError(t, json.Unmarshal([]byte(br.eval(t, `JSON.stringify(Array.from(document.querySelectorAll('#`+table+` tbody tr')).map(tr => `+expr+`))`)), &out))
		return out
	}
	require.Equal(t, []string{epOld, epGone, hostile, epFlaky, epDown, epHealthy, epBack}, list("endpoints", `tr.dataset.endpoint`),
		"the disabled first, then those not closed, then by name")
	require.Equal(t, []string{"disabled circuit open", "disabled circuit closed", "open", "half-open", "open", "closed", "closed"},
		list("endpoints", `tr.querySelector('[data-f="state"]').innerText`))
	require.Equal(t, []string{"0", "0", "0", "0", "0", "5", "0"}, list("endpoints", `tr.querySelector('[data-f="attempts"]').innerText`))
	require.Equal(t, []string{"0", "0", "0", "0", "0", "1", "0"}, list("endpoints", `tr.querySelector('[data-f="failures"]').innerText`))
	colours := list("endpoints", `getComputedStyle(tr.querySelector('.badge')).backgroundColor`)
	require.Equal(t, colours[0], colours[1], "disabled and disabled")
	require.Equal(t, colours[2], colours[4], "open and open")
	require.Equal(t, colours[5], colours[6], "closed and closed")
	require.Len(t, map[string]bool{colours[1]: true, colours[3]: true, colours[4]: true, colours[5]: true}, 4,
		"disabled, half-open, open and closed look different: %v", colours)

	row := func(endpoint, f string) string {
		t.Helper()
		return br.eval(t, `Array.from(document.querySelectorAll('#endpoints tbody tr')).find(tr => tr.dataset.endpoint === `+js(endpoint)+
			`).querySelector('[data-f="`+f+`"]').innerText`)
	}
	require.Equal(t, b.stamp(t, "opened_at", epDown), row(epDown, "opened"))
	require.Equal(t, b.stamp(t, "open_until", epDown)+" (cool-down 1h0m0s)", row(epDown, "until"))
	require.Equal(t, "probe until "+b.stamp(t, "probe_until", epFlaky)+" (cool-down 1µs)", row(epFlaky, "until"))
	require.Equal(t, "—", row(epHealthy, "until"))
	require.Equal(t, "— (no probe goes)", row(epOld, "until"))
	require.Equal(t, "by breaker since "+b.stamp(t, "disabled_at", epOld), row(epOld, "disabled"))
	require.Equal(t, "by operator since "+b.stamp(t, "disabled_at", epGone), row(epGone, "disabled"))
	require.Equal(t, "—", row(epBack, "disabled"), "enabled again")
	require.Equal(t, downNote, row(epDown, "note"))
	require.Contains(t, row(epDown, "reason"), "HTTP 503 Service Unavailable")
	main := br.eval(t, `document.querySelector('main').innerText`)
	require.Contains(t, main, "2 of 7 disabled: their jobs are dead, unsent, when next claimed.")
	require.Contains(t, main, "3 of 7 not closed")
	require.NotContains(t, br.eval(t, `document.documentElement.outerHTML`), reasonSecret)
	require.NotContains(t, br.eval(t, `document.documentElement.outerHTML`), eventSecret)

	shown := visible(hostile)
	require.Equal(t, shown, row(hostile, "endpoint"))
	require.Equal(t, shown, row(hostile, "reason"))
	require.Equal(t, visible(goneNote), row(epGone, "note"))

	// The events, newest first: hostile's opening is the newest.
	require.Equal(t, []string{"opened", "enabled", "disabled", "disabled", "disabled", "opened", "opened", "opened"},
		list("events", `tr.querySelector('[data-f="event"]').innerText`))
	require.Equal(t, []string{shown, epBack, epBack, epGone, epOld, epOld, epFlaky, epDown},
		list("events", `tr.querySelector('[data-f="endpoint"]').textContent`))
	role := b.queryString(t, `SELECT current_user::text`)
	require.Equal(t, []string{"breaker", "operator", "operator", "operator", "breaker", "breaker", "breaker", "breaker"},
		list("events", `tr.querySelector('[data-f="by"]').innerText.replace(' (`+role+`)', '')`))
	require.Equal(t, visible(goneNote), list("events", `tr.querySelector('[data-f="note"]').innerText`)[3])
	require.Equal(t, `POST https://old.example.net/hook: HTTP 502 Bad Gateway: {"password": "xxxxx"}`,
		list("events", `tr.querySelector('[data-f="reason"]').innerText`)[4])
	require.Equal(t, "0", br.eval(t, `String(document.querySelectorAll('main script, main img').length)`))
	br.screenshot(t, "endpoints")

	// The job of the open endpoint, on its page and in the list.
	until := b.stamp(t, "open_until", epDown)
	br.do(t, "open the held job", chromedp.Navigate(fmt.Sprintf("%sjobs/%d", b.url, job)), chromedp.WaitVisible("#endpoint-held"))
	require.Equal(t, "endpoint "+epDown+" open until "+until+" UTC: its jobs wait, pending, without spending attempts; then one probe goes",
		br.eval(t, `document.querySelector('#endpoint-held').innerText`))
	br.screenshot(t, "job-endpoint")
	br.do(t, "follow its link", chromedp.Click(`#endpoint-held a`), chromedp.WaitVisible("#endpoints"))
	require.Equal(t, "/endpoints", br.eval(t, `window.location.pathname`))

	// The job of the disabled endpoint.
	br.do(t, "open the job of the disabled endpoint", chromedp.Navigate(fmt.Sprintf("%sjobs/%d", b.url, gone)), chromedp.WaitVisible("#endpoint-held"))
	require.Equal(t, "endpoint "+epGone+" disabled by operator since "+b.stamp(t, "disabled_at", epGone)+
		" UTC: this job will be dead, unsent, when it is next claimed, unless the endpoint is enabled first (pgdispatch endpoints enable "+epGone+")",
		br.eval(t, `document.querySelector('#endpoint-held').innerText`))

	br.do(t, "open the queue's jobs", chromedp.Navigate(b.url+"jobs?queue=hooks"), chromedp.WaitVisible("#rows"))
	require.Equal(t, "endpoint open until "+until, br.eval(t, `document.querySelector('#rows tr[data-id="`+fmt.Sprint(job)+`"] .held').innerText`))
	require.Equal(t, "endpoint disabled: dead when claimed", br.eval(t, `document.querySelector('#rows tr[data-id="`+fmt.Sprint(gone)+`"] .held').innerText`))
	require.Equal(t, "2", br.eval(t, `String(document.querySelectorAll('#rows .held').length)`), "the healthy endpoint's job holds no line")
	br.noIncidents(t)
}

// An operator types a note on an endpoint's row and disables it: the page
// comes back saying so, the endpoint first, disabled, with the note, and
// the event on top; its enable button closes its circuit.
func TestBrowserEndpointActions(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.breakEndpoints(t)
	br := newBrowser(t, "ann", operatorToken)
	br.do(t, "open the endpoints", chromedp.Navigate(b.url+"endpoints"), chromedp.WaitVisible("#endpoints"))
	down := `#endpoints tr[data-endpoint="` + epDown + `"]`
	br.do(t, "disable epDown with a note",
		chromedp.SetValue(down+` input[name="note"]`, "ask payments"),
		chromedp.Click(down+` button[value="disable"]`),
		chromedp.WaitVisible("#confirm"))
	require.Equal(t, "Disable the endpoint "+epDown+"?", br.eval(t, `document.querySelector('#question').textContent`))
	br.do(t, "confirm", chromedp.Click("#confirm"), chromedp.WaitVisible(".flash"))
	require.Equal(t, "endpoint "+epDown+": disabled; its jobs are dead, unsent, when next claimed, until it is enabled",
		br.eval(t, `document.querySelector('.flash').textContent`))
	require.Equal(t, epDown, br.eval(t, `document.querySelector('#endpoints tbody tr').dataset.endpoint`), "the disabled first")
	require.Equal(t, "disabled circuit open", br.eval(t, `document.querySelector('`+down+` [data-f="state"]').innerText`))
	require.Equal(t, "ask payments", br.eval(t, `document.querySelector('`+down+` [data-f="note"]').innerText`))
	require.Equal(t, "ask payments", br.eval(t, `document.querySelector('`+down+` input[name="note"]').value`))
	require.Equal(t, "disabled operator", br.eval(t, `(tr => tr.querySelector('[data-f="event"]').innerText + ' ' + tr.querySelector('[data-f="by"]').firstChild.textContent.trim())(document.querySelector('#events tbody tr'))`))

	br.do(t, "enable it", chromedp.Click(down+` button[value="enable"]`))
	br.waitFor(t, "the page after enable", `document.querySelector('.flash')?.textContent.includes(': enabled;')`)
	require.Equal(t, "closed", br.eval(t, `document.querySelector('`+down+` [data-f="state"]').innerText`))
	require.Equal(t, "enabled", br.eval(t, `document.querySelector('#events tbody tr [data-f="event"]').innerText`))
	br.noIncidents(t)
}
