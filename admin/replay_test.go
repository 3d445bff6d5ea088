package admin_test

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/admin"
	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/executors/httpcallback"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/wait"
	"github.com/pgdispatch/pgdispatch/internal/testkit/workertest"
)

// deadJob inserts a dead job of kind with payload that died at finished
// (set by an UPDATE, as a worker sets it), and returns its id.
func deadJob(t *testing.T, schema, kind, payload string, finished time.Time) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	var id int64
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "INSERT INTO "+jobs+
		" (kind, payload, status, attempts, max_attempts, last_error) VALUES ($1, $2, 'dead', 3, 3, 'refused') RETURNING id",
		kind, payload).Scan(&id))
	_, err := pgtest.Pool(t).Exec(ctx, "UPDATE "+jobs+" SET finished_at = $2 WHERE id = $1", id, finished)
	require.NoError(t, err)
	return id
}

// allJobs reads every job by id.
func allJobs(t *testing.T, a *admin.Admin) map[int64]admin.Job {
	t.Helper()
	jobs, err := a.List(context.Background(), admin.Filter{Limit: 100000})
	require.NoError(t, err)
	out := map[int64]admin.Job{}
	for _, j := range jobs {
		out[j.ID] = j
	}
	return out
}

// A replay by host and window retries exactly the dead http_callback jobs
// whose url names the host (any case; its port when the filter has one) and
// that died in the window, Since inclusive and Until exclusive. Jobs of
// other hosts, other kinds, other statuses, outside the window, or whose url
// does not parse are left as they are, and the dry run counts what the
// retry then does.
func TestRetryDeadMatching(t *testing.T) {
	t.Parallel()
	a, schema, exec := setup(t)
	ctx := context.Background()
	until := time.Now().Add(-time.Hour).Truncate(time.Second).UTC()
	since := until.Add(-time.Hour)
	in := since.Add(30 * time.Minute)
	cb := httpcallback.Kind
	job := func(payload string, finished time.Time) int64 { return deadJob(t, schema, cb, payload, finished) }

	// hooks.example.com:8443, the receiver with a port.
	atSince := job(`{"url": "https://hooks.example.com:8443/a"}`, since)
	inWindow := job(`{"url": "https://hooks.example.com:8443/b", "data": {"n": 1}}`, in)
	upper := job(`{"url": "https://HOOKS.Example.com:8443/c"}`, until.Add(-time.Microsecond))
	atUntil := job(`{"url": "https://hooks.example.com:8443/d"}`, until)
	before := job(`{"url": "https://hooks.example.com:8443/e"}`, since.Add(-time.Microsecond))
	otherPort := job(`{"url": "https://hooks.example.com/f"}`, in)
	// API.Example.COM, the receiver with upper case in its urls.
	apiUpper := job(`{"url": "http://API.Example.COM/hook"}`, in)
	apiKey := job(`{"URL": "https://api.example.com/x"}`, in) // encoding/json, and so the executor, reads URL as url
	apiUser := job(`{"url": "http://bob:secret@api.example.com:80/y"}`, in)
	apiLater := job(`{"url": "http://api.example.com/z"}`, until.Add(time.Minute))
	job(`{"url": "http://api.example.com.evil.test/"}`, in)
	ipv6 := job(`{"url": "http://[::1]:9000/"}`, in)
	// Urls that do not parse as the executor reads them.
	for _, p := range []string{
		`{"url": "not a url"}`, `{"url": 5}`, `"https://api.example.com/"`, `{"url": "ftp://api.example.com/"}`,
		`{"url": "http://[::1"}`, `{"url": ""}`, `{}`, `[{"url": "https://api.example.com/"}]`,
	} {
		job(p, in)
	}
	// Not dead http_callback jobs.
	email := deadJob(t, schema, "email", `{"url": "https://api.example.com/"}`, in)
	exec(`INSERT INTO {jobs} (kind, payload, status, finished_at) VALUES
		($1, '{"url": "https://api.example.com/"}', 'done', $2), ($1, '{"url": "https://api.example.com/"}', 'cancelled', $2)`, cb, in)
	exec(`INSERT INTO {jobs} (kind, payload) VALUES ($1, '{"url": "https://api.example.com/"}')`, cb)

	for _, c := range []struct {
		host string
		want []int64
	}{
		{"hooks.example.com:8443", []int64{atSince, inWindow, upper}},
		{"hooks.example.com", []int64{atSince, inWindow, upper, otherPort}},
		{"hooks.example.com:443", []int64{otherPort}},
		{"api.example.com", []int64{apiUpper, apiKey, apiUser}},
		{"API.EXAMPLE.COM:80", []int64{apiUpper, apiUser}},
		{"api.example.com:443", []int64{apiKey}},
		{"[::1]:9000", []int64{ipv6}},
		{"::1", []int64{ipv6}},
		{"[::1]", []int64{ipv6}},
		{"example.com", nil},
	} {
		got, err := a.CountDead(ctx, admin.DeadFilter{Host: c.host, Since: since, Until: until}, 10)
		require.NoError(t, err, c.host)
		require.Equal(t, admin.DeadCount{Count: int64(len(c.want)), FirstIDs: c.want}, got, c.host)
	}
	got, err := a.CountDead(ctx, admin.DeadFilter{Host: "api.example.com", Kind: cb}, 1)
	require.NoError(t, err)
	require.Equal(t, admin.DeadCount{Count: 4, FirstIDs: []int64{apiUpper}}, got, "no window; the first id only")
	got, err = a.CountDead(ctx, admin.DeadFilter{Kind: "email", Since: since}, 5)
	require.NoError(t, err)
	require.Equal(t, admin.DeadCount{Count: 1, FirstIDs: []int64{email}}, got)
	got, err = a.CountDead(ctx, admin.DeadFilter{Since: since, Until: until}, 2)
	require.NoError(t, err)
	require.Equal(t, admin.DeadCount{Count: 18, FirstIDs: []int64{atSince, inWindow}}, got, "every dead job of the window, any url")

	// The replays: what the dry run counted becomes pending, and nothing else
	// changes.
	for _, c := range []struct {
		f    admin.DeadFilter
		want []int64
	}{
		{admin.DeadFilter{Host: "Hooks.Example.com:8443", Since: since, Until: until}, []int64{atSince, inWindow, upper}},
		{admin.DeadFilter{Host: "api.example.com", Kind: cb, Since: since, Until: until}, []int64{apiUpper, apiKey, apiUser}},
	} {
		before := allJobs(t, a)
		count, err := a.CountDead(ctx, c.f, 0)
		require.NoError(t, err)
		require.Empty(t, count.FirstIDs)
		require.Equal(t, before, allJobs(t, a), "the dry run changes nothing")

		n, err := a.RetryDeadMatching(ctx, c.f)
		require.NoError(t, err)
		require.Equal(t, count.Count, n, "the dry run counts what the retry retries")
		require.Equal(t, int64(len(c.want)), n)
		after := allJobs(t, a)
		for id, j := range after {
			if !slices.Contains(c.want, id) {
				require.Equal(t, before[id], j, "job %d is left as it was", id)
				continue
			}
			require.Equal(t, "pending", j.Status, "job %d", id)
			require.Nil(t, j.FinishedAt)
			require.Equal(t, int32(4), *j.MaxAttempts, "one more attempt")
			require.Equal(t, "refused", *j.LastError, "the last failure is kept")
		}
		again, err := a.CountDead(ctx, c.f, 10)
		require.NoError(t, err)
		require.Zero(t, again.Count)
	}
	for _, id := range []int64{atUntil, before, otherPort, apiLater, email} {
		j, err := a.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, "dead", j.Status, "job %d", id)
	}
}

// A filter Admin cannot apply is refused before any statement, with an error
// that names the field.
func TestDeadFilterValidate(t *testing.T) {
	t.Parallel()
	now := time.Now()
	for _, c := range []struct {
		f   admin.DeadFilter
		err string
	}{
		{admin.DeadFilter{Host: "api.example.com", Kind: "email"}, `host selects http_callback jobs: it cannot go with kind "email"`},
		{admin.DeadFilter{Host: "https://api.example.com/"}, "not a URL"},
		{admin.DeadFilter{Host: "api.example.com/hook"}, "not a URL"},
		{admin.DeadFilter{Host: "bob@api.example.com"}, "not a URL"},
		{admin.DeadFilter{Host: "api.example.com:0"}, `port "0"`},
		{admin.DeadFilter{Host: "api.example.com:65536"}, `port "65536"`},
		{admin.DeadFilter{Host: "api.example.com:http"}, `port "http"`},
		{admin.DeadFilter{Host: ":8080"}, "want a host name"},
		{admin.DeadFilter{Host: "[::1"}, "want a host name"},
		{admin.DeadFilter{Since: now, Until: now}, "must be before until"},
		{admin.DeadFilter{Since: now, Until: now.Add(-time.Second)}, "must be before until"},
	} {
		require.ErrorContains(t, c.f.Validate(), c.err, "%+v", c.f)
	}
	for _, f := range []admin.DeadFilter{
		{},
		{Host: "api.example.com", Kind: httpcallback.Kind},
		{Host: "API.example.com:8443"},
		{Host: "[::1]:80"},
		{Host: "::1"},
		{Host: "127.0.0.1"},
		{Since: now},
		{Until: now},
		{Since: now, Until: now.Add(time.Microsecond)},
	} {
		require.NoError(t, f.Validate(), "%+v", f)
	}
	a, _, _ := setup(t)
	_, err := a.CountDead(context.Background(), admin.DeadFilter{Host: "x", Kind: "email"}, 1)
	require.ErrorContains(t, err, "cannot go with kind")
	_, err = a.RetryDeadMatching(context.Background(), admin.DeadFilter{Host: "x/"})
	require.ErrorContains(t, err, "not a URL")
}

// A replay of more than a batch while a worker runs: every matching job is
// delivered, once, to the receiver that was down; the receiver's other jobs
// (another host name for it, outside the window) are not.
func TestRetryDeadMatchingDeliversWhileWorkerRuns(t *testing.T) {
	t.Parallel()
	var (
		mu        sync.Mutex
		delivered = map[int64]int{}
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.ParseInt(r.Header.Get("Pgdispatch-Job-Id"), 10, 64)
		if err != nil {
			t.Errorf("receiver: job id %q: %v", r.Header.Get("Pgdispatch-Job-Id"), err)
		}
		mu.Lock()
		delivered[id]++
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	exec, err := httpcallback.New(httpcallback.Config{AllowNetworks: []string{httpcallback.NetworksLoopback}}) // the receiver is on this machine
	require.NoError(t, err)
	reg := executors.NewRegistry()
	reg.Register(httpcallback.Kind, exec)
	schema := workertest.Start(t, "replay-test", reg)
	a := admin.New(pgtest.Pool(t), schema, 10*time.Second)
	ctx := context.Background()
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()

	u, err := url.Parse(srv.URL)
	require.NoError(t, err)
	asLocalhost := "http://localhost:" + u.Port() + "/hook" // the same receiver by another name
	until := time.Now().Add(-time.Minute).UTC()
	since := until.Add(-time.Hour)
	payload := func(target string) string {
		b, err := json.Marshal(map[string]any{"url": target, "data": map[string]int{"n": 1}})
		require.NoError(t, err)
		return string(b)
	}
	const matching = 2500
	_, err = pgtest.Pool(t).Exec(ctx, `INSERT INTO `+jobs+` (kind, payload, status, attempts, max_attempts, last_error, finished_at)
		SELECT $1, $2::jsonb, 'dead', 1, 1, 'connection refused', $3::timestamptz + i * interval '1 second'
		FROM generate_series(1, $4) i`, httpcallback.Kind, payload(srv.URL+"/hook"), since, matching)
	require.NoError(t, err)
	others := []int64{
		deadJob(t, schema, httpcallback.Kind, payload(asLocalhost), since.Add(time.Minute)),
		deadJob(t, schema, httpcallback.Kind, payload(srv.URL+"/hook"), until),
		deadJob(t, schema, httpcallback.Kind, payload(srv.URL+"/hook"), since.Add(-time.Second)),
	}
	f := admin.DeadFilter{Host: u.Host, Since: since, Until: until}

	count, err := a.CountDead(ctx, f, 3)
	require.NoError(t, err)
	require.Equal(t, int64(matching), count.Count)
	n, err := a.RetryDeadMatching(ctx, f)
	require.NoError(t, err)
	require.Equal(t, int64(matching), n, "more than one batch")

	wait.For(t, 2*time.Minute, "the retried jobs to be done", func() bool {
		var done int
		err := pgtest.Pool(t).QueryRow(ctx, "SELECT count(*) FROM "+jobs+" WHERE status = 'done'").Scan(&done)
		return err == nil && done == matching
	})
	var wrong []int64
	rows, _ := pgtest.Pool(t).Query(ctx, "SELECT id FROM "+jobs+" WHERE status = 'done' AND (finished_at IS NULL OR attempts <> 2)")
	wrong, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)
	require.Empty(t, wrong, "each done with its one more attempt")

	mu.Lock()
	got := maps.Clone(delivered)
	mu.Unlock()
	require.Len(t, got, matching)
	for id, times := range got {
		require.Equal(t, 1, times, "job %d delivered once", id)
		require.NotContains(t, others, id)
	}
	for _, id := range others {
		j, err := a.Get(ctx, id)
		require.NoError(t, err)
		require.Equal(t, "dead", j.Status)
	}
}

// A batch skips the rows another transaction holds, and does not wait for
// them.
func TestRetryDeadMatchingSkipsLockedRows(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, schema, _ := setup(t)
	now := time.Now()
	held := deadJob(t, schema, httpcallback.Kind, `{"url": "https://hooks.example.com/"}`, now)
	free := deadJob(t, schema, httpcallback.Kind, `{"url": "https://hooks.example.com/"}`, now)

	locker, err := pgtest.Conn(t).Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = locker.Rollback(context.Background()) }()
	_, err = locker.Exec(ctx, "SELECT id FROM "+pgx.Identifier{schema, "jobs"}.Sanitize()+" WHERE id = $1 FOR UPDATE", held)
	require.NoError(t, err)

	a := admin.New(pgtest.Pool(t), schema, 2*time.Second) // a wait for the lock would time out
	n, err := a.RetryDeadMatching(ctx, admin.DeadFilter{Host: "hooks.example.com"})
	require.NoError(t, err)
	require.Equal(t, int64(1), n)
	j, err := a.Get(ctx, free)
	require.NoError(t, err)
	require.Equal(t, "pending", j.Status)
	j, err = a.Get(ctx, held)
	require.NoError(t, err)
	require.Equal(t, "dead", j.Status)
}
