package pgdispatch_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/admin"
	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/executors/httpcallback"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/timing"
	"github.com/pgdispatch/pgdispatch/internal/testkit/wait"
)

func registerHTTP(t *testing.T, b *bundle) {
	t.Helper()
	exec, err := httpcallback.New(httpcallback.Config{AllowNetworks: []string{httpcallback.NetworksLoopback}})
	require.NoError(t, err)
	b.registry.Register(httpcallback.Kind, exec)
}

// Acceptance 4: a custom job snoozes once; it runs again after the delay,
// and the snooze spends no attempt.
func TestSnoozedJobRunsAgainWithoutSpendingAnAttempt(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const delay = 300 * time.Millisecond
	var (
		mu     sync.Mutex
		starts []time.Time
		seen   []int
	)
	b.registry.Register("sleepy", executors.Func(func(_ context.Context, job *executors.Job) error {
		mu.Lock()
		defer mu.Unlock()
		starts, seen = append(starts, time.Now()), append(seen, job.Attempt)
		if len(starts) == 1 {
			return executors.Snooze(delay)
		}
		return nil
	}))
	start(t, b.config(t, "w1"))
	id := b.insert(t, "INSERT INTO "+b.jobs+" (kind) VALUES ('sleepy') RETURNING id")
	b.watch.Status(t, id, "done", waitFor)
	status, attempts, lastError := b.row(t, id)
	require.Equal(t, "done", status)
	require.Equal(t, 1, attempts, "the snooze gave its attempt back")
	require.Nil(t, lastError)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, starts, 2)
	require.GreaterOrEqual(t, starts[1].Sub(starts[0]), delay)
	require.Equal(t, []int{1, 1}, seen, "both runs were attempt 1")
	pending := slices.IndexFunc(b.watch.History(id), func(s pgtest.JobState) bool { return s.Status == "pending" && s.Attempts == 0 })
	require.GreaterOrEqual(t, pending, 0, "the row went back to pending with attempts 0: %+v", b.watch.History(id))
}

// A job that its worker snoozes, or retries after a backoff, notifies no
// sleeping claimer (migration 025): the worker wakes its own claimer when
// the job is due. Here the outcome is written while the claimer sleeps,
// with the fallback tick an hour away, as the watcher's trigger, which
// notifies on every change, is not there to wake it.
func TestSnoozeWrittenWhileAsleepRunsWhenDue(t *testing.T) {
	t.Parallel()
	const delay = 200 * time.Millisecond
	for name, snooze := range map[string]func() error{
		"snooze": func() error { return executors.Snooze(delay) },
		// Snoozed until an instant, the wait unknown to the worker (0:
		// the wait is only for its log): the wake reads the instant.
		"until": func() error { return executors.SnoozeUntil(time.Now().Add(delay), 0) },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			snoozeWrittenWhileAsleep(t, delay, snooze)
		})
	}
}

func snoozeWrittenWhileAsleep(t *testing.T, delay time.Duration, snooze func() error) {
	b := setupUnwatched(t)
	asleep := make(chan struct{})
	var (
		mu     sync.Mutex
		starts []time.Time
	)
	b.registry.Register("sleepy", executors.Func(func(ctx context.Context, _ *executors.Job) error {
		mu.Lock()
		starts = append(starts, time.Now())
		first := len(starts) == 1
		mu.Unlock()
		if !first {
			return nil
		}
		select {
		case <-asleep:
		case <-ctx.Done():
			return ctx.Err()
		}
		return snooze()
	}))
	w, _, _ := start(t, b.config(t, "w-later"))
	id := b.insert(t, "INSERT INTO "+b.jobs+" (kind) VALUES ('sleepy') RETURNING id")
	wait.For(t, waitFor, "the first run", func() bool { mu.Lock(); defer mu.Unlock(); return len(starts) == 1 })
	b.waitAsleep(t, w)
	close(asleep)
	pgtest.WaitSQL(t, waitFor, "the snoozed job done", "SELECT status = 'done' FROM "+b.jobs+" WHERE id = $1", id)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, starts, 2)
	require.GreaterOrEqual(t, starts[1].Sub(starts[0]), delay)
}

// A job snoozed by a worker that stops before it is due runs on another
// worker of the queue, asleep since before the snooze was written, its
// tick an hour away: the stopping worker tells the others. (Were the
// stopping worker the one asleep, its sleep key would pass to the other,
// whose look as it takes it finds the job.)
func TestSnoozedJobOfAStoppedWorkerRunsOnItsPeer(t *testing.T) {
	t.Parallel()
	b := setupUnwatched(t)
	release := make(chan struct{})
	var (
		mu   sync.Mutex
		runs []string // the worker of each run
	)
	config := func(worker string) pgdispatch.Config {
		reg := executors.NewRegistry()
		reg.Register("sleepy", executors.Func(func(ctx context.Context, _ *executors.Job) error {
			mu.Lock()
			runs = append(runs, worker)
			first := len(runs) == 1
			mu.Unlock()
			if !first {
				return nil
			}
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
			// Due well after the worker has stopped: it must not run it itself.
			return executors.Snooze(3 * time.Second)
		}))
		cfg := b.config(t, worker)
		cfg.Registry = reg
		// One slot: the worker that takes the job is saturated and does not
		// ask for the sleep key again, so the other sleeps (with more, the
		// two raced for it, and the other could wait for it until the end).
		cfg.Concurrency = 1
		return cfg
	}
	workers := map[string]*pgdispatch.Worker{}
	stops := map[string]func(){}
	for _, name := range []string{"w-a", "w-b"} {
		workers[name], stops[name], _ = start(t, config(name))
	}
	id := b.insert(t, "INSERT INTO "+b.jobs+" (kind) VALUES ('sleepy') RETURNING id")
	wait.For(t, waitFor, "the first run", func() bool { mu.Lock(); defer mu.Unlock(); return len(runs) == 1 })
	mu.Lock()
	first, other := runs[0], map[string]string{"w-a": "w-b", "w-b": "w-a"}[runs[0]]
	mu.Unlock()
	// The claim that took the job gave its worker's sleep key back, if it
	// held it: the other worker takes it, looks, and sleeps.
	b.waitAsleep(t, workers[other])
	close(release)
	pgtest.WaitSQL(t, waitFor, "the snooze written", "SELECT status = 'pending' AND run_at > now() FROM "+b.jobs+" WHERE id = $1", id)
	stops[first]()
	pgtest.WaitSQL(t, waitFor, "the snoozed job done", "SELECT status = 'done' FROM "+b.jobs+" WHERE id = $1", id)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{first, other}, runs)
}

// A job snoozed by a worker that has stopped claiming, and is due while
// that worker still waits for another of its jobs to finish, runs on its
// peer, asleep since before the snooze was written, its tick an hour
// away: the stopping worker's wake fires when it no longer claims, and it
// tells the others then. (Its wake is no longer pending when the worker
// stops: a wake told only at the stop, or only while every slot is taken,
// tells no one.)
func TestSnoozeDueWhileItsWorkerDrainsRunsOnItsPeer(t *testing.T) {
	t.Parallel()
	b := setupUnwatched(t)
	release := map[string]chan struct{}{"blocker": make(chan struct{}), "snoozer": make(chan struct{})}
	var (
		mu   sync.Mutex
		runs = map[string][]string{} // kind: the worker of each run
	)
	config := func(worker string) pgdispatch.Config {
		reg := executors.NewRegistry()
		for kind := range release {
			reg.Register(kind, executors.Func(func(ctx context.Context, _ *executors.Job) error {
				mu.Lock()
				runs[kind] = append(runs[kind], worker)
				first := len(runs[kind]) == 1
				mu.Unlock()
				if !first {
					return nil
				}
				select {
				case <-release[kind]:
				case <-ctx.Done():
					return ctx.Err()
				}
				if kind == "snoozer" {
					return executors.Snooze(300 * time.Millisecond)
				}
				return nil
			}))
		}
		cfg := b.config(t, worker)
		cfg.Registry = reg
		return cfg
	}
	workerA, stopA, _ := start(t, config("w-a"))
	var ids []int64
	for _, kind := range []string{"blocker", "snoozer"} {
		ids = append(ids, b.insert(t, "INSERT INTO "+b.jobs+" (kind) VALUES ($1) RETURNING id", kind))
	}
	wait.For(t, waitFor, "both jobs running on w-a", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(runs["blocker"]) == 1 && len(runs["snoozer"]) == 1
	})
	workerB, _, _ := start(t, config("w-b"))
	stopped := make(chan struct{})
	go func() { defer close(stopped); stopA() }()
	statesOf(workerA).wait(t, pgdispatch.DefaultQueue, "stopping")
	// w-a gives its sleep key back as it stops claiming: w-b takes it,
	// finds nothing pending, and sleeps.
	b.waitAsleep(t, workerB)
	close(release["snoozer"])
	snoozer := ids[1]
	pgtest.WaitSQL(t, waitFor, "the snooze written", "SELECT status = 'pending' AND run_at > now() FROM "+b.jobs+" WHERE id = $1", snoozer)
	// Due (on the database's clock, which the worker's wake is not behind)
	// while w-a still waits for the blocker.
	pgtest.WaitSQL(t, waitFor, "the snooze due", "SELECT run_at <= now() FROM "+b.jobs+" WHERE id = $1", snoozer)
	close(release["blocker"])
	<-stopped
	pgtest.WaitSQL(t, waitFor, "the snoozed job done", "SELECT status = 'done' FROM "+b.jobs+" WHERE id = $1", snoozer)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []string{"w-a", "w-b"}, runs["snoozer"])
}

// snooze() in SQL moves a pending job's run_at, and refuses a negative delay.
func TestSnoozeFromSQL(t *testing.T) {
	t.Parallel()
	b := setupUnwatched(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id := b.insert(t, "INSERT INTO "+b.jobs+" (kind) VALUES ('record') RETURNING id")
	var ok bool
	var in float64
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "SELECT "+quoted(b.schema)+".snooze($1, '1 hour')", id).Scan(&ok))
	require.True(t, ok)
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "SELECT extract(epoch FROM run_at - now()) FROM "+b.jobs+" WHERE id = $1", id).Scan(&in))
	require.InDelta(t, 3600, in, 5)
	_, err := pgtest.Pool(t).Exec(ctx, "SELECT "+quoted(b.schema)+".snooze($1, '-1 hour')", id)
	require.ErrorContains(t, err, "the delay must be zero or more")
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "SELECT "+quoted(b.schema)+".snooze(0, '1 hour')").Scan(&ok))
	require.False(t, ok, "no such job")
}

// Acceptance 2: jobs blocked in real HTTP requests, on one worker, are
// cancelled through another: the receiver sees each request's context end
// within 100 ms at p99, and the rows stay cancelled, with the attempt in
// their errors.
func TestCancelReachesARunningJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	registerHTTP(t, b)
	const n = 20
	arrived := make(chan int64, n)
	ended := make(chan int64, n)
	release := make(chan struct{})
	defer close(release)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var id int64
		_, _ = fmt.Sscan(r.URL.Query().Get("id"), &id)
		arrived <- id
		select {
		case <-r.Context().Done():
			ended <- id
		case <-release:
		}
	}))
	defer srv.Close()

	runner := b.config(t, "runner")
	runner.Concurrency = n
	w, _, _ := start(t, runner)
	other := b.config(t, "other")
	other.Queues = []pgdispatch.Queue{{Name: "elsewhere"}}
	start(t, other)

	ids := make([]int64, n)
	for i := range ids {
		ids[i] = b.insert(t, "INSERT INTO "+b.jobs+" (kind, payload) VALUES ('http_callback', jsonb_build_object('url', $1::text || '/?id=' || currval(pg_get_serial_sequence($2, 'id')))) RETURNING id",
			srv.URL, b.schema+".jobs")
	}
	for range n {
		select {
		case <-arrived:
		case <-time.After(waitFor):
			t.Fatal("the requests did not all arrive")
		}
	}

	// The operator's pool is one of its own.
	a := admin.New(pgtest.Pool(t), b.schema, 0)
	var took []time.Duration
	for _, id := range ids {
		began := time.Now()
		changes, err := a.Cancel(context.Background(), []int64{id})
		require.NoError(t, err)
		require.Equal(t, []admin.Change{{ID: id, Status: "running", Changed: true}}, changes)
		select {
		case got := <-ended:
			require.Equal(t, id, got)
			took = append(took, time.Since(began))
		case <-time.After(5 * time.Second):
			t.Fatalf("the request of job %d did not end within 5s of its cancel", id)
		}
	}
	slices.Sort(took)
	p99 := took[len(took)*99/100]
	t.Logf("cancel to the request's end: p50 %s", took[len(took)/2])
	timing.Below(t, "cancel to the request's end, p99", p99, 100*time.Millisecond)

	// The outcomes are dropped: every row stays cancelled, with its attempt
	// on record, once every run has returned.
	for _, id := range ids {
		s := b.watch.Status(t, id, "cancelled", waitFor)
		require.Equal(t, 1, s.Attempts)
	}
	wait.For(t, waitFor, "w.Claimer(pgdispatch.DefaultQueue).Running() == 0", func() bool { return w.Claimer(pgdispatch.DefaultQueue).Running() == 0 })
	j, err := a.Get(context.Background(), ids[0])
	require.NoError(t, err)
	require.Equal(t, "cancelled", j.Status)
	entries, _ := j.History()
	require.Len(t, entries, 1)
	require.Equal(t, "runner", entries[0].Worker)
	require.Contains(t, entries[0].Error, "cancelled by")
	for _, id := range ids {
		h := b.watch.History(id)
		at := slices.IndexFunc(h, func(s pgtest.JobState) bool { return s.Status == "cancelled" })
		for _, s := range h[at:] {
			assert.Equal(t, "cancelled", s.Status, "job %d after its cancel: %+v", id, h)
		}
	}
}

// Anyone may NOTIFY: a forged cancel notice for a job whose row is still
// running leaves the job be.
func TestForgedCancelNoticeIsIgnored(t *testing.T) {
	t.Parallel()
	b := setup(t)
	release := map[int64]chan struct{}{}
	var mu sync.Mutex
	started := make(chan int64, 2)
	ended := make(chan int64, 2)
	b.registry.Register("block", executors.Func(func(ctx context.Context, job *executors.Job) error {
		mu.Lock()
		ch := release[job.ID]
		mu.Unlock()
		started <- job.ID
		select {
		case <-ch:
			return nil
		case <-ctx.Done():
			ended <- job.ID
			return ctx.Err()
		}
	}))
	start(t, b.config(t, "w1"))
	var ids [2]int64
	for i := range ids {
		ids[i] = b.insert(t, "INSERT INTO "+b.jobs+" (kind, run_at) VALUES ('block', now() + interval '1 hour') RETURNING id")
		mu.Lock()
		release[ids[i]] = make(chan struct{})
		mu.Unlock()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := pgtest.Pool(t).Exec(ctx, "UPDATE "+b.jobs+" SET run_at = now()")
	require.NoError(t, err)
	for range ids {
		select {
		case <-started:
		case <-time.After(waitFor):
			t.Fatal("the jobs did not start")
		}
	}

	_, err = pgtest.Pool(t).Exec(ctx, "SELECT pg_notify('pgdispatch.control', jsonb_build_object('schema', $1::text, 'cancel', jsonb_build_array($2::bigint))::text)",
		b.schema, ids[0])
	require.NoError(t, err)
	// A real cancel of the other job is checked after the forged notice.
	_, err = admin.New(pgtest.Pool(t), b.schema, 0).Cancel(ctx, []int64{ids[1]})
	require.NoError(t, err)
	select {
	case got := <-ended:
		require.Equal(t, ids[1], got, "the forged notice cancelled job %d", got)
	case <-time.After(waitFor):
		t.Fatal("the real cancel did not reach its job")
	}
	mu.Lock()
	close(release[ids[0]])
	mu.Unlock()
	b.watch.Status(t, ids[0], "done", waitFor)
}

func quoted(schema string) string { return pgx.Identifier{schema}.Sanitize() }

// Acceptance 3: with three workers running, a paused queue claims nothing
// for 5 s while jobs are inserted; the pause holds across a restart of
// every worker; after resume, every job is delivered once.
func TestPausedQueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := admin.New(pgtest.Pool(t), b.schema, 0)
	ctx := context.Background()
	changed, err := a.Pause(ctx, pgdispatch.DefaultQueue)
	require.NoError(t, err)
	require.True(t, changed)
	changed, err = a.Pause(ctx, pgdispatch.DefaultQueue)
	require.NoError(t, err)
	require.False(t, changed, "already paused")

	var workers []*pgdispatch.Worker
	startThree := func(round int) (stops []func()) {
		workers = nil
		for i := range 3 {
			w, stop, _ := start(t, b.config(t, fmt.Sprintf("worker-%d-%d", round, i)))
			statesOf(w).wait(t, pgdispatch.DefaultQueue, "paused")
			require.True(t, w.Claimer(pgdispatch.DefaultQueue).Stats().Paused)
			stops, workers = append(stops, stop), append(workers, w)
		}
		return stops
	}
	stops := startThree(1)

	inserted := 0
	insert := func() {
		b.insert(t, "INSERT INTO "+b.jobs+" (kind) VALUES ('record') RETURNING id")
		inserted++
	}
	tick := time.NewTicker(50 * time.Millisecond)
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); <-tick.C {
		insert()
	}
	tick.Stop()
	for _, stop := range stops {
		stop()
	}
	stops = startThree(2) // each new worker's first claim found the queue paused
	insert()
	require.Zero(t, b.rec.total.Load(), "a paused queue's job ran")
	for id, s := range b.watch.Until(t, waitFor, "every job seen", func(m map[int64]pgtest.JobState) bool { return len(m) == inserted }) {
		require.Equal(t, "pending", s.Status, "job %d", id)
		require.Len(t, b.watch.History(id), 1, "job %d changed while its queue was paused", id)
	}

	stats, _, err := a.Stats(ctx, 0)
	require.NoError(t, err)
	require.Len(t, stats, 1)
	require.True(t, stats[0].Paused)
	queues, err := a.Queues(ctx)
	require.NoError(t, err)
	require.Len(t, queues, 1)
	require.NotNil(t, queues[0].PausedAt)
	require.Equal(t, int64(inserted), queues[0].Pending)

	changed, err = a.Resume(ctx, pgdispatch.DefaultQueue)
	require.NoError(t, err)
	require.True(t, changed)
	b.rec.waitStarts(t, int64(inserted))
	b.watch.Until(t, waitFor, "every job done", func(m map[int64]pgtest.JobState) bool {
		for _, s := range m {
			if s.Status != "done" {
				return false
			}
		}
		return len(m) == inserted
	})
	b.rec.requireEachOnce(t, inserted)
	for _, w := range workers { // each claims once the resume's notification reaches it
		wait.For(t, waitFor, "!w.Claimer(pgdispatch.DefaultQueue).Stats().Paused", func() bool { return !w.Claimer(pgdispatch.DefaultQueue).Stats().Paused })
	}
	for _, stop := range stops {
		stop()
	}
}

// cancel() tells the workers of every running job it cancelled, however
// long their ids are (the owner may start the identity anywhere): a NOTIFY
// payload must stay under 8000 bytes, and
// 500 ids of 15 digits or more pass that.
func TestCancelNotifiesLongIDs(t *testing.T) {
	t.Parallel()
	b := setupUnwatched(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn := pgtest.Conn(t)
	_, err := conn.Exec(ctx, `LISTEN "pgdispatch.control"`)
	require.NoError(t, err)
	const n = 1200
	_, err = pgtest.Pool(t).Exec(ctx, "INSERT INTO "+b.jobs+` (id, kind, status, attempts, locked_by, locked_until) OVERRIDING SYSTEM VALUE
		SELECT -9223372036854775808 + g, 'record', 'running', 1, 'w', now() + interval '1 hour' FROM generate_series(1, $1) g`, n)
	require.NoError(t, err)
	rows, err := pgtest.Pool(t).Query(ctx, "SELECT id FROM "+b.jobs)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	require.NoError(t, err)

	changes, err := admin.New(pgtest.Pool(t), b.schema, 0).Cancel(ctx, ids)
	require.NoError(t, err)
	require.Len(t, changes, n)
	told := map[int64]bool{}
	for len(told) < n {
		note, err := conn.WaitForNotification(ctx)
		require.NoError(t, err, "told of %d of %d", len(told), n)
		var msg struct {
			Schema string  `json:"schema"`
			Cancel []int64 `json:"cancel"`
		}
		require.NoError(t, json.Unmarshal([]byte(note.Payload), &msg))
		if msg.Schema != b.schema {
			continue
		}
		for _, id := range msg.Cancel {
			told[id] = true
		}
	}
}

// A cancel sent while the worker's listener is away reaches the running
// job when the listener connects again, not at the next heartbeat.
func TestCancelWhileTheListenerIsAway(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.config(t, "w")
	app := "pgdispatch-listener-" + b.schema
	cfg.ListenConnConfig = pgtest.Pool(t).Config().ConnConfig.Copy()
	cfg.ListenConnConfig.RuntimeParams["application_name"] = app
	pgdispatch.SetReconnect(&cfg, 500*time.Millisecond, 500*time.Millisecond)
	cfg.Lease = time.Hour // no heartbeat in the test's time
	start(t, cfg)
	ended := make(chan struct{})
	b.registry.Register("block", executors.Func(func(ctx context.Context, _ *executors.Job) error {
		<-ctx.Done()
		close(ended)
		return ctx.Err()
	}))
	id := b.insert(t, "INSERT INTO "+b.jobs+" (kind) VALUES ('block') RETURNING id")
	b.watch.Status(t, id, "running", waitFor)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.Positive(t, pgtest.TerminateApp(ctx, t, app)) // the listener, and the sleep key's session
	_, err := admin.New(pgtest.Pool(t), b.schema, 0).Cancel(ctx, []int64{id})
	require.NoError(t, err)
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the run did not stop after the listener came back")
	}
}

// A cancelled job whose executor ignores its context gives its slot back
// within the abandon grace of the cancel, not of the job's timeout.
func TestCancelledExecutorThatIgnoresItsContextGivesItsSlotBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	stuck := make(chan struct{})
	defer close(stuck)
	started := make(chan int64, 2)
	b.registry.Register("stubborn", executors.Func(func(_ context.Context, job *executors.Job) error {
		started <- job.ID
		if job.Priority == 0 {
			<-stuck // ignores ctx
		}
		return nil
	}))
	cfg := b.config(t, "w")
	cfg.Concurrency = 1
	cfg.JobTimeout = time.Hour
	start(t, cfg)
	first := b.insert(t, "INSERT INTO "+b.jobs+" (kind) VALUES ('stubborn') RETURNING id")
	require.Equal(t, first, <-started)
	second := b.insert(t, "INSERT INTO "+b.jobs+" (kind, priority) VALUES ('stubborn', 1) RETURNING id")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cancelled := time.Now()
	_, err := admin.New(pgtest.Pool(t), b.schema, 0).Cancel(ctx, []int64{first})
	require.NoError(t, err)
	select {
	case got := <-started:
		require.Equal(t, second, got)
		t.Logf("the slot came back %s after the cancel", time.Since(cancelled))
	case <-time.After(10 * time.Second):
		t.Fatal("the cancelled job kept its slot")
	}
	b.watch.Status(t, second, "done", waitFor)
	status, _, _ := b.row(t, first)
	require.Equal(t, "cancelled", status)
}
