// Package pgdispatch dispatches jobs from a PostgreSQL table with low latency.
//
// Any writer creates a job with an INSERT into the jobs table, a call to the
// enqueue() SQL function, or Enqueue from Go. A trigger sends NOTIFY; a
// Worker's listener wakes the claimer of the job's queue, which claims due
// jobs with FOR UPDATE SKIP LOCKED and runs each through the executor
// registered for its kind. docs/reference.md describes the SQL interface.
package pgdispatch

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/pgdispatch/pgdispatch/atworker"
	"github.com/pgdispatch/pgdispatch/claimer"
	"github.com/pgdispatch/pgdispatch/endpoints"
	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/stmttimeout"
	"github.com/pgdispatch/pgdispatch/listener"
	"github.com/pgdispatch/pgdispatch/migrations"
	"github.com/pgdispatch/pgdispatch/schedule"
	"github.com/pgdispatch/pgdispatch/signing"
	"github.com/pgdispatch/pgdispatch/sweeper"
	"github.com/pgdispatch/pgdispatch/triggers"
)

// DefaultSchema is the schema pgdispatch lives in unless configured otherwise.
const DefaultSchema = migrations.DefaultSchema

// DefaultStatementTimeout bounds each database call of a Worker, a pool
// from NewPool, Enqueue (when its context has no deadline), and the
// packages under this one, unless configured otherwise.
const DefaultStatementTimeout = stmttimeout.Default

// RetainDoneNone, as Config.RetainDone, deletes each job as soon as it is
// done, in the transaction that records its outcome; the sweeper deletes
// any left, whatever their age.
const RetainDoneNone time.Duration = -1

// defaultConnectTimeout bounds each new connection, of a pool from NewPool,
// the listener or a sleep key, unless its config sets its own.
const defaultConnectTimeout = 10 * time.Second

// DefaultQueue is the queue of jobs that name none.
const DefaultQueue = "default"

// Queue is a queue a worker serves, with its own executor slots.
type Queue struct {
	Name string
	// Concurrency is how many of its jobs run at once. Default:
	// Config.Concurrency.
	Concurrency int
}

// Config configures a Worker. The zero value of every optional field means
// its default.
type Config struct {
	// Pool runs the claims, completions and sweeps. Required.
	Pool *pgxpool.Pool
	// ListenConnConfig is where the listener connects, and where each
	// claimer holds its queue's sleep key while it sleeps: both need a
	// session of their own, so for a setup whose pool goes through a
	// transaction-pooling proxy, point this past it (ListenConnConfigOf
	// parses a URL). Default: the pool's config. Either way, a connect
	// timeout of 10s unless it sets one, and the application_name
	// "pgdispatch-listener" unless it names another than "pgdispatch".
	ListenConnConfig *pgx.ConnConfig
	// Schema holds the jobs table. Default: "pgdispatch".
	Schema string
	// WorkerID names this worker in locked_by and the logs. Default:
	// DefaultWorkerID().
	WorkerID string
	// Queues lists the queues to serve, each named once, by a name of at
	// most migrations.NameLimit characters (see CheckQueues). Default: the
	// "default" queue.
	Queues []Queue
	// Registry picks executors by kind. Default: executors.NewRegistry().
	Registry *executors.Registry

	// Options are each queue's claimer's: its executor slots (unless the
	// queue sets its own), lease, fallback tick, timeouts, attempts, retry
	// backoff and shutdown grace (see claimer.Options, whose zero values
	// mean its defaults).
	claimer.Options

	// SweepInterval is how often expired leases are given back and finished
	// jobs purged, and how often the outcomes of jobs of an AT Worker's
	// switched table are written into its rows (atworker.Settler).
	// Default: 30s.
	SweepInterval time.Duration
	// RetainDone is how long done jobs are kept. RetainDoneNone deletes
	// each job as soon as it is done. Default: 24h.
	RetainDone time.Duration
	// RetainDead is how long dead and cancelled jobs are kept. Default: 7 days.
	RetainDead time.Duration
	// OldestXminWarn is the age of the database's oldest snapshot past which
	// the sweeper warns, once each time it rises past it: a transaction
	// that holds back vacuum slows every claim while it lasts (see
	// sweeper.Sweeper.OldestXmin). Default: 5 minutes.
	OldestXminWarn time.Duration
	// ScheduleFallback is the longest the scheduler sleeps without a
	// wake-up: it sleeps until the next slot of the schedules table, and a
	// change to the table wakes it. Default: 5 minutes.
	ScheduleFallback time.Duration
	// StatementTimeout bounds each database call. Default:
	// DefaultStatementTimeout (10s).
	StatementTimeout time.Duration
	// OnListen, when set, is called each time the listener has (re)connected
	// and LISTEN is in place. It must not block. For health checks and tests.
	OnListen func()
	// Observer, when set, is told of every job's start and outcome, for
	// metrics (see package metrics). Its methods must not block.
	Observer claimer.Observer
	// TracerProvider, when set, traces every attempt with OpenTelemetry:
	// a span per attempt, a child of the writer's span when the job
	// carries its traceparent, with the spans of its wait, claim and
	// outcome write, and its context sent on to the receivers (see
	// "Tracing" in docs/operations.md). Default: nil, no tracing, at no
	// cost per job. pgdispatch run builds one from the OTEL_* environment.
	TracerProvider trace.TracerProvider
	// SigningKeys, when set, is kept filled with the schema's signing
	// secrets in force (the signing_secrets table): Run reads them before
	// it claims any job, and fails when it cannot, and reads them again
	// when a rotation notifies and after the listener connects again. Give
	// the same keyring to the http_callback executor
	// (httpcallback.Config.Keyring).
	SigningKeys *signing.Keyring
	// Endpoints, when set, is the circuit breakers of the schema's
	// endpoints: Run reads the open ones before it claims any job, and
	// fails when it cannot, reads them again when a change notifies,
	// after the listener connects again and, while one is not closed,
	// every few seconds, and writes
	// the outcomes it counted every second and once its jobs have ended.
	// Give the same Breaker to the http_callback executor
	// (httpcallback.Config.Breaker).
	Endpoints *endpoints.Breaker
	// Logger receives all logs. Default: no logging.
	Logger *zap.Logger

	// reconnectMin and reconnectMax bound the listener's reconnect backoff,
	// in the tests. Default: the listener's (100ms to 10s).
	reconnectMin, reconnectMax time.Duration
}

// Worker runs a listener, a claimer per queue, a sweeper and a scheduler.
// Create it with NewWorker and start it with Run.
type Worker struct {
	cfg       Config
	logger    *zap.Logger
	listener  *listener.Listener
	claimers  map[string]*claimer.Claimer
	sweeper   *sweeper.Sweeper
	scheduler *schedule.Scheduler
	settler   *atworker.Settler
	secrets   *signing.Refresher // nil without Config.SigningKeys
}

// DefaultWorkerID returns a new name for a worker: the hostname, the
// process id and six random hex digits (db-7-1234-a1b2c3), so that two
// workers on one host, or in one process, are told apart in locked_by and
// the logs, and each still says where it runs. The suffix tells apart
// processes of equal pid on hosts of equal name, such as containers.
func DefaultWorkerID() (string, error) {
	host, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("no hostname: %w", err)
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return host + "-" + strconv.Itoa(os.Getpid()) + "-" + hex.EncodeToString(b), nil
}

// NewWorker checks cfg and builds a Worker.
func NewWorker(cfg Config) (*Worker, error) {
	if cfg.Pool == nil {
		return nil, errors.New("pgdispatch: Pool is required")
	}
	cfg.Schema = cmp.Or(cfg.Schema, DefaultSchema)
	if cfg.WorkerID == "" {
		id, err := DefaultWorkerID()
		if err != nil {
			return nil, fmt.Errorf("pgdispatch: WorkerID not set: %w", err)
		}
		cfg.WorkerID = id
	}
	if len(cfg.Queues) == 0 {
		cfg.Queues = []Queue{{Name: DefaultQueue}}
	}
	if err := CheckQueues(cfg.Queues); err != nil {
		return nil, fmt.Errorf("pgdispatch: %w", err)
	}
	if cfg.RetainDone < 0 && cfg.RetainDone != RetainDoneNone {
		return nil, errors.New("pgdispatch: RetainDone must not be negative, but RetainDoneNone")
	}
	if cfg.Registry == nil {
		cfg.Registry = executors.NewRegistry()
	}
	cfg.ListenConnConfig = listenConnConfig(cmp.Or(cfg.ListenConnConfig, cfg.Pool.Config().ConnConfig))
	cfg.StatementTimeout = cmp.Or(cfg.StatementTimeout, DefaultStatementTimeout)
	cfg.SweepInterval = cmp.Or(cfg.SweepInterval, sweeper.DefaultInterval)
	deleteDone := cfg.RetainDone == RetainDoneNone
	logger := cmp.Or(cfg.Logger, zap.NewNop()).With(zap.String("worker_id", cfg.WorkerID))
	w := &Worker{cfg: cfg, logger: logger, claimers: map[string]*claimer.Claimer{}}
	for _, q := range cfg.Queues {
		opts := cfg.Options
		opts.Concurrency = cmp.Or(q.Concurrency, cfg.Concurrency)
		c, err := claimer.New(claimer.Config{
			Pool: cfg.Pool, Schema: cfg.Schema, SleepConnConfig: cfg.ListenConnConfig, Queue: q.Name,
			WorkerID: cfg.WorkerID, Registry: cfg.Registry, Options: opts, DeleteDone: deleteDone,
			StatementTimeout: cfg.StatementTimeout, Observer: cfg.Observer, TracerProvider: cfg.TracerProvider, Logger: logger,
		})
		if err != nil {
			return nil, fmt.Errorf("pgdispatch: queue %q: %w", q.Name, err)
		}
		w.claimers[q.Name] = c
	}

	var err error
	w.listener, err = listener.New(listener.Config{
		ConnConfig: cfg.ListenConnConfig, Channel: triggers.Channel(cfg.Schema),
		Wake: w.wake, WakeAll: w.wakeAll, ControlChannel: triggers.ControlChannel, Control: w.control,
		ReconnectMin: cfg.reconnectMin, ReconnectMax: cfg.reconnectMax, OnListen: cfg.OnListen, Logger: logger,
	})
	if err != nil {
		return nil, fmt.Errorf("pgdispatch: %w", err)
	}
	w.sweeper, err = sweeper.New(sweeper.Config{
		Pool: cfg.Pool, Schema: cfg.Schema, Interval: cfg.SweepInterval,
		RetainDone: cfg.RetainDone, RetainDead: cfg.RetainDead,
		MaxAttempts: cfg.MaxAttempts, StatementTimeout: cfg.StatementTimeout, OldestXminWarn: cfg.OldestXminWarn, Logger: logger,
	})
	if err != nil {
		return nil, fmt.Errorf("pgdispatch: %w", err)
	}
	w.scheduler, err = schedule.New(schedule.Config{
		Pool: cfg.Pool, Schema: cfg.Schema, Fallback: cfg.ScheduleFallback,
		StatementTimeout: cfg.StatementTimeout, Logger: logger,
	})
	if err != nil {
		return nil, fmt.Errorf("pgdispatch: %w", err)
	}
	w.settler, err = atworker.NewSettler(atworker.SettlerConfig{
		DB: cfg.Pool, Schema: cfg.Schema, Interval: cfg.SweepInterval, StatementTimeout: cfg.StatementTimeout, Logger: logger,
	})
	if err != nil {
		return nil, fmt.Errorf("pgdispatch: %w", err)
	}
	if cfg.SigningKeys != nil {
		w.secrets, err = signing.NewRefresher(signing.RefresherConfig{
			DB: cfg.Pool, Schema: cfg.Schema, Keyring: cfg.SigningKeys, StatementTimeout: cfg.StatementTimeout, Logger: logger,
		})
		if err != nil {
			return nil, fmt.Errorf("pgdispatch: %w", err)
		}
	}
	return w, nil
}

// ParseQueues reads a comma-separated list of queues, each a name and
// optionally its concurrency ("default,emails:4"), as QUEUES holds it,
// and checks them (CheckQueues).
func ParseQueues(s string) ([]Queue, error) {
	var qs []Queue
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		name, conc, hasConc := strings.Cut(part, ":")
		q := Queue{Name: strings.TrimSpace(name)}
		if hasConc {
			n, err := strconv.Atoi(strings.TrimSpace(conc))
			if err != nil || n <= 0 {
				return nil, fmt.Errorf("%q: the concurrency of queue %q must be a whole number above 0", s, q.Name)
			}
			q.Concurrency = n
		}
		qs = append(qs, q)
	}
	if len(qs) == 0 {
		return nil, fmt.Errorf("%q names no queue", s)
	}
	return qs, CheckQueues(qs)
}

// CheckQueues reports a queue with no name, or a name longer than the
// jobs table allows, or listed twice, or a negative concurrency.
func CheckQueues(qs []Queue) error {
	seen := map[string]bool{}
	for _, q := range qs {
		switch {
		case q.Name == "":
			return errors.New("a queue has no name")
		case utf8.RuneCountInString(q.Name) > migrations.NameLimit:
			return fmt.Errorf("a queue's name has at most %d characters, as the jobs table allows", migrations.NameLimit)
		case seen[q.Name]:
			return fmt.Errorf("queue %q is listed twice", q.Name)
		case q.Concurrency < 0:
			return fmt.Errorf("the concurrency of queue %q must not be negative", q.Name)
		}
		seen[q.Name] = true
	}
	return nil
}

// ListenConnConfigOf parses url, the URL of PostgreSQL itself past any
// transaction-pooling proxy, for Config.ListenConnConfig. Its error does
// not repeat the URL (ConnStringError).
func ListenConnConfigOf(url string) (*pgx.ConnConfig, error) {
	cc, err := pgx.ParseConfig(url)
	if err != nil {
		return nil, ConnStringError(err)
	}
	return cc, nil
}

// ListenConnConfigFor is the connection config of a listener beside pool,
// such as the console's: listenURL's (ListenConnConfigOf) when it is set,
// else the pool's, with the listener's defaults.
func ListenConnConfigFor(pool *pgxpool.Pool, listenURL string) (*pgx.ConnConfig, error) {
	if listenURL == "" {
		return listenConnConfig(pool.Config().ConnConfig), nil
	}
	cc, err := ListenConnConfigOf(listenURL)
	if err != nil {
		return nil, err
	}
	return listenConnConfig(cc), nil
}

// listenConnConfig is a copy of cc with the listener's defaults: a connect
// timeout, and its session named unless cc names it (a pool from NewPool
// names its sessions "pgdispatch").
func listenConnConfig(cc *pgx.ConnConfig) *pgx.ConnConfig {
	cc = cc.Copy()
	if cc.ConnectTimeout == 0 {
		cc.ConnectTimeout = defaultConnectTimeout
	}
	if cc.RuntimeParams == nil {
		cc.RuntimeParams = map[string]string{}
	}
	if app := cc.RuntimeParams["application_name"]; app == "" || app == "pgdispatch" {
		cc.RuntimeParams["application_name"] = "pgdispatch-listener"
	}
	return cc
}

func (w *Worker) wake(queue string) {
	if c, ok := w.claimers[queue]; ok {
		c.Wake()
	}
}

// control acts on a message of pgdispatch's SQL functions (triggers.Control):
// cancel() names the running jobs it cancelled, whose claimers beat at
// once and stop the runs whose rows are no longer theirs (claimer.Cancel),
// a change to the schedules table wakes the scheduler, a rotation of the
// signing secrets has them read again, and a change of an endpoint's
// circuit has the endpoints read again.
func (w *Worker) control(payload string) {
	var msg triggers.Control
	if err := json.Unmarshal([]byte(payload), &msg); err != nil {
		// Anyone may NOTIFY: at debug, so that a flood cannot fill the logs.
		w.logger.Debug("a control notification did not parse; ignored", zap.Error(err), zap.Int("bytes", len(payload)))
		return
	}
	if msg.Schema != w.cfg.Schema {
		return
	}
	if msg.Schedules {
		w.scheduler.Wake()
	}
	if msg.Secrets && w.secrets != nil {
		w.secrets.Wake()
	}
	if msg.Endpoints && w.cfg.Endpoints != nil {
		w.cfg.Endpoints.Wake()
	}
	if len(msg.Cancel) == 0 {
		return
	}
	for _, c := range w.claimers {
		c.Cancel(msg.Cancel)
	}
}

// wakeAll runs when the listener has connected again: whatever was notified
// while it was away is lost, so every claimer looks for due jobs and beats
// at once, which stops runs cancelled meanwhile, the scheduler reads
// the schedules, and the signing secrets and the endpoints' circuits are
// read again.
func (w *Worker) wakeAll() {
	for _, c := range w.claimers {
		c.Wake()
		c.CheckRuns()
	}
	w.scheduler.Wake()
	if w.secrets != nil {
		w.secrets.Wake()
	}
	if w.cfg.Endpoints != nil {
		w.cfg.Endpoints.Wake()
	}
}

// beforeStart is Run's answer to err, met before anything started: nil
// when ctx ended meanwhile, else err.
func (w *Worker) beforeStart(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		w.logger.Info("worker stopped before it started")
		return nil
	}
	return err
}

// Run checks the schema, then serves the queues until ctx ends and shuts down
// gracefully: it stops claiming, lets running jobs finish for
// ShutdownTimeout, gives the rest back to pending and writes the last
// outcomes. It returns nil after a clean shutdown, and when ctx ends before
// the schema check is done: nothing had started.
func (w *Worker) Run(ctx context.Context) error {
	checkCtx, cancel := context.WithTimeout(ctx, w.cfg.StatementTimeout)
	_, err := migrations.Check(checkCtx, w.cfg.Pool, w.cfg.Schema)
	cancel()
	if err != nil {
		return w.beforeStart(ctx, err)
	}
	if w.secrets != nil {
		if err := w.secrets.Load(ctx); err != nil {
			return w.beforeStart(ctx, fmt.Errorf("pgdispatch: %w", err))
		}
		defer w.cfg.SigningKeys.Stop()
	}
	if w.cfg.Endpoints != nil {
		if err := w.cfg.Endpoints.Load(ctx); err != nil {
			return w.beforeStart(ctx, fmt.Errorf("pgdispatch: %w", err))
		}
		// The breaker outlives the claimers, so that it writes the
		// outcomes of the last jobs.
		bctx, stop := context.WithCancel(context.WithoutCancel(ctx))
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = w.cfg.Endpoints.Run(bctx)
		}()
		defer func() {
			stop()
			<-done
		}()
	}
	queues := make([]string, 0, len(w.claimers))
	for q := range w.claimers {
		queues = append(queues, q)
	}
	w.logger.Info("worker started", zap.String("database", database(w.cfg.Pool.Config().ConnConfig)),
		zap.String("schema", w.cfg.Schema), zap.Strings("queues", queues), zap.Strings("kinds", w.cfg.Registry.Kinds()))

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return w.listener.Run(gctx) })
	g.Go(func() error { return w.sweeper.Run(gctx) })
	g.Go(func() error { return w.scheduler.Run(gctx) })
	g.Go(func() error { return w.settler.Run(gctx) })
	if w.secrets != nil {
		g.Go(func() error { return w.secrets.Run(gctx) })
	}
	for _, c := range w.claimers {
		g.Go(func() error { return c.Run(gctx) })
	}
	err = g.Wait()
	w.logger.Info("worker stopped")
	return err
}

// database names the database cc connects to, for the logs: its hosts
// and ports, and the database's name (host:port,host:port/name), without
// the user or any credential.
func database(cc *pgx.ConnConfig) string {
	hosts := []string{net.JoinHostPort(cc.Host, strconv.Itoa(int(cc.Port)))}
	for _, f := range cc.Fallbacks {
		if h := net.JoinHostPort(f.Host, strconv.Itoa(int(f.Port))); !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	return strings.Join(hosts, ",") + "/" + cc.Database
}

// Listener is the worker's listener, for health checks.
func (w *Worker) Listener() *listener.Listener { return w.listener }

// Queues lists the queues the worker serves.
func (w *Worker) Queues() []string {
	out := make([]string, 0, len(w.cfg.Queues))
	for _, q := range w.cfg.Queues {
		out = append(out, q.Name)
	}
	return out
}

// Schema is the schema the worker serves.
func (w *Worker) Schema() string { return w.cfg.Schema }

// Claimer returns the claimer of queue, for its stats.
func (w *Worker) Claimer(queue string) *claimer.Claimer { return w.claimers[queue] }

// Sweeper is the worker's sweeper.
func (w *Worker) Sweeper() *sweeper.Sweeper { return w.sweeper }

// Scheduler is the worker's scheduler.
func (w *Worker) Scheduler() *schedule.Scheduler { return w.scheduler }

// ID is the worker's id, as it appears in locked_by.
func (w *Worker) ID() string { return w.cfg.WorkerID }
