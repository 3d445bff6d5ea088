package console

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"net/url"
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
	form.Set("csrf", b.srv.csrfToken(user{Name: "ann", role: operator}))
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, err := http.NewRequest("POST", b.url+path[1:], strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth("ann", operatorToken)
	resp, err := client.Do(req)
	require.NoError(t, err)
	_ = resp.Body.Close()
	code := resp.StatusCode
	loc, err := url.Parse(resp.Header.Get("Location"))
	require.NoError(t, err)
	return code, loc.Query().Get("msg")
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
	code, msg := b.post(t, "/actions/bulk", url.Values{"action": {"cancel"}, "filter": {"queue=q&status=pending"}})
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
	_, msg = b.post(t, "/actions/jobs", url.Values{"action": {"delete"}, "id": {"6"}, "back": {"/jobs/6"}})
	require.Equal(t, "deleted 1 job", msg)
	require.Equal(t, "gone", status(6))
	_, msg = b.post(t, "/actions/jobs", url.Values{"action": {"delete"}, "id": {"4"}})
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

// Secrets show only to an operator who asks, and the asking is logged.
func TestReveal(t *testing.T) {
	t.Parallel()
	core, logs := observer.New(zap.InfoLevel)
	b := setup(t, Config{Logger: zap.New(core)})
	b.exec(t, `INSERT INTO {jobs} (queue, kind, payload) VALUES ('q', 'http_callback', '{"headers": {"Authorization": "Bearer s3cr3t-value"}}')`)
	_, body := b.request(t, "GET", "/jobs/1", "ann", operatorToken, nil, nil)
	require.NotContains(t, body, "s3cr3t-value")
	require.Contains(t, body, "Reveal them")
	_, body = b.request(t, "GET", "/jobs/1?reveal=1", "vic", viewerToken, nil, nil)
	require.NotContains(t, body, "s3cr3t-value", "a viewer may not reveal")
	require.Zero(t, logs.Len())
	_, body = b.request(t, "GET", "/jobs/1?reveal=1", "ann", operatorToken, nil, nil)
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
