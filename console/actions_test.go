package console

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgdispatch/pgdispatch/admin"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

// post sends an operator's form, with the CSRF token of the operator's
// pages, and returns the status and the message the page would show.
func (b *bundle) post(t *testing.T, path string, form url.Values) (int, string) {
	t.Helper()
	code, loc := b.postLocation(t, path, form)
	return code, loc.Query().Get("msg")
}

// postLocation sends an operator's form as post does, and returns the
// status and where the console sends the browser.
func (b *bundle) postLocation(t *testing.T, path string, form url.Values) (int, *url.URL) {
	t.Helper()
	form.Set("csrf", b.srv.csrfToken(user{Name: "ann", role: operator}))
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, err := http.NewRequest("POST", b.url+path[1:], strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth("ann", operatorToken)
	resp, err := client.Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	loc, err := url.Parse(resp.Header.Get("Location"))
	require.NoError(t, err)
	return resp.StatusCode, loc
}

// postPage sends an operator's form as post does, and returns the status
// and the page that comes back.
func (b *bundle) postPage(t *testing.T, path string, form url.Values) (int, string) {
	t.Helper()
	form.Set("csrf", b.srv.csrfToken(user{Name: "ann", role: operator}))
	return b.request(t, "POST", path, "ann", operatorToken, form, nil)
}

// The actions on one job, on a selection and on everything a filter
// selects, and on queues and schedules, change the rows as the commands
// do, and are logged with who did them.
func TestActions(t *testing.T) {
	t.Parallel()
	core, logs := observer.New(zap.InfoLevel)
	b := setup(t, Config{Logger: zap.New(core)})
	b.exec(t, `INSERT INTO {jobs} (queue, kind, status, locked_by, locked_until, finished_at)
		SELECT 'q', 'k', s, CASE WHEN s = 'running' THEN 'w' END, CASE WHEN s = 'running' THEN now() + interval '1 minute' END,
		       CASE WHEN s IN ('done', 'dead') THEN now() END
		FROM unnest(array['pending', 'pending', 'pending', 'running', 'done', 'dead']) s`)
	status := func(id int) string {
		return b.queryString(t, `SELECT coalesce(max(status), 'gone') FROM {jobs} WHERE id = $1`, id)
	}

	// Everything a filter selects: the count first, then the action.
	code, body := b.request(t, "GET", "/bulk?action=cancel&status=pending&queue=q", "ann", operatorToken, nil, nil)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `id="count">3<`)
	code, msg := b.post(t, "/actions/bulk", confirmForm(t, body))
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, "cancelled 3 jobs", msg)
	require.EqualValues(t, 3, b.queryInt(t, `SELECT count(*) FROM {jobs} WHERE status = 'cancelled'`))

	// A selection: retry the cancelled 1 and 2, and the done 5, which is
	// left.
	_, msg = b.post(t, "/actions/jobs", url.Values{"action": {"retry"}, "id": {"1", "2", "5"}})
	require.Equal(t, "retried 2 jobs; 1 left as they were (not dead or cancelled, or gone)", msg)
	require.Equal(t, "pending", status(1))
	require.Equal(t, "done", status(5))

	// One job: snooze, delete.
	_, msg = b.post(t, "/actions/jobs", url.Values{"action": {"snooze"}, "id": {"1"}, "for": {"2h"}})
	require.Equal(t, "snoozed 1 job", msg)
	require.EqualValues(t, 1, b.queryInt(t, `SELECT count(*) FROM {jobs} WHERE id = 1 AND run_at > now() + interval '1 hour'`))
	// A delete is asked again first, on a page whose form posts it
	// confirmed.
	code, page := b.postPage(t, "/actions/jobs", url.Values{"action": {"delete"}, "id": {"6"}, "back": {"/jobs/6"}})
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, page, `id="question">Delete 1 job?<`)
	require.Contains(t, page, `id="list">Jobs 6.<`)
	require.Equal(t, "dead", status(6), "not deleted before it is confirmed")
	code, to := b.postLocation(t, "/actions/jobs", confirmForm(t, page))
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, "/jobs", to.Path, "the job's page is gone")
	require.Equal(t, "deleted 1 job", to.Query().Get("msg"))
	require.Equal(t, "gone", status(6))
	_, msg = b.post(t, "/actions/jobs", url.Values{"action": {"delete"}, "id": {"4"}, "confirmed": {"yes"}})
	require.Contains(t, msg, "deleted 0 jobs; 1 left")
	require.Equal(t, "running", status(4))

	// Queues and schedules.
	_, msg = b.post(t, "/actions/queues", url.Values{"action": {"pause"}, "name": {"q"}})
	require.Equal(t, `queue "q": paused`, msg)
	_, err := b.srv.admin.Declare(context.Background(), admin.ScheduleSpec{Name: "nightly", Cron: "@daily", Kind: "noop"})
	require.NoError(t, err)
	_, msg = b.post(t, "/actions/schedules", url.Values{"action": {"pause"}, "name": {"nightly"}, "back": {"/schedules"}})
	require.Equal(t, `schedule "nightly": paused`, msg)
	require.Equal(t, "false", b.queryString(t, `SELECT enabled::text FROM {schema}.schedules WHERE name = 'nightly'`))
	_, msg = b.post(t, "/actions/schedules", url.Values{"action": {"resume"}, "name": {"nightly"}})
	require.Equal(t, `schedule "nightly": resumed`, msg)
	code, body = b.request(t, "GET", "/schedules", "vic", viewerToken, nil, nil)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "nightly")

	// Who did each.
	actions := logs.FilterMessage("console action").All()
	require.Len(t, actions, 8)
	for _, e := range actions {
		require.Equal(t, "ann", e.ContextMap()["who"])
	}
	require.Equal(t, "cancel matching", actions[0].ContextMap()["action"])
}

// Secrets show only to an operator who asks with a POST from the job's
// page (its CSRF token, the console's origin), and the asking is logged.
func TestReveal(t *testing.T) {
	t.Parallel()
	core, logs := observer.New(zap.InfoLevel)
	b := setup(t, Config{Logger: zap.New(core)})
	b.exec(t, `INSERT INTO {jobs} (queue, kind, payload) VALUES ('q', 'http_callback', '{"headers": {"Authorization": "Bearer s3cr3t-value"}}')`)
	_, body := b.request(t, "GET", "/jobs/1", "ann", operatorToken, nil, nil)
	require.NotContains(t, body, "s3cr3t-value")
	require.Contains(t, body, `<form method="post" action="/jobs/1/reveal"`)
	_, body = b.request(t, "GET", "/jobs/1", "vic", viewerToken, nil, nil)
	require.NotContains(t, body, "/reveal", "a viewer is offered no reveal")
	_, body = b.request(t, "GET", "/jobs/1?reveal=1", "ann", operatorToken, nil, nil)
	require.NotContains(t, body, "s3cr3t-value", "a link reveals nothing")

	reveal := func(name, token string, u user, header http.Header) (int, string) {
		return b.request(t, "POST", "/jobs/1/reveal", name, token, url.Values{"csrf": {b.srv.csrfToken(u)}}, header)
	}
	code, body := reveal("vic", viewerToken, user{Name: "vic", role: viewer}, nil)
	require.Equal(t, http.StatusForbidden, code, "a viewer may not reveal")
	require.NotContains(t, body, "s3cr3t-value")
	code, _ = b.request(t, "POST", "/jobs/1/reveal", "ann", operatorToken, url.Values{}, nil)
	require.Equal(t, http.StatusForbidden, code, "no CSRF token")
	code, _ = reveal("ann", operatorToken, user{Name: "ann", role: operator}, http.Header{"Sec-Fetch-Site": {"cross-site"}})
	require.Equal(t, http.StatusForbidden, code, "from another site")
	require.Zero(t, logs.Len())
	code, body = reveal("ann", operatorToken, user{Name: "ann", role: operator}, nil)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "s3cr3t-value")
	require.Equal(t, 1, logs.FilterField(zap.String("action", "reveal")).Len())
}

// A console on a role that may only read shows the pages, and its actions
// fail with the database's refusal.
func TestReadOnlyRole(t *testing.T) {
	t.Parallel()
	r := make([]byte, 4)
	_, _ = rand.Read(r)
	role := "pgdt_" + hex.EncodeToString(r) + "_reader"
	b := setup(t, Config{}, func(pc *pgxpool.Config) { pc.ConnConfig.RuntimeParams["role"] = role })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ident, schema := pgx.Identifier{role}.Sanitize(), pgx.Identifier{b.schema}.Sanitize()
	_, err := pgtest.Pool(t).Exec(ctx, "CREATE ROLE "+ident+" NOLOGIN; GRANT "+ident+" TO current_user; "+
		"GRANT USAGE ON SCHEMA "+schema+" TO "+ident+"; GRANT SELECT ON ALL TABLES IN SCHEMA "+schema+" TO "+ident)
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := pgtest.Pool(t).Exec(ctx, "DROP OWNED BY "+ident+"; DROP ROLE "+ident)
		require.NoError(t, err)
	})
	b.exec(t, `INSERT INTO {jobs} (queue, kind, status, finished_at) VALUES ('q', 'k', 'dead', now())`)

	code, body := b.request(t, "GET", "/jobs?status=dead", "ann", operatorToken, nil, nil)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `data-id="1"`)
	_, msg := b.post(t, "/actions/jobs", url.Values{"action": {"retry"}, "id": {"1"}})
	require.Contains(t, msg, "could not retry jobs")
	require.Contains(t, msg, "permission denied")
	require.Equal(t, "dead", b.queryString(t, `SELECT status FROM {jobs}`))
}

// bulkLink is the href of the jobs page's "All matching the filter" link
// of action, as a browser would follow it.
func bulkLink(t *testing.T, page, action string) string {
	t.Helper()
	m := regexp.MustCompile(`href="(/bulk\?[^"]*)"`).FindAllStringSubmatch(page, -1)
	for _, l := range m {
		link := html.UnescapeString(l[1])
		u, err := url.Parse(link)
		require.NoError(t, err)
		if u.Query().Get("action") == action {
			return link
		}
	}
	t.Fatalf("no link to %s every job on the page", action)
	return ""
}

// confirmForm is the confirmation page's form, as the browser would post
// it.
func confirmForm(t *testing.T, page string) url.Values {
	t.Helper()
	form := url.Values{}
	for _, m := range regexp.MustCompile(`<input type="hidden" name="([^"]+)" value="([^"]*)">`).FindAllStringSubmatch(page, -1) {
		if m[1] != "csrf" {
			form.Add(m[1], html.UnescapeString(m[2]))
		}
	}
	require.NotEmpty(t, form.Get("action"), "the page has a confirmation form")
	return form
}

// The jobs page's "All matching the filter" links carry its filter: the
// confirmation they open counts what the list shows and names the filter,
// and "Yes" acts on those jobs only. A filter key the console does not
// know is refused, not ignored.
func TestBulkLinkKeepsTheFilter(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.exec(t, `INSERT INTO {jobs} (queue, kind, status, finished_at) VALUES ('q', 'k', 'dead', now())`)
	b.exec(t, `INSERT INTO {jobs} (queue, kind) SELECT 'other', 'k' FROM generate_series(1, 20)`)
	_, body := b.request(t, "GET", "/jobs?queue=q&status=dead", "ann", operatorToken, nil, nil)
	require.Equal(t, 1, strings.Count(body, `<tr data-id=`), "the list shows the one dead job of q")
	link := bulkLink(t, body, "delete")
	code, confirm := b.request(t, "GET", link, "ann", operatorToken, nil, http.Header{"Sec-Fetch-Site": {"same-origin"}})
	require.Equal(t, http.StatusOK, code)
	t.Logf("link %s; the confirmation: %s", link, regexp.MustCompile(`<strong id="count">\d+</strong>`).FindString(confirm))
	require.Contains(t, confirm, `id="count">1<`)
	require.Contains(t, confirm, `<strong id="words">status dead; queue &#34;q&#34;</strong>`, "the filter in words")
	_, msg := b.post(t, "/actions/bulk", confirmForm(t, confirm))
	require.Equal(t, "deleted 1 job", msg)
	require.EqualValues(t, 20, b.queryInt(t, `SELECT count(*) FROM {jobs}`), "only the dead job of q is deleted")

	// The link as html/template used to escape it: one unknown key.
	_, confirm = b.request(t, "GET", "/bulk?action=delete&queue%3dq%26status%3ddead", "ann", operatorToken, nil, nil)
	require.Contains(t, confirm, `unknown filter &#34;queue=q&amp;status=dead&#34;`)
	require.NotContains(t, confirm, `id="confirm"`, "no form to confirm")
	_, msg = b.post(t, "/actions/bulk", url.Values{"action": {"delete"}, "filter": {"queue=q&bogus=1"}, "count": {"20"}, "max": {"21"}})
	require.Equal(t, `unknown filter "bogus"`, msg)
	_, body = b.request(t, "GET", "/jobs?qeueu=q", "ann", operatorToken, nil, nil)
	require.Contains(t, body, `unknown filter &#34;qeueu&#34;`)
	require.EqualValues(t, 20, b.queryInt(t, `SELECT count(*) FROM {jobs}`))
}

// "Yes" acts on the jobs counted, up to the highest id the count saw: jobs
// made after it are left, and when more jobs would change than the count
// showed (jobs that came to match), the console asks again.
func TestBulkBoundedByTheCount(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.exec(t, `INSERT INTO {jobs} (queue, kind, status, finished_at) VALUES ('q', 'k', 'dead', now())`)
	b.exec(t, `INSERT INTO {jobs} (queue, kind) SELECT 'q', 'k' FROM generate_series(1, 3)`)
	_, confirm := b.request(t, "GET", "/bulk?action=delete&queue=q&status=dead", "ann", operatorToken, nil, nil)
	require.Contains(t, confirm, `id="count">1<`)
	form := confirmForm(t, confirm)
	// meanwhile 50 more jobs fail in the queue
	b.exec(t, `INSERT INTO {jobs} (queue, kind, status, finished_at) SELECT 'q', 'k', 'dead', now() FROM generate_series(1, 50)`)
	_, msg := b.post(t, "/actions/bulk", form)
	t.Logf("confirmed on a count of 1: %q", msg)
	require.Equal(t, "deleted 1 job", msg)
	require.EqualValues(t, 53, b.queryInt(t, `SELECT count(*) FROM {jobs}`))

	// Jobs counted as pending die before "Yes": asked again.
	_, confirm = b.request(t, "GET", "/bulk?action=retry&queue=q&status=dead", "ann", operatorToken, nil, nil)
	require.Contains(t, confirm, `id="count">50<`)
	form = confirmForm(t, confirm)
	b.exec(t, `UPDATE {jobs} SET status = 'dead', finished_at = now() WHERE status = 'pending'`)
	code, loc := b.postLocation(t, "/actions/bulk", form)
	require.Equal(t, http.StatusSeeOther, code)
	t.Logf("asked again: %s", loc)
	require.Equal(t, "the filter selects 53 jobs now, not the 50 shown: confirm again", loc.Query().Get("msg"))
	require.Equal(t, "/bulk", loc.Path)
	require.EqualValues(t, 53, b.queryInt(t, `SELECT count(*) FROM {jobs} WHERE status = 'dead'`), "nothing retried")
	_, confirm = b.request(t, "GET", loc.String(), "ann", operatorToken, nil, nil)
	require.Contains(t, confirm, `id="count">53<`)
	require.Contains(t, confirm, "confirm again")
	_, msg = b.post(t, "/actions/bulk", confirmForm(t, confirm))
	require.Equal(t, "retried 53 jobs", msg)
}

// The list sorted by finished_at shows finished jobs only, and so does the
// confirmation of its "all matching" links, and the action.
func TestBulkFromSortedList(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.exec(t, `INSERT INTO {jobs} (queue, kind, status, finished_at) VALUES ('q', 'k', 'dead', now())`)
	b.exec(t, `INSERT INTO {jobs} (queue, kind) SELECT 'q', 'k' FROM generate_series(1, 3)`)
	_, body := b.request(t, "GET", "/jobs?queue=q&sort=finished_at", "ann", operatorToken, nil, nil)
	require.Equal(t, 1, strings.Count(body, `<tr data-id=`))
	link := bulkLink(t, body, "delete")
	_, confirm := b.request(t, "GET", link, "ann", operatorToken, nil, nil)
	t.Logf("the list shows 1 job; its delete link is %s; the confirmation says: %s", link,
		regexp.MustCompile(`<strong id="count">\d+</strong>`).FindString(confirm))
	require.Contains(t, confirm, `id="count">1<`, "the confirmation counts what the list showed")
	require.Contains(t, confirm, "finished (the list by finished_at)")
	_, msg := b.post(t, "/actions/bulk", confirmForm(t, confirm))
	require.Equal(t, "deleted 1 job", msg)
	require.EqualValues(t, 3, b.queryInt(t, `SELECT count(*) FROM {jobs} WHERE status = 'pending'`))
}

// A link from another site (a GET, which needs no CSRF token) opens no
// confirmation.
func TestBulkConfirmOnlyFromTheConsole(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	b.exec(t, `INSERT INTO {jobs} (queue, kind) SELECT 'billing', 'charge' FROM generate_series(1, 3)`)
	for _, site := range []string{"cross-site", "same-site"} {
		code, body := b.request(t, "GET", "/bulk?action=delete&queue=billing", "ann", operatorToken, nil,
			http.Header{"Sec-Fetch-Site": {site}, "Referer": {"https://evil.example/"}})
		t.Logf("a %s link: %d %s", site, code, strings.TrimSpace(body))
		require.Equal(t, http.StatusForbidden, code, site)
		require.NotContains(t, body, `name="filter"`, site)
	}
	for _, site := range []string{"same-origin", "none"} {
		code, body := b.request(t, "GET", "/bulk?action=delete&queue=billing", "ann", operatorToken, nil, http.Header{"Sec-Fetch-Site": {site}})
		require.Equal(t, http.StatusOK, code, site)
		require.Contains(t, body, `id="count">3<`, site)
		require.Contains(t, body, `queue &#34;billing&#34;`, "the page names the filter it confirms")
	}
}

// The "error has" filter searches last_error as stored, secrets included:
// a viewer, who sees it masked, may not use it (else they would read a
// secret back a character at a time from which rows match).
func TestErrorFilterForOperators(t *testing.T) {
	t.Parallel()
	b := setup(t, Config{})
	// a row that quotes its own payload's secret (written by another
	// writer): the console masks it
	b.exec(t, `INSERT INTO {jobs} (queue, kind, status, finished_at, payload, last_error) VALUES ('hooks', 'http_callback', 'dead', now(),
		'{"url":"https://example.com/h","headers":{"X-Api-Key":"k9Q2"}}', 'HTTP 401: unknown key k9Q2')`)
	_, page := b.request(t, "GET", "/jobs/1", "vic", viewerToken, nil, nil)
	require.NotContains(t, page, "k9Q2", "the job's page masks it")
	for _, path := range []string{"/jobs?error=unknown+key+k", "/jobs?error=unknown+key+k&fragment=1", "/bulk?action=delete&error=unknown+key+k"} {
		_, body := b.request(t, "GET", path, "vic", viewerToken, nil, nil)
		require.NotContains(t, body, `<tr data-id="1"`, path)
		require.NotContains(t, body, `id="count"`, path)
		if !strings.Contains(path, "fragment") {
			require.Contains(t, body, "the &#34;error has&#34; filter is for operators", path)
		}
	}
	_, body := b.request(t, "GET", "/jobs", "vic", viewerToken, nil, nil)
	require.NotContains(t, body, `name="error"`, "a viewer is not offered the filter")
	_, body = b.request(t, "GET", "/jobs?error=unknown+key+k", "ann", operatorToken, nil, nil)
	require.Contains(t, body, `<tr data-id="1"`, "an operator, who may reveal the secret, may search it")
}

// A confirmation names the first 20 jobs it would change, and counts the
// rest.
func TestConfirmationListsTheFirstJobs(t *testing.T) {
	t.Parallel()
	require.Equal(t, "7", idList([]int64{7}))
	ids := make([]int64, 25)
	for i := range ids {
		ids[i] = int64(i + 1)
	}
	require.Equal(t, "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20 and 5 more", idList(ids))
}
