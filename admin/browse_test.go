package admin_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/admin"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

func ids(jobs []admin.Job) []int64 {
	out := make([]int64, len(jobs))
	for i, j := range jobs {
		out[i] = j.ID
	}
	return out
}

// pages reads every page of f and returns the ids in the order read.
func pages(t *testing.T, a *admin.Admin, f admin.JobFilter) []int64 {
	t.Helper()
	var all []int64
	for range 100 {
		jobs, next, err := a.Page(context.Background(), f)
		require.NoError(t, err)
		all = append(all, ids(jobs)...)
		if next == nil {
			return all
		}
		// The cursor goes through a URL.
		f.After, err = admin.ParseCursor(next.String())
		require.NoError(t, err)
	}
	t.Fatal("more than 100 pages")
	return nil
}

// Keyset pages in each sort, either way, list every selected job once, in
// order.
func TestPages(t *testing.T) {
	t.Parallel()
	a, schema, exec := setup(t)
	// 30 jobs: ids 1..30, run_at and finished_at in the order opposite to
	// the ids, with ties; 20 pending, and 3 dead, 4 done and 3 cancelled;
	// two queues, two priorities.
	exec(`INSERT INTO {jobs} (queue, priority, kind, status, run_at, finished_at, last_error)
		SELECT CASE WHEN i % 2 = 0 THEN 'even' ELSE 'odd' END, (i / 5) % 2, 'k',
		       CASE WHEN i % 3 <> 0 THEN 'pending' WHEN i % 9 = 0 THEN 'dead' WHEN i % 9 = 3 THEN 'done' ELSE 'cancelled' END,
		       timestamptz '2026-01-01' - (i / 2) * interval '1 minute',
		       CASE WHEN i % 3 = 0 THEN timestamptz '2026-01-01' - (i / 4) * interval '1 second' END,
		       CASE WHEN i % 3 = 0 THEN 'Connection 100%_refused #' || i END
		FROM generate_series(1, 30) i`)
	all := pages(t, a, admin.JobFilter{Limit: 7})
	require.Len(t, all, 30)
	require.True(t, slices.IsSortedFunc(all, func(x, y int64) int { return int(y - x) }), "newest first: %v", all)

	for _, sort := range admin.Sorts {
		for _, asc := range []bool{false, true} {
			got := pages(t, a, admin.JobFilter{Sort: sort, Asc: asc, Limit: 4})
			one, _, err := a.Page(context.Background(), admin.JobFilter{Sort: sort, Asc: asc, Limit: 100})
			require.NoError(t, err)
			require.Equal(t, ids(one), got, "sort %s asc %v: the pages are the one long page cut up", sort, asc)
			want := map[string]int{"id": 30, "run_at": 20, "finished_at": 10}[sort] // pending, finished jobs only
			if sort == "finished_at" {
				got := pages(t, a, admin.JobFilter{Sort: sort, Asc: asc, Statuses: []string{"dead", "pending"}, Limit: 3})
				require.Len(t, got, 3, "the finished among the statuses")
			}
			require.Len(t, got, want, "sort %s", sort)
		}
	}

	// By run_at, the pages merge the queues' and priorities' into the
	// order of the table: without a filter (jobs_claim_idx's lanes), of a
	// kind (jobs_kind_idx's queues), of a kind and a queue (a range of
	// jobs_kind_idx), and with a filter no index checks (a time range).
	for _, c := range []struct {
		f    admin.JobFilter
		cond string
	}{
		{admin.JobFilter{}, "true"},
		{admin.JobFilter{Kind: "k"}, "kind = 'k'"},
		{admin.JobFilter{Kind: "k", Queue: "even"}, "kind = 'k' AND queue = 'even'"},
		{admin.JobFilter{TimeField: "created_at", Since: time.Unix(0, 0)}, "true"},
	} {
		for _, asc := range []bool{false, true} {
			dir := map[bool]string{false: " DESC", true: ""}[asc]
			rows, err := pgtest.Pool(t).Query(context.Background(), `SELECT id FROM `+pgx.Identifier{schema, "jobs"}.Sanitize()+
				` WHERE status = 'pending' AND `+c.cond+` ORDER BY run_at`+dir+`, id`+dir)
			require.NoError(t, err)
			want, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			require.NoError(t, err)
			require.NotEmpty(t, want)
			f := c.f
			f.Sort, f.Asc, f.Limit = "run_at", asc, 3
			require.Equal(t, want, pages(t, a, f), "%s, asc %v", c.cond, asc)
		}
	}

	// The filters.
	count := func(f admin.JobFilter) int {
		got := pages(t, a, f)
		n, maxID, err := a.Count(context.Background(), f)
		require.NoError(t, err)
		require.EqualValues(t, len(got), n, "Count agrees with the pages")
		if len(got) > 0 {
			require.Equal(t, slices.Max(got), maxID, "the highest id counted")
		}
		return len(got)
	}
	require.Equal(t, 3, count(admin.JobFilter{Statuses: []string{"dead"}}))
	require.Equal(t, 7, count(admin.JobFilter{Statuses: []string{"dead", "done"}}))
	require.Equal(t, 15, count(admin.JobFilter{Queue: "even"}))
	require.Equal(t, 1, count(admin.JobFilter{Queue: "even", Statuses: []string{"dead"}}))
	require.Equal(t, 0, count(admin.JobFilter{Kind: "other"}))
	require.Equal(t, 1, count(admin.JobFilter{ID: 7}))
	require.Equal(t, 7, count(admin.JobFilter{MaxID: 7}))
	require.Equal(t, 0, count(admin.JobFilter{Statuses: []string{"dead"}, Sort: "run_at"}), "by run_at, pending jobs only")
	require.Equal(t, 20, count(admin.JobFilter{Sort: "run_at"}))
	require.Equal(t, 3, count(admin.JobFilter{Statuses: []string{"dead", "pending"}, Sort: "finished_at"}))
	require.Equal(t, 10, count(admin.JobFilter{ErrorText: "connection 100%_REFUSED"}), "any case, % and _ literal")
	require.Equal(t, 0, count(admin.JobFilter{ErrorText: "100%%"}))
	require.Equal(t, 1, count(admin.JobFilter{ErrorText: "#27"}))
	since := time.Date(2025, 12, 31, 23, 55, 0, 0, time.UTC)
	require.Equal(t, 11, count(admin.JobFilter{TimeField: "run_at", Since: since}), "run_at at or after 23:55: i/2 <= 5")
	require.Equal(t, 19, count(admin.JobFilter{TimeField: "run_at", Until: since}))
	require.Len(t, pages(t, a, admin.JobFilter{TimeField: "run_at", Since: since, Sort: "run_at", Limit: 2}), 8, "the pending of them: i % 3 <> 0")
	require.Empty(t, pages(t, a, admin.JobFilter{Statuses: []string{"dead"}, Sort: "run_at"}), "by run_at, pending jobs only")

	_, _, err := a.Page(context.Background(), admin.JobFilter{Sort: "payload"})
	require.ErrorContains(t, err, `unknown sort "payload"`)
	_, _, err = a.Page(context.Background(), admin.JobFilter{TimeField: "payload", Since: since})
	require.ErrorContains(t, err, `unknown time field "payload"`)
	_, _, err = a.Page(context.Background(), admin.JobFilter{Statuses: []string{"lost"}})
	require.ErrorContains(t, err, `unknown status "lost"`)
	_, err = admin.ParseCursor("1.x")
	require.Error(t, err)
}

// EachMatching hands out every selected id once, in id order, in batches;
// Delete leaves running jobs.
func TestEachMatchingAndDelete(t *testing.T) {
	t.Parallel()
	a, _, exec := setup(t)
	exec(`INSERT INTO {jobs} (queue, kind, status, locked_by, locked_until)
		SELECT 'q', 'k', CASE WHEN i % 10 = 0 THEN 'running' ELSE 'pending' END,
		       CASE WHEN i % 10 = 0 THEN 'w' END, CASE WHEN i % 10 = 0 THEN now() + interval '1 minute' END
		FROM generate_series(1, 2500) i`)
	var got []int64
	batches := 0
	require.NoError(t, a.EachMatching(context.Background(), admin.JobFilter{Queue: "q"}, func(batch []int64) error {
		batches++
		require.LessOrEqual(t, len(batch), admin.BatchSize)
		got = append(got, batch...)
		return nil
	}))
	require.Len(t, got, 2500)
	require.True(t, slices.IsSorted(got))
	require.Equal(t, 3, batches)
	// As the list sorted by run_at shows them: the pending jobs only; and
	// none above MaxID.
	got = nil
	require.NoError(t, a.EachMatching(context.Background(), admin.JobFilter{Queue: "q", Sort: "run_at", MaxID: 1000}, func(batch []int64) error {
		got = append(got, batch...)
		return nil
	}))
	require.Len(t, got, 900)
	require.Equal(t, int64(999), got[len(got)-1])

	changes, err := a.Delete(context.Background(), []int64{9, 10, 11, 99999})
	require.NoError(t, err)
	require.Equal(t, []admin.Change{
		{ID: 9, Status: "pending", Changed: true},
		{ID: 10, Status: "running", Changed: false},
		{ID: 11, Status: "pending", Changed: true},
		{ID: 99999},
	}, changes)
}

// Live reads the queues, their lag and the workers in one statement.
func TestLive(t *testing.T) {
	t.Parallel()
	a, _, exec := setup(t)
	exec(`INSERT INTO {jobs} (queue, kind, status, run_at, locked_by, locked_until, finished_at) VALUES
		('a', 'k', 'pending', now() - interval '30 seconds', NULL, NULL, NULL),
		('a', 'k', 'pending', now() + interval '1 hour', NULL, NULL, NULL),
		('a', 'k', 'running', now(), 'w1', now() + interval '1 minute', NULL),
		('a', 'j', 'running', now(), 'w1', now() + interval '2 minutes', NULL),
		('b', 'k', 'running', now(), 'w2', now() + interval '1 minute', NULL),
		('b', 'k', 'done', now(), NULL, NULL, now()),
		('c', 'k', 'dead', now(), NULL, NULL, now() - interval '1 hour')`)
	_, err := a.Pause(context.Background(), "d")
	require.NoError(t, err)
	l, err := a.Live(context.Background())
	require.NoError(t, err)
	require.Len(t, l.Queues, 3, "a, b and the paused d; c has nothing active nor recent")
	qa, qb, qd := l.Queues[0], l.Queues[1], l.Queues[2]
	require.Equal(t, [4]int64{2, 1, 2, 0}, [4]int64{qa.Pending, qa.Due, qa.Running, qa.DoneLastMinute})
	require.NotNil(t, qa.OldestDueSeconds)
	require.InDelta(t, 30, *qa.OldestDueSeconds, 10)
	require.Equal(t, "b", qb.Queue)
	require.EqualValues(t, 1, qb.DoneLastMinute)
	require.Nil(t, qb.OldestDueSeconds)
	require.Equal(t, "d", qd.Queue)
	require.True(t, qd.Paused)
	require.Len(t, l.Workers, 2)
	require.Equal(t, "w1", l.Workers[0].Name)
	require.EqualValues(t, 2, l.Workers[0].Running)
	require.Len(t, l.Workers[0].Jobs, 2)
	require.Positive(t, l.MaxID)

	exec(`INSERT INTO {jobs} (queue, kind, status, finished_at) VALUES
		('b', 'k', 'dead', now()), ('b', 'k', 'done', now() - interval '10 minutes'), ('b', 'k', 'done', now() - interval '2 hours')`)
	hour, err := a.LastHour(context.Background())
	require.NoError(t, err)
	var done, dead int64
	for _, m := range hour {
		require.Equal(t, "b", m.Queue, "c's job died an hour ago, before the chart's first minute")
		done += m.Done
		dead += m.Dead
	}
	require.Equal(t, [2]int64{2, 1}, [2]int64{done, dead})
}

// A page's jobs carry no errors nor result, which a page does not show and
// a writer may fill with up to a megabyte a row; the payload and last_error
// are there. Get has them all.
func TestPagesReadNoHistory(t *testing.T) {
	t.Parallel()
	a, _, exec := setup(t)
	exec(`INSERT INTO {jobs} (queue, kind, status, payload, run_at, finished_at, last_error, errors, result)
		VALUES ('q', 'k', 'pending', '{"n": 1}', now(), NULL, 'boom', '[{"attempt": 1, "error": "boom"}]', NULL),
		       ('q', 'k', 'done', '{"n": 2}', now(), now(), NULL, '[{"attempt": 1, "error": "boom"}]', '{"ok": true}')`)
	filters := []admin.JobFilter{
		{},
		{Sort: "run_at"},
		{Sort: "run_at", Kind: "k"},
		{Sort: "run_at", Kind: "k", Queue: "q"},
		{Sort: "run_at", ErrorText: "boom"},
		{Sort: "finished_at"},
	}
	for _, f := range filters {
		jobs, _, err := a.Page(context.Background(), f)
		require.NoError(t, err, "%+v", f)
		require.NotEmpty(t, jobs, "%+v", f)
		for _, j := range jobs {
			require.NotEmpty(t, j.Payload, "%+v: job %d", f, j.ID)
			require.Nil(t, j.Errors, "%+v: job %d", f, j.ID)
			require.Nil(t, j.Result, "%+v: job %d", f, j.ID)
			full, err := a.Get(context.Background(), j.ID)
			require.NoError(t, err)
			require.NotNil(t, full.Errors, "Get: job %d", j.ID)
		}
	}
}
