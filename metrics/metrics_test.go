package metrics_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/claimer"
	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/executors/httpcallback"
	"github.com/pgdispatch/pgdispatch/internal/testhook"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/wait"
	"github.com/pgdispatch/pgdispatch/internal/testkit/workertest"
	"github.com/pgdispatch/pgdispatch/metrics"
)

func TestMain(m *testing.M) { pgtest.MainNoLeaks(m) }

// scrape reads /metrics as Prometheus would.
func scrape(t *testing.T, srv *httptest.Server) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(srv.URL + "/metrics")
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	return families
}

// value is the value of the family's series whose labels are exactly want.
func value(t *testing.T, families map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	t.Helper()
	f, ok := families[name]
	require.True(t, ok, "no metric %s", name)
	for _, m := range f.GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		if len(got) != len(want) {
			continue
		}
		match := true
		for k, v := range want {
			match = match && got[k] == v
		}
		if !match {
			continue
		}
		switch {
		case m.GetCounter() != nil:
			return m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			return m.GetGauge().GetValue()
		case m.GetHistogram() != nil:
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	t.Fatalf("no series %s%v", name, want)
	return 0
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// Real jobs run on a real worker; /metrics then shows what happened.
func TestMetricsAfterRealJobs(t *testing.T) {
	schema := pgtest.FreshSchema(t) // the server's counters of its jobs table start at 0
	pool := pgtest.Pool(t)
	reg := executors.NewRegistry()
	reg.Register("ok", executors.Func(func(context.Context, *executors.Job) error { return nil }))
	reg.Register("flaky", executors.Func(func(_ context.Context, job *executors.Job) error {
		if job.Attempt == 1 {
			return context.DeadlineExceeded // a retryable failure
		}
		return nil
	}))
	reg.Register("refused", executors.Func(func(context.Context, *executors.Job) error {
		return executors.Permanentf("refused for good")
	}))

	m := metrics.New(pool, reg)
	listening := make(chan struct{}, 8)
	asleep := make(chan struct{}, 8)
	w, err := pgdispatch.NewWorker(pgdispatch.Config{
		Pool: pool, Schema: schema, WorkerID: "metrics", Registry: reg,
		Options:  claimer.Options{PollInterval: time.Hour, RetryBackoff: func(int) time.Duration { return 10 * time.Millisecond }},
		Observer: m, Logger: zaptest.NewLogger(t),
		OnListen: func() {
			select {
			case listening <- struct{}{}:
			default:
			}
		},
	})
	require.NoError(t, err)
	m.Attach(w)
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()

	code, _ := get(t, srv.URL+"/healthz")
	require.Equal(t, http.StatusOK, code)
	code, body := get(t, srv.URL+"/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code, "not ready before the listener connects")
	require.Contains(t, body, "listener is not connected")

	workertest.Serve(testhook.With(context.Background(), &testhook.Hooks{
		ClaimerState: func(_, _, to string) {
			if to == "asleep" {
				select {
				case asleep <- struct{}{}:
				default:
				}
			}
		},
	}), t, w, "metrics")
	select {
	case <-listening:
	case <-time.After(30 * time.Second):
		t.Fatal("listener did not connect")
	}
	code, _ = get(t, srv.URL+"/readyz")
	require.Equal(t, http.StatusOK, code)
	// Asleep, the claimer is woken by a notification.
	select {
	case <-asleep:
	case <-time.After(30 * time.Second):
		t.Fatal("the claimer did not go to sleep")
	}

	jobs := `"` + schema + `".jobs`
	// The writer's backend reports its inserts to the statistics system as
	// it exits; idle, it could wait seconds to.
	writer := pgtest.Conn(t)
	_, err = writer.Exec(context.Background(), `INSERT INTO `+jobs+` (kind, max_attempts)
		SELECT k, 3 FROM unnest(ARRAY['ok', 'ok', 'ok', 'flaky', 'refused', 'no_such_kind']) k`)
	require.NoError(t, err)
	require.NoError(t, writer.Close(context.Background()))
	// Every attempt is counted once it is written: 3 ok, flaky twice,
	// refused once, the unknown kind once.
	wait.For(t, 30*time.Second, "w.Claimer(\"default\").Stats().Completed == 7", func() bool {
		return w.Claimer("default").Stats().Completed == 7
	})

	// The statistics system counts the six inserts once the writer's backend
	// has reported them; the scrape samples after that.
	wait.For(t, 30*time.Second, "the statistics system to count the six inserts", func() bool {
		var n int64
		err := pool.QueryRow(context.Background(), "SELECT pg_stat_get_tuples_inserted($1::regclass)", jobs).Scan(&n)
		return err == nil && n == 6
	})

	f := scrape(t, srv)
	q := map[string]string{"queue": "default"}
	requireValue(t, 7.0, value(t, f, "pgdispatch_jobs_claimed_total", q))
	requireValue(t, 0.0, value(t, f, "pgdispatch_jobs_in_flight", q))
	for _, c := range []struct {
		kind, outcome string
		n             float64
	}{{"ok", "done", 3}, {"flaky", "retry", 1}, {"flaky", "done", 1}, {"refused", "dead", 1}, {"unknown", "dead", 1}} {
		requireValue(t, c.n, value(t, f, "pgdispatch_jobs_completed_total",
			map[string]string{"queue": "default", "kind": c.kind, "outcome": c.outcome}), "%s %s", c.kind, c.outcome)
	}
	requireValue(t, 3.0, value(t, f, "pgdispatch_job_duration_seconds", map[string]string{"queue": "default", "kind": "ok"}))
	requireValue(t, 2.0, value(t, f, "pgdispatch_dispatch_latency_seconds", map[string]string{"queue": "default", "kind": "flaky"}))
	requireValue(t, 1.0, value(t, f, "pgdispatch_listener_connected", nil))
	require.GreaterOrEqual(t, value(t, f, "pgdispatch_notifications_received_total", nil), 1.0)
	requireValue(t, 0.0, value(t, f, "pgdispatch_fallback_ticks_found_work_total", q))
	requireValue(t, 0.0, value(t, f, "pgdispatch_jobs_rescued_total", map[string]string{"result": "pending"}))
	requireValue(t, 1.0, value(t, f, "pgdispatch_queue_jobs_sample_ok", nil))
	requireValue(t, 2.0, value(t, f, "pgdispatch_queue_jobs", map[string]string{"queue": "default", "status": "dead"}))
	requireValue(t, 6.0, value(t, f, "pgdispatch_jobs_inserted_total", nil))
	usage := value(t, f, "pgdispatch_notification_queue_usage", nil)
	require.True(t, usage >= 0 && usage < 1, "notification queue usage %v", usage)
	_, hasPending := findSeries(f, "pgdispatch_queue_jobs", "pending")
	require.False(t, hasPending, "no pending jobs are left")
	// The sweeper's first pass, at the start, read the oldest xmin: ages
	// are never negative (the server is shared: what holds it varies).
	require.True(t, w.Sweeper().OldestXmin().Known)
	require.GreaterOrEqual(t, value(t, f, "pgdispatch_oldest_xmin_age_seconds", nil), 0.0)
	require.GreaterOrEqual(t, value(t, f, "pgdispatch_oldest_xmin_age_xids", nil), 0.0)

	// A job left running by a worker that died is rescued by the sweeper.
	_, err = pool.Exec(context.Background(), `INSERT INTO `+jobs+` (kind, status, attempts, max_attempts, locked_by, locked_until)
		VALUES ('ok', 'running', 1, 3, 'gone', now() - interval '1 minute')`)
	require.NoError(t, err)
	_, err = w.Sweeper().Sweep(context.Background())
	require.NoError(t, err)
	wait.For(t, 30*time.Second, "w.Claimer(\"default\").Stats().Completed == 8", func() bool { return w.Claimer("default").Stats().Completed == 8 })
	f = scrape(t, srv)
	requireValue(t, 1.0, value(t, f, "pgdispatch_jobs_rescued_total", map[string]string{"result": "pending"}))
	requireValue(t, 4.0, value(t, f, "pgdispatch_jobs_completed_total", map[string]string{"queue": "default", "kind": "ok", "outcome": "done"}))
}

func findSeries(f map[string]*dto.MetricFamily, name, status string) (float64, bool) {
	for _, m := range f[name].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "status" && l.GetValue() == status {
				return m.GetGauge().GetValue(), true
			}
		}
	}
	return 0, false
}

func requireValue(t *testing.T, want, got float64, msgAndArgs ...any) {
	t.Helper()
	require.InDelta(t, want, got, 1e-9, msgAndArgs...)
}

// An executor that is a prometheus.Collector has its metrics scraped with
// the worker's: http_callback's waits for connections.
func TestExecutorMetrics(t *testing.T) {
	t.Parallel()
	reg := executors.NewRegistry()
	exec, err := httpcallback.New(httpcallback.Config{})
	require.NoError(t, err)
	reg.Register(httpcallback.Kind, exec)
	reg.Register("again", exec) // one executor under two kinds is collected once
	srv := httptest.NewServer(metrics.New(pgtest.Pool(t), reg).Handler())
	defer srv.Close()
	families := scrape(t, srv)
	require.Zero(t, value(t, families, "pgdispatch_http_connection_waits_total", nil))
	require.Zero(t, value(t, families, "pgdispatch_http_jobs_waiting_for_connection", nil))
	require.Zero(t, value(t, families, "pgdispatch_http_hosts_saturated", nil))
}

// /readyz pings the database at most once per metrics.ReadyInterval, however
// many requests come and however they overlap: a burst of them shares one
// ping. Pings are counted by the pool's acquire hook (the readiness check is
// the pool's only user here); the bound is the one the interval allows for
// the time the requests took, so a slow machine cannot make it fail.
func TestReadyzPingsOncePerInterval(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	var pings atomic.Int64
	release := make(chan struct{})
	cfg.PrepareConn = func(context.Context, *pgx.Conn) (bool, error) {
		if pings.Add(1) == 1 {
			<-release // the first ping waits until every request of the burst has arrived
		}
		return true, nil
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	defer pool.Close()
	m := metrics.New(pool, executors.NewRegistry())

	const burst = 64
	arrived := make(chan struct{}, burst)
	inner := m.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case arrived <- struct{}{}:
		default:
		}
		inner.ServeHTTP(w, r)
	}))
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{MaxConnsPerHost: burst, MaxIdleConnsPerHost: burst}}
	defer client.CloseIdleConnections()

	began := time.Now()
	codes := make(chan int, burst)
	for range burst {
		go func() {
			resp, err := client.Get(srv.URL + "/readyz")
			if err != nil {
				codes <- 0
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	for range burst {
		select {
		case <-arrived:
		case <-time.After(30 * time.Second):
			t.Fatal("the requests did not arrive")
		}
	}
	close(release)
	for range burst {
		require.Equal(t, http.StatusOK, <-codes)
	}
	// Then one after another.
	for range 200 {
		code, _ := get(t, srv.URL+"/readyz")
		require.Equal(t, http.StatusOK, code)
	}
	allowed := 1 + int64(time.Since(began)/metrics.ReadyInterval)
	require.LessOrEqual(t, pings.Load(), allowed, "%d requests pinged the database %d times in %s",
		burst+200, pings.Load(), time.Since(began))
}

// The schedules' figures: each one's next and last run, its runs, missed
// and caught-up slots, and whether it fails; and the jobs this worker's
// scheduler created.
func TestScheduleMetrics(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	pool := pgtest.Pool(t)
	reg := executors.NewRegistry()
	m := metrics.New(pool, reg)
	w, err := pgdispatch.NewWorker(pgdispatch.Config{
		Pool: pool, Schema: schema, WorkerID: "metrics", Registry: reg, Observer: m, Logger: zaptest.NewLogger(t),
		Options: claimer.Options{PollInterval: time.Hour},
	})
	require.NoError(t, err)
	m.Attach(w)
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	workertest.Serve(context.Background(), t, w, "metrics")

	fn := `"` + schema + `".schedule`
	_, err = pool.Exec(context.Background(), "SELECT "+fn+"('tick', NULL, 'noop', every => '1 second'), "+
		fn+"('never', '0 0 30 2 *', 'noop')")
	require.NoError(t, err)
	// And one whose slot a job the owner inserted holds already.
	slot := time.Now().UTC().Truncate(time.Hour)
	tx, err := pool.Begin(context.Background())
	require.NoError(t, err)
	defer tx.Rollback(context.Background()) //nolint:errcheck // after Commit, a no-op
	_, err = tx.Exec(context.Background(), "SET LOCAL pgdispatch.firing = on; SELECT "+fn+"('held', NULL, 'noop', every => '1 hour')")
	require.NoError(t, err)
	_, err = tx.Exec(context.Background(), `INSERT INTO "`+schema+`".jobs (kind, dedup_key) VALUES ('noop', $1)`,
		"schedule:held:"+slot.Format("2006-01-02T15:04:05Z"))
	require.NoError(t, err)
	_, err = tx.Exec(context.Background(), `UPDATE "`+schema+`".schedules SET next_run_at = $1 WHERE name = 'held'`, slot)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(context.Background()))
	wait.For(t, 30*time.Second, "s.Created >= 1 && s.Failed >= 1 && s.Taken >= 1", func() bool {
		s := w.Scheduler().Stats()
		return s.Created >= 1 && s.Failed >= 1 && s.Taken >= 1
	})

	f := scrape(t, srv)
	tick, never := map[string]string{"schedule": "tick"}, map[string]string{"schedule": "never"}
	now := float64(time.Now().Unix())
	require.InDelta(t, now+1, value(t, f, "pgdispatch_schedule_next_run_timestamp_seconds", tick), 2)
	require.InDelta(t, now, value(t, f, "pgdispatch_schedule_last_run_timestamp_seconds", tick), 2)
	require.GreaterOrEqual(t, value(t, f, "pgdispatch_schedule_runs_total", tick), 1.0)
	requireValue(t, 0, value(t, f, "pgdispatch_schedule_missed_slots_total", tick))
	requireValue(t, 0, value(t, f, "pgdispatch_schedule_caught_up_slots_total", tick))
	requireValue(t, 0, value(t, f, "pgdispatch_schedule_taken_slots_total", tick))
	requireValue(t, 1, value(t, f, "pgdispatch_schedule_taken_slots_total", map[string]string{"schedule": "held"}))
	requireValue(t, 0, value(t, f, "pgdispatch_schedule_failing", tick))
	requireValue(t, 1, value(t, f, "pgdispatch_schedule_failing", never))
	for _, s := range f["pgdispatch_schedule_next_run_timestamp_seconds"].GetMetric() {
		require.NotEqual(t, "never", s.GetLabel()[0].GetValue(), "a failing schedule has no next run")
	}
	require.GreaterOrEqual(t, value(t, f, "pgdispatch_scheduler_jobs_created_total", nil), 1.0)
	require.GreaterOrEqual(t, value(t, f, "pgdispatch_scheduler_passes_total", nil), 1.0)
}

// Run serves the endpoints while the worker runs and through its shutdown,
// while a job still runs, and stops serving once the worker has stopped.
func TestRunServesThroughTheShutdown(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	pool := pgtest.Pool(t)
	started, release := make(chan struct{}), make(chan struct{})
	reg := executors.NewRegistry()
	reg.Register("block", executors.Func(func(context.Context, *executors.Job) error {
		close(started)
		<-release // past the context's end: the shutdown waits for it
		return nil
	}))
	m := metrics.New(pool, reg)
	w, err := pgdispatch.NewWorker(pgdispatch.Config{
		Pool: pool, Schema: schema, WorkerID: "metrics-run", Registry: reg, Observer: m, Logger: zaptest.NewLogger(t),
		Options: claimer.Options{ShutdownTimeout: time.Hour},
	})
	require.NoError(t, err)
	l, err := metrics.Listen("127.0.0.1:0")
	require.NoError(t, err)
	url := "http://" + l.Addr().String() + "/healthz"

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	ran := make(chan error, 1)
	go func() { ran <- m.Run(ctx, w, l, zaptest.NewLogger(t)) }()
	_, err = pgdispatch.Schema(schema).Enqueue(context.Background(), pool, pgdispatch.Job{Kind: "block"})
	require.NoError(t, err)
	select {
	case <-started:
	case <-time.After(30 * time.Second):
		t.Fatal("the job did not start")
	}
	code, _ := get(t, url)
	require.Equal(t, http.StatusOK, code)

	stop()
	code, _ = get(t, url)
	require.Equal(t, http.StatusOK, code, "served while the shutdown waits for the job")
	select {
	case err := <-ran:
		t.Fatalf("Run returned while a job ran: %v", err)
	default:
	}
	close(release)
	select {
	case err := <-ran:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after the job ended")
	}
	_, err = http.Get(url) //nolint:bodyclose // no response
	require.Error(t, err, "no longer served")
}
