// Package metrics exposes a worker's Prometheus metrics and its health
// endpoints over HTTP.
//
// Counters kept by the worker's parts (claims, ticks, notifications,
// rescues, purges) and by executors that are prometheus.Collectors are read
// when Prometheus scrapes; the per-job counters and
// histograms are fed by the claimers through the claimer.Observer interface.
// Queue depth is sampled from the database at most once per
// DepthInterval, and only when scraped: an idle worker that nobody scrapes
// sends nothing.
package metrics

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/claimer"
	"github.com/pgdispatch/pgdispatch/executors"
)

const (
	namespace = "pgdispatch"
	// DepthInterval is how old a queue depth sample may be before a scrape
	// takes a new one.
	DepthInterval = 10 * time.Second
	// ReadyInterval is how long /readyz reuses the result of its database
	// ping: however many requests come, the database is pinged at most once
	// per interval, and requests that arrive during a ping wait for it.
	ReadyInterval = time.Second
	// queryTimeout bounds the depth query and the readiness ping.
	queryTimeout = 2 * time.Second
	// unknownKind labels jobs of kinds no executor is registered for, so that
	// rows with arbitrary kinds cannot grow the label set without bound.
	unknownKind = "unknown"
)

// Metrics is a worker's metrics. Create it with New, pass it as the
// worker's Observer, then Attach the worker and serve Handler, or let Run
// do both while it runs the worker.
type Metrics struct {
	reg   *prometheus.Registry
	pool  *pgxpool.Pool
	kinds *executors.Registry

	completed *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	latency   *prometheus.HistogramVec

	mu     sync.Mutex
	worker *pgdispatch.Worker
	depth  depthSample
	logger *zap.Logger

	// The last database ping of /readyz, and the one under way.
	pingMu  sync.Mutex
	pingAt  time.Time
	pingErr error
	pinging chan struct{} // closed when the ping under way ends; nil when none is
}

type depthSample struct {
	at        time.Time
	counts    map[[2]string]float64 // {queue, status} -> jobs
	schedules []scheduleSample
	// notifyUsage is pg_notification_queue_usage(); inserts is the jobs
	// table's n_tup_ins, rows inserted since the server's statistics were
	// reset.
	notifyUsage, inserts float64
	err                  error
}

// scheduleSample is a row of the schedules table.
type scheduleSample struct {
	name                          string
	next, last                    *float64 // unix seconds
	runs, missed, caughtUp, taken float64
	failing                       bool
}

// New creates the metrics of a worker that runs jobs from pool's schema
// with the executors in kinds.
func New(pool *pgxpool.Pool, kinds *executors.Registry) *Metrics {
	m := &Metrics{
		reg:   prometheus.NewRegistry(),
		pool:  pool,
		kinds: kinds,
		completed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "jobs_completed_total",
			Help: "Attempts finished, by queue, kind and outcome (done, retry, dead, released at shutdown, snoozed, or cancelled while running).",
		}, []string{"queue", "kind", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "job_duration_seconds",
			Help:    "How long executors ran, by queue and kind.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10), // 1ms to about 4m
		}, []string{"queue", "kind"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "dispatch_latency_seconds",
			Help:    "From a job's run_at (its insert, unless scheduled or retried) to its executor's start, by queue and kind. run_at is the database's clock.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2.5, 12), // 0.5ms to about 12s
		}, []string{"queue", "kind"}),
	}
	m.reg.MustRegister(m.completed, m.duration, m.latency, collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Executors that keep metrics of their own, such as http_callback's
	// waits for connections, are collected too.
	for _, k := range kinds.Kinds() {
		if e, ok := kinds.Lookup(k); ok {
			if c, ok := e.(prometheus.Collector); ok {
				if err := m.reg.Register(c); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
					panic(fmt.Sprintf("metrics: the %s executor's metrics: %v", k, err))
				}
			}
		}
	}
	return m
}

// Attach registers the counters that w's parts keep. Call it once, before
// serving.
func (m *Metrics) Attach(w *pgdispatch.Worker) {
	m.mu.Lock()
	m.worker = w
	m.mu.Unlock()
	m.reg.MustRegister(workerCollector{m})
}

func (m *Metrics) kind(k string) string {
	if _, ok := m.kinds.Lookup(k); ok {
		return k
	}
	return unknownKind
}

// JobStarted implements claimer.Observer.
func (m *Metrics) JobStarted(job *executors.Job) {
	m.latency.WithLabelValues(job.Queue, m.kind(job.Kind)).Observe(max(time.Since(job.RunAt), 0).Seconds())
}

// JobFinished implements claimer.Observer.
func (m *Metrics) JobFinished(job *executors.Job, outcome claimer.Outcome, took time.Duration) {
	kind := m.kind(job.Kind)
	m.completed.WithLabelValues(job.Queue, kind, string(outcome)).Inc()
	if took > 0 {
		m.duration.WithLabelValues(job.Queue, kind).Observe(took.Seconds())
	}
}

// Handler serves /metrics, /healthz (the process is alive) and /readyz (the
// database answered a ping in the last ReadyInterval and the listener is
// connected). The endpoints have no authentication: bind them where only
// the scraper and the orchestrator reach them. A 503's body names the part
// that is down; the error itself goes to the log.
func (m *Metrics) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if reason := m.ready(r.Context()); reason != "" {
			http.Error(w, "not ready: "+reason, http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	return mux
}

// ready returns why the worker is not ready, or "" when it is.
func (m *Metrics) ready(ctx context.Context) string {
	if err := m.ping(ctx); err != nil {
		return "the database does not answer"
	}
	m.mu.Lock()
	w := m.worker
	m.mu.Unlock()
	if w != nil && !w.Listener().Connected() {
		return "the listener is not connected"
	}
	return ""
}

// ping returns the result of the last database ping while it is younger
// than ReadyInterval. Otherwise it pings, or, when another request is
// pinging already, waits for that ping (or for ctx).
func (m *Metrics) ping(ctx context.Context) error {
	for {
		m.pingMu.Lock()
		if !m.pingAt.IsZero() && time.Since(m.pingAt) < ReadyInterval {
			err := m.pingErr
			m.pingMu.Unlock()
			return err
		}
		if wait := m.pinging; wait != nil {
			m.pingMu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		done := make(chan struct{})
		m.pinging = done
		m.pingMu.Unlock()

		// Not the request's context: the requests waiting share this ping.
		pingCtx, cancel := context.WithTimeout(context.Background(), queryTimeout)
		err := m.pool.Ping(pingCtx)
		cancel()
		if err != nil {
			m.mu.Lock()
			logger := m.logger
			m.mu.Unlock()
			cmp.Or(logger, zap.NewNop()).Warn("readiness: the database does not answer", zap.Error(err))
		}
		m.pingMu.Lock()
		m.pingAt, m.pingErr, m.pinging = time.Now(), err, nil
		m.pingMu.Unlock()
		close(done)
		return err
	}
}

// Listen binds addr at once, so that a port in use is an error at start.
// Serve the returned listener with Serve.
func Listen(addr string) (net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("METRICS_ADDR %q: %w", addr, err)
	}
	return l, nil
}

// Serve serves Handler on l until ctx ends, then shuts the server down.
func (m *Metrics) Serve(ctx context.Context, l net.Listener, logger *zap.Logger) error {
	m.mu.Lock()
	m.logger = logger
	m.mu.Unlock()
	srv := &http.Server{Handler: m.Handler(), ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	}()
	cmp.Or(logger, zap.NewNop()).Info("serving metrics", zap.String("addr", l.Addr().String()))
	err := srv.Serve(l)
	<-done
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("metrics server: %w", err)
}

// Run attaches w, runs it until ctx ends and its shutdown is over, and
// serves Handler on l meanwhile, so that the endpoints answer through the
// shutdown; then it stops serving. It returns w.Run's error; one of the
// server is logged.
func (m *Metrics) Run(ctx context.Context, w *pgdispatch.Worker, l net.Listener, logger *zap.Logger) error {
	m.Attach(w)
	serveCtx, stopServing := context.WithCancel(context.WithoutCancel(ctx))
	served := make(chan error, 1)
	go func() { served <- m.Serve(serveCtx, l, logger) }()
	err := w.Run(ctx)
	stopServing()
	if serveErr := <-served; serveErr != nil {
		cmp.Or(logger, zap.NewNop()).Warn("metrics server", zap.Error(serveErr))
	}
	return err
}

var (
	descClaimed = prometheus.NewDesc(namespace+"_jobs_claimed_total",
		"Jobs claimed, by queue.", []string{"queue"}, nil)
	descClaims = prometheus.NewDesc(namespace+"_claims_total",
		"Claim statements run, by queue.", []string{"queue"}, nil)
	descInFlight = prometheus.NewDesc(namespace+"_jobs_in_flight",
		"Jobs running now, by queue.", []string{"queue"}, nil)
	descTicks = prometheus.NewDesc(namespace+"_fallback_ticks_total",
		"Fallback ticks, by queue.", []string{"queue"}, nil)
	descTickHits = prometheus.NewDesc(namespace+"_fallback_ticks_found_work_total",
		"Fallback ticks that found due jobs, by queue: notifications that were missed.", []string{"queue"}, nil)
	descPaused = prometheus.NewDesc(namespace+"_queue_paused",
		"1 while the worker's last claim of the queue found it paused (pause_queue), else 0.", []string{"queue"}, nil)
	descSleeps = prometheus.NewDesc(namespace+"_claimer_sleeps_total",
		"Times a claimer went to sleep holding its queue's sleep key, after which writers notify.", []string{"queue"}, nil)
	descNotifications = prometheus.NewDesc(namespace+"_notifications_received_total",
		"Wake-up notifications the listener received on the schema's channel (not those on pgdispatch.control).", nil, nil)
	descConnected = prometheus.NewDesc(namespace+"_listener_connected",
		"1 while the listener's connection is up and LISTEN is in place, else 0.", nil, nil)
	descRescued = prometheus.NewDesc(namespace+"_jobs_rescued_total",
		"Jobs whose lease expired, given back by the sweeper: to pending, or dead when their attempts were used up.", []string{"result"}, nil)
	descPurged = prometheus.NewDesc(namespace+"_jobs_purged_total",
		"Finished jobs the sweeper deleted after their retention.", nil, nil)
	descXminAge = prometheus.NewDesc(namespace+"_oldest_xmin_age_seconds",
		"How long the database's oldest snapshot (the session or replication slot that holds back vacuum) has been held, read at each sweep; "+
			"a slot's, a standby's and an unreadable session's counted from when the sweeper first saw it. Absent until read.", nil, nil)
	descXminXids = prometheus.NewDesc(namespace+"_oldest_xmin_age_xids",
		"The age in transaction ids (age(xmin)) of the database's oldest snapshot, read at each sweep. Absent until read.", nil, nil)
	descDepth = prometheus.NewDesc(namespace+"_queue_jobs",
		"Jobs in the table by queue and status (pending, running, dead), sampled at most every 10s.", []string{"queue", "status"}, nil)
	descDepthUp = prometheus.NewDesc(namespace+"_queue_jobs_sample_ok",
		"1 when the last queue depth sample succeeded, else 0.", nil, nil)
	descNotifyUsage = prometheus.NewDesc(namespace+"_notification_queue_usage",
		"pg_notification_queue_usage(): the fraction of the server's NOTIFY queue in use, sampled with the queue depth.", nil, nil)
	descScheduleNext = prometheus.NewDesc(namespace+"_schedule_next_run_timestamp_seconds",
		"Each enabled schedule's next slot (Unix time), sampled with the queue depth; absent until a worker has computed it.", []string{"schedule"}, nil)
	descScheduleLast = prometheus.NewDesc(namespace+"_schedule_last_run_timestamp_seconds",
		"Each schedule's last slot that created a job (Unix time), sampled with the queue depth.", []string{"schedule"}, nil)
	descScheduleRuns = prometheus.NewDesc(namespace+"_schedule_runs_total",
		"Jobs each schedule created, by all workers, sampled with the queue depth.", []string{"schedule"}, nil)
	descScheduleMissed = prometheus.NewDesc(namespace+"_schedule_missed_slots_total",
		"Slots each schedule let pass without a job after downtime (catch_up skip, or past catch_up_limit), sampled with the queue depth.", []string{"schedule"}, nil)
	descScheduleCaughtUp = prometheus.NewDesc(namespace+"_schedule_caught_up_slots_total",
		"Jobs each schedule created late, for slots missed during downtime (catch_up all), sampled with the queue depth.", []string{"schedule"}, nil)
	descScheduleTaken = prometheus.NewDesc(namespace+"_schedule_taken_slots_total",
		"Slots of each schedule that created no job because a job held their dedup_key already (the schedule's warning names it), sampled with the queue depth.", []string{"schedule"}, nil)
	descScheduleFailing = prometheus.NewDesc(namespace+"_schedule_failing",
		"1 while a schedule has an error (the workers cannot compute its slots, or the jobs table refused its job) and is left alone, else 0.", []string{"schedule"}, nil)
	descSchedulerCreated = prometheus.NewDesc(namespace+"_scheduler_jobs_created_total",
		"Jobs this worker's scheduler created.", nil, nil)
	descSchedulerPasses = prometheus.NewDesc(namespace+"_scheduler_passes_total",
		"Times this worker's scheduler read or fired the schedules: at each slot, change and fallback.", nil, nil)
	descInserts = prometheus.NewDesc(namespace+"_jobs_inserted_total",
		"Rows inserted into the jobs table by any writer since the server's statistics were reset (n_tup_ins), "+
			"sampled with the queue depth. Writer transactions that skipped NOTIFY: this less notifications received.", nil, nil)
)

// workerCollector reads the worker's own counters at scrape time.
type workerCollector struct{ m *Metrics }

func (c workerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		descClaimed, descClaims, descInFlight, descTicks, descTickHits, descSleeps, descPaused,
		descNotifications, descConnected, descRescued, descPurged, descXminAge, descXminXids, descDepth, descDepthUp,
		descNotifyUsage, descInserts, descScheduleNext, descScheduleLast, descScheduleRuns, descScheduleMissed,
		descScheduleCaughtUp, descScheduleTaken, descScheduleFailing, descSchedulerCreated, descSchedulerPasses,
	} {
		ch <- d
	}
}

func (c workerCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	w := c.m.worker
	c.m.mu.Unlock()
	for _, q := range w.Queues() {
		cl := w.Claimer(q)
		s := cl.Stats()
		ch <- prometheus.MustNewConstMetric(descClaimed, prometheus.CounterValue, float64(s.Claimed), q)
		ch <- prometheus.MustNewConstMetric(descClaims, prometheus.CounterValue, float64(s.Claims), q)
		ch <- prometheus.MustNewConstMetric(descInFlight, prometheus.GaugeValue, float64(cl.Running()), q)
		ch <- prometheus.MustNewConstMetric(descTicks, prometheus.CounterValue, float64(s.Ticks), q)
		ch <- prometheus.MustNewConstMetric(descTickHits, prometheus.CounterValue, float64(s.TickHits), q)
		ch <- prometheus.MustNewConstMetric(descSleeps, prometheus.CounterValue, float64(s.Sleeps), q)
		paused := 0.0
		if s.Paused {
			paused = 1
		}
		ch <- prometheus.MustNewConstMetric(descPaused, prometheus.GaugeValue, paused, q)
	}
	l := w.Listener()
	ch <- prometheus.MustNewConstMetric(descNotifications, prometheus.CounterValue, float64(l.Notifications()))
	connected := 0.0
	if l.Connected() {
		connected = 1
	}
	ch <- prometheus.MustNewConstMetric(descConnected, prometheus.GaugeValue, connected)
	sw := w.Sweeper().Stats()
	ch <- prometheus.MustNewConstMetric(descRescued, prometheus.CounterValue, float64(sw.Rescued), "pending")
	ch <- prometheus.MustNewConstMetric(descRescued, prometheus.CounterValue, float64(sw.Killed), "dead")
	ch <- prometheus.MustNewConstMetric(descPurged, prometheus.CounterValue, float64(sw.Purged))
	if h := w.Sweeper().OldestXmin(); h.Known {
		ch <- prometheus.MustNewConstMetric(descXminAge, prometheus.GaugeValue, h.Age.Seconds())
		ch <- prometheus.MustNewConstMetric(descXminXids, prometheus.GaugeValue, float64(h.Xids))
	}
	sc := w.Scheduler().Stats()
	ch <- prometheus.MustNewConstMetric(descSchedulerCreated, prometheus.CounterValue, float64(sc.Created))
	ch <- prometheus.MustNewConstMetric(descSchedulerPasses, prometheus.CounterValue, float64(sc.Passes))

	d := c.m.sampleDepth(w.Schema(), w.Queues())
	ok := 0.0
	if d.err == nil {
		ok = 1
		for k, n := range d.counts {
			ch <- prometheus.MustNewConstMetric(descDepth, prometheus.GaugeValue, n, k[0], k[1])
		}
		ch <- prometheus.MustNewConstMetric(descNotifyUsage, prometheus.GaugeValue, d.notifyUsage)
		ch <- prometheus.MustNewConstMetric(descInserts, prometheus.CounterValue, d.inserts)
		for _, s := range d.schedules {
			if s.next != nil {
				ch <- prometheus.MustNewConstMetric(descScheduleNext, prometheus.GaugeValue, *s.next, s.name)
			}
			if s.last != nil {
				ch <- prometheus.MustNewConstMetric(descScheduleLast, prometheus.GaugeValue, *s.last, s.name)
			}
			ch <- prometheus.MustNewConstMetric(descScheduleRuns, prometheus.CounterValue, s.runs, s.name)
			ch <- prometheus.MustNewConstMetric(descScheduleMissed, prometheus.CounterValue, s.missed, s.name)
			ch <- prometheus.MustNewConstMetric(descScheduleCaughtUp, prometheus.CounterValue, s.caughtUp, s.name)
			ch <- prometheus.MustNewConstMetric(descScheduleTaken, prometheus.CounterValue, s.taken, s.name)
			failing := 0.0
			if s.failing {
				failing = 1
			}
			ch <- prometheus.MustNewConstMetric(descScheduleFailing, prometheus.GaugeValue, failing, s.name)
		}
	}
	ch <- prometheus.MustNewConstMetric(descDepthUp, prometheus.GaugeValue, ok)
}

// depthSQL counts each status through an index of its own: the claim index
// for pending, the lease index for running, the finished index for dead.
// Done jobs, the retained history, are not counted.
// Only the worker's own queues are counted, so that rows naming other
// queues cannot grow the label set.
const depthSQL = `
SELECT queue, 'pending', count(*) FROM {jobs} WHERE status = 'pending' AND queue = ANY($1) GROUP BY queue
UNION ALL
SELECT queue, 'running', count(*) FROM {jobs} WHERE status = 'running' AND queue = ANY($1) GROUP BY queue
UNION ALL
SELECT queue, 'dead', count(*) FROM {jobs} WHERE status = 'dead' AND finished_at IS NOT NULL AND queue = ANY($1) GROUP BY queue`

// schedulesSQL reads the schedules, the first 1000 by name, so that the
// label set stays bounded.
const schedulesSQL = `
SELECT name, CASE WHEN enabled AND error IS NULL THEN extract(epoch FROM next_run_at)::float8 END,
       extract(epoch FROM last_run_at)::float8, runs::float8, missed::float8, caught_up::float8, taken::float8,
       error IS NOT NULL
FROM {schedules} ORDER BY name LIMIT 1000`

// serverSQL reads the server's side of the good-neighbour figures: the NOTIFY
// queue's fill, and how many rows writers inserted (the statistics system's
// count, flushed by each backend within about a second).
const serverSQL = `SELECT pg_notification_queue_usage(), coalesce(pg_stat_get_tuples_inserted($1::regclass), 0)::float8`

// sampleDepth returns the last depth sample, taking a new one when it is
// older than DepthInterval.
func (m *Metrics) sampleDepth(schema string, queues []string) depthSample {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.depth.at.IsZero() && time.Since(m.depth.at) < DepthInterval {
		return m.depth
	}
	ctx, cancel := context.WithTimeout(context.Background(), queryTimeout)
	defer cancel()
	sample := depthSample{at: time.Now(), counts: map[[2]string]float64{}}
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	batch := &pgx.Batch{}
	batch.Queue(strings.ReplaceAll(depthSQL, "{jobs}", jobs), queues)
	batch.Queue(serverSQL, jobs)
	batch.Queue(strings.ReplaceAll(schedulesSQL, "{schedules}", pgx.Identifier{schema, "schedules"}.Sanitize()))
	results := m.pool.SendBatch(ctx, batch)
	rows, err := results.Query()
	if err == nil {
		var (
			queue, status string
			n             int64
		)
		_, err = pgx.ForEachRow(rows, []any{&queue, &status, &n}, func() error {
			sample.counts[[2]string{queue, status}] = float64(n)
			return nil
		})
	}
	if err == nil {
		err = results.QueryRow().Scan(&sample.notifyUsage, &sample.inserts)
	}
	if err == nil {
		rows, err = results.Query()
		if err == nil {
			sample.schedules, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (scheduleSample, error) {
				var s scheduleSample
				err := r.Scan(&s.name, &s.next, &s.last, &s.runs, &s.missed, &s.caughtUp, &s.taken, &s.failing)
				return s, err
			})
		}
	}
	if closeErr := results.Close(); err == nil {
		err = closeErr
	}
	sample.err = err
	m.depth = sample
	return sample
}
