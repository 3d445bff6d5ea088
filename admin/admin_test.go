package admin_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/admin"
	"github.com/pgdispatch/pgdispatch/claimer"
	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/wait"
	"github.com/pgdispatch/pgdispatch/internal/testkit/workertest"
	"github.com/pgdispatch/pgdispatch/migrations"
)

func TestMain(m *testing.M) { pgtest.MainNoLeaks(m) }

func setup(t *testing.T) (*admin.Admin, string, func(sql string, args ...any)) {
	t.Helper()
	schema := pgtest.Schema(t)
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	exec := func(sql string, args ...any) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := pgtest.Pool(t).Exec(ctx, strings.ReplaceAll(sql, "{jobs}", jobs), args...)
		require.NoError(t, err)
	}
	return admin.New(pgtest.Pool(t), schema, 10*time.Second), schema, exec
}

// The stats match the table, status by status.
func TestStats(t *testing.T) {
	t.Parallel()
	a, _, exec := setup(t)
	exec(`INSERT INTO {jobs} (queue, kind, status, run_at, finished_at) VALUES
		('default', 'http_callback', 'pending', now() - interval '90 seconds', NULL),
		('default', 'http_callback', 'pending', now() - interval '10 seconds', NULL),
		('default', 'http_callback', 'pending', now() + interval '1 hour', NULL),
		('default', 'http_callback', 'running', now(), NULL),
		('default', 'http_callback', 'done', now(), now() - interval '10 seconds'),
		('default', 'http_callback', 'done', now(), now() - interval '10 minutes'),
		('default', 'http_callback', 'dead', now(), now() - interval '5 seconds'),
		('default', 'email', 'cancelled', now(), now()),
		('mail', 'email', 'dead', now(), now() - interval '2 hours')`)
	stats, counted, err := a.Stats(context.Background(), 0)
	require.NoError(t, err)
	require.True(t, counted)
	require.Len(t, stats, 3)

	zero, one := ptr(0), ptr(1)
	email, http, mail := stats[0], stats[1], stats[2]
	require.Equal(t, admin.QueueStats{Queue: "default", Kind: "email", Done: zero, Dead: zero, Cancelled: one}, email)
	require.Equal(t, "http_callback", http.Kind)
	require.Equal(t, [7]int64{3, 2, 1, 2, 1, 0, 1}, [7]int64{http.Pending, http.Due, http.Running, *http.Done, *http.Dead, *http.Cancelled, http.DoneLastMinute})
	require.Equal(t, int64(1), http.DeadLastMinute)
	require.NotNil(t, http.OldestDueSeconds)
	require.InDelta(t, 90, *http.OldestDueSeconds, 5)
	require.Equal(t, admin.QueueStats{Queue: "mail", Kind: "email", Done: zero, Dead: one, Cancelled: zero}, mail)
}

func ptr(n int64) *int64 { return &n }

// When the finished jobs take longer to count than the budget, the rest of
// the stats are still exact and the finished counts are left out. 100,000
// kept rows take tens of milliseconds to count; the budget is one.
func TestStatsFinishedOverBudget(t *testing.T) {
	t.Parallel()
	a, _, exec := setup(t)
	exec(`INSERT INTO {jobs} (kind, status, run_at, finished_at) VALUES
		('noop', 'pending', now() - interval '1 minute', NULL),
		('noop', 'running', now(), NULL),
		('noop', 'done', now(), now())`)
	exec(`INSERT INTO {jobs} (kind, status, finished_at)
		SELECT 'bulk', 'dead', now() - interval '1 hour' FROM generate_series(1, 100000)`)

	stats, counted, err := a.Stats(context.Background(), time.Millisecond)
	require.NoError(t, err)
	require.False(t, counted)
	require.Len(t, stats, 1, "the bulk kind has no active or recent jobs")
	s := stats[0]
	require.Equal(t, [4]int64{1, 1, 1, 1}, [4]int64{s.Pending, s.Due, s.Running, s.DoneLastMinute})
	require.Nil(t, s.Done)
	require.Nil(t, s.Dead)
	require.Nil(t, s.Cancelled)

	// With the default budget they are counted.
	stats, counted, err = a.Stats(context.Background(), 0)
	require.NoError(t, err)
	require.True(t, counted)
	require.Len(t, stats, 2)
	require.Equal(t, int64(100000), *stats[0].Dead)
	require.Equal(t, int64(1), *stats[1].Done)
}

func TestListAndGet(t *testing.T) {
	t.Parallel()
	a, _, exec := setup(t)
	exec(`INSERT INTO {jobs} (queue, kind, status, payload) VALUES
		('default', 'noop', 'pending', '{"n": 1}'), ('default', 'noop', 'dead', '{"n": 2}'),
		('mail', 'email', 'dead', '{"n": 3}'), ('default', 'email', 'done', '{"n": 4}')`)
	ctx := context.Background()
	all, err := a.List(ctx, admin.Filter{})
	require.NoError(t, err)
	require.Len(t, all, 4)
	require.Greater(t, all[0].ID, all[3].ID, "newest first")

	dead, err := a.List(ctx, admin.Filter{Statuses: []string{"dead"}, Queue: "default"})
	require.NoError(t, err)
	require.Len(t, dead, 1)
	require.JSONEq(t, `{"n": 2}`, string(dead[0].Payload))

	email, err := a.List(ctx, admin.Filter{Kind: "email", Limit: 1})
	require.NoError(t, err)
	require.Len(t, email, 1)
	require.Equal(t, "done", email[0].Status)

	_, err = a.List(ctx, admin.Filter{Statuses: []string{"finished"}})
	require.ErrorContains(t, err, `unknown status "finished"`)

	j, err := a.Get(ctx, dead[0].ID)
	require.NoError(t, err)
	require.Equal(t, dead[0], j)
	_, err = a.Get(ctx, 999999)
	require.ErrorIs(t, err, admin.ErrNotFound)
}

// worker runs a worker on schema with the executors of reg until the test
// ends.
func worker(t *testing.T, schema string, reg *executors.Registry) *pgdispatch.Worker {
	t.Helper()
	w, _ := workertest.Run(context.Background(), t, pgdispatch.Config{
		Pool: pgtest.Pool(t), Schema: schema, WorkerID: "admin-test", Registry: reg,
		Options: claimer.Options{PollInterval: time.Hour}, Logger: zaptest.NewLogger(t),
	})
	return w
}

// Dead jobs retried while a worker runs are run again, each with one more
// attempt, in batches.
func TestRetryDeadWhileWorkerRuns(t *testing.T) {
	t.Parallel()
	a, schema, exec := setup(t)
	exec(`INSERT INTO {jobs} (kind, queue, status, attempts, max_attempts, last_error, finished_at)
		SELECT CASE WHEN i % 2 = 0 THEN 'ok' ELSE 'other' END, 'default', 'dead', 3, 3, 'boom', now()
		FROM generate_series(1, 2500) i`)
	exec(`INSERT INTO {jobs} (kind, queue, status, attempts, max_attempts, finished_at) VALUES ('ok', 'elsewhere', 'dead', 1, 1, now())`)
	reg := executors.NewRegistry()
	reg.Register("ok", executors.Func(func(context.Context, *executors.Job) error { return nil }))
	w := worker(t, schema, reg)

	n, err := a.RetryDead(context.Background(), "default", "ok")
	require.NoError(t, err)
	require.Equal(t, int64(1250), n, "more than one batch")
	wait.For(t, time.Minute, "w.Claimer(\"default\").Stats().Completed == 1250", func() bool { return w.Claimer("default").Stats().Completed == 1250 })

	stats, counted, err := a.Stats(context.Background(), 0)
	require.NoError(t, err)
	require.True(t, counted)
	byKey := map[string]admin.QueueStats{}
	for _, s := range stats {
		byKey[s.Queue+"/"+s.Kind] = s
	}
	require.Equal(t, int64(1250), *byKey["default/ok"].Done)
	require.Equal(t, int64(0), *byKey["default/ok"].Dead)
	require.Equal(t, int64(1250), *byKey["default/other"].Dead, "another kind is left alone")
	require.Equal(t, int64(1), *byKey["elsewhere/ok"].Dead, "another queue is left alone")

	done, err := a.List(context.Background(), admin.Filter{Statuses: []string{"done"}, Limit: 1})
	require.NoError(t, err)
	require.Equal(t, int32(4), done[0].Attempts)
	require.Equal(t, "boom", *done[0].LastError, "the last failure is kept")
}

func TestRetryAndCancelByID(t *testing.T) {
	t.Parallel()
	a, schema, exec := setup(t)
	release := make(chan struct{})
	started := make(chan int64, 10)
	reg := executors.NewRegistry()
	reg.Register("block", executors.Func(func(_ context.Context, job *executors.Job) error {
		started <- job.ID
		<-release
		return nil
	}))
	reg.Register("ok", executors.Func(func(context.Context, *executors.Job) error { return nil }))
	w := worker(t, schema, reg)
	ctx := context.Background()

	// A running job cancelled stays cancelled when its executor returns.
	exec(`INSERT INTO {jobs} (kind) VALUES ('block')`)
	running := <-started
	changes, err := a.Cancel(ctx, []int64{running, 424242})
	require.NoError(t, err)
	require.Equal(t, []admin.Change{{ID: running, Status: "running", Changed: true}, {ID: 424242}}, changes)
	close(release)
	wait.For(t, time.Minute, "w.Claimer(\"default\").Running() == 0", func() bool { return w.Claimer("default").Running() == 0 })

	// A scheduled job cancelled never runs; a done one cannot be cancelled.
	exec(`INSERT INTO {jobs} (kind, run_at) VALUES ('ok', now() + interval '1 hour')`)
	exec(`INSERT INTO {jobs} (kind, status, finished_at) VALUES ('ok', 'done', now())`)
	jobs, err := a.List(ctx, admin.Filter{Limit: 2})
	require.NoError(t, err)
	doneID, scheduledID := jobs[0].ID, jobs[1].ID
	changes, err = a.Cancel(ctx, []int64{doneID, scheduledID})
	require.NoError(t, err)
	require.Equal(t, []admin.Change{{ID: scheduledID, Status: "pending", Changed: true}, {ID: doneID, Status: "done"}}, changes)

	// Retry by id: the cancelled ones run; the done one is left alone.
	changes, err = a.Retry(ctx, []int64{doneID, scheduledID, running})
	require.NoError(t, err)
	require.Equal(t, []admin.Change{
		{ID: running, Status: "cancelled", Changed: true},
		{ID: scheduledID, Status: "cancelled", Changed: true},
		{ID: doneID, Status: "done"},
	}, changes)
	wait.For(t, time.Minute, "both jobs to be done", func() bool {
		j1, err1 := a.Get(ctx, scheduledID)
		j2, err2 := a.Get(ctx, running)
		return err1 == nil && err2 == nil && j1.Status == "done" && j2.Status == "done"
	})
	j, err := a.Get(ctx, running)
	require.NoError(t, err)
	require.Equal(t, int32(2), j.Attempts)
}

// Retry does not lock the jobs it leaves alone: a pending job that another
// transaction holds does not make a retry that names it wait.
func TestRetryLeavesOtherJobsUnlocked(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, schema, exec := setup(t)
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	exec(`INSERT INTO {jobs} (kind) VALUES ('ok')`)
	exec(`INSERT INTO {jobs} (kind, status, finished_at) VALUES ('ok', 'dead', now())`)
	pool := pgtest.Pool(t)
	var pendingID, deadID int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT min(id), max(id) FROM "+jobs).Scan(&pendingID, &deadID))

	locker, err := pgtest.Conn(t).Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = locker.Rollback(context.Background()) }()
	_, err = locker.Exec(ctx, "SELECT id FROM "+jobs+" WHERE id = $1 FOR UPDATE", pendingID)
	require.NoError(t, err)

	a := admin.New(pool, schema, 2*time.Second) // a wait for the lock would time out
	changes, err := a.Retry(ctx, []int64{pendingID, deadID})
	require.NoError(t, err)
	require.Equal(t, []admin.Change{{ID: pendingID, Status: "pending"}, {ID: deadID, Status: "dead", Changed: true}}, changes)
}

// A retry gives a job whose attempts are used up one more, within the
// table's bound on max_attempts: at the bound the job keeps it, since a
// claim never counts past it (migrations.AttemptsLimit). A retry that
// raised it past the bound failed the whole batch, and retried nothing.
func TestRetryAtTheAttemptsLimit(t *testing.T) {
	t.Parallel()
	a, _, exec := setup(t)
	ctx := context.Background()
	limit := int32(migrations.AttemptsLimit)
	exec(`INSERT INTO {jobs} (kind, status, attempts, max_attempts, finished_at) VALUES
		('at', 'dead', $1, $1, now()), ('below', 'dead', $1 - 1, $1 - 1, now()), ('few', 'dead', 5, 5, now()),
		('unset', 'dead', 5, NULL, now()), ('cancelled', 'cancelled', $1, $1, now())`, limit)

	n, err := a.RetryDead(ctx, "", "")
	require.NoError(t, err)
	require.Equal(t, int64(4), n)
	jobs, err := a.List(ctx, admin.Filter{})
	require.NoError(t, err)
	changes, err := a.Retry(ctx, []int64{jobs[0].ID})
	require.NoError(t, err)
	require.True(t, changes[0].Changed)

	jobs, err = a.List(ctx, admin.Filter{})
	require.NoError(t, err)
	got := map[string]*int32{}
	for _, j := range jobs {
		require.Equal(t, "pending", j.Status, j.Kind)
		got[j.Kind] = j.MaxAttempts
	}
	six := int32(6)
	require.Equal(t, map[string]*int32{"at": &limit, "below": &limit, "few": &six, "unset": nil, "cancelled": &limit}, got)
}

// A bulk retry finds every dead job, whatever its id: a writer may choose
// ids (OVERRIDING SYSTEM VALUE), zero and negative ones included.
func TestRetryDeadFindsEveryID(t *testing.T) {
	t.Parallel()
	a, _, exec := setup(t)
	exec(`INSERT INTO {jobs} (id, kind, status, finished_at) OVERRIDING SYSTEM VALUE VALUES
		(-9223372036854775808, 'noop', 'dead', now()), (-7, 'noop', 'dead', now()), (0, 'noop', 'dead', now())`)
	exec(`INSERT INTO {jobs} (kind, status, finished_at) VALUES ('noop', 'dead', now())`)
	n, err := a.RetryDead(context.Background(), "", "")
	require.NoError(t, err)
	require.Equal(t, int64(4), n)
}

// A job's attempts read against its max_attempts, or alone when it has
// none of its own.
func TestAttemptsText(t *testing.T) {
	t.Parallel()
	five := int32(5)
	require.Equal(t, "2/5", admin.Job{Attempts: 2, MaxAttempts: &five}.AttemptsText())
	require.Equal(t, "2", admin.Job{Attempts: 2}.AttemptsText())
}
