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

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/pgdispatch/pgdispatch/claimer"
	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/listener"
	"github.com/pgdispatch/pgdispatch/migrations"
	"github.com/pgdispatch/pgdispatch/schedule"
	"github.com/pgdispatch/pgdispatch/sweeper"
	"github.com/pgdispatch/pgdispatch/triggers"
)

// DefaultSchema is the schema pgdispatch lives in unless configured otherwise.
const DefaultSchema = migrations.DefaultSchema

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
	// transaction-pooling proxy, point this past it. Default: the pool's
	// config.
	ListenConnConfig *pgx.ConnConfig
	// Schema holds the jobs table. Default: "pgdispatch".
	Schema string
	// WorkerID names this worker in locked_by and the logs. Default:
	// DefaultWorkerID().
	WorkerID string
	// Queues lists the queues to serve. Default: the "default" queue.
	Queues []Queue
	// Registry picks executors by kind. Default: executors.NewRegistry().
	Registry *executors.Registry

	// Options are each queue's claimer's: its executor slots (unless the
	// queue sets its own), lease, fallback tick, timeouts, attempts, retry
	// backoff and shutdown grace (see claimer.Options, whose zero values
	// mean its defaults).
	claimer.Options

	// SweepInterval is how often expired leases are given back and finished
	// jobs purged. Default: 30s.
	SweepInterval time.Duration
	// RetainDone is how long done jobs are kept. Default: 24h.
	RetainDone time.Duration
	// RetainDead is how long dead and cancelled jobs are kept. Default: 7 days.
	RetainDead time.Duration
	// ScheduleFallback is the longest the scheduler sleeps without a
	// wake-up: it sleeps until the next slot of the schedules table, and a
	// change to the table wakes it. Default: 5 minutes.
	ScheduleFallback time.Duration
	// StatementTimeout bounds each database call. Default: 10s.
	StatementTimeout time.Duration
	// ReconnectMin and ReconnectMax bound the listener's reconnect backoff.
	// Defaults: 100ms and 10s.
	ReconnectMin, ReconnectMax time.Duration
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
	// Logger receives all logs. Default: no logging.
	Logger *zap.Logger
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
	if cfg.Registry == nil {
		cfg.Registry = executors.NewRegistry()
	}
	if cfg.ListenConnConfig == nil {
		cfg.ListenConnConfig = cfg.Pool.Config().ConnConfig
	}
	logger := cmp.Or(cfg.Logger, zap.NewNop()).With(zap.String("worker_id", cfg.WorkerID))
	w := &Worker{cfg: cfg, logger: logger, claimers: map[string]*claimer.Claimer{}}
	for _, q := range cfg.Queues {
		if _, dup := w.claimers[q.Name]; dup {
			return nil, fmt.Errorf("pgdispatch: queue %q is listed twice", q.Name)
		}
		opts := cfg.Options
		opts.Concurrency = cmp.Or(q.Concurrency, cfg.Concurrency)
		c, err := claimer.New(claimer.Config{
			Pool: cfg.Pool, Schema: cfg.Schema, SleepConnConfig: cfg.ListenConnConfig, Queue: q.Name,
			WorkerID: cfg.WorkerID, Registry: cfg.Registry, Options: opts, StatementTimeout: cfg.StatementTimeout,
			Observer: cfg.Observer, TracerProvider: cfg.TracerProvider, Logger: logger,
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
		ReconnectMin: cfg.ReconnectMin, ReconnectMax: cfg.ReconnectMax, OnListen: cfg.OnListen, Logger: logger,
	})
	if err != nil {
		return nil, fmt.Errorf("pgdispatch: %w", err)
	}
	w.sweeper, err = sweeper.New(sweeper.Config{
		Pool: cfg.Pool, Schema: cfg.Schema, Interval: cfg.SweepInterval,
		RetainDone: cfg.RetainDone, PurgeDoneAtOnce: cfg.DeleteDone, RetainDead: cfg.RetainDead,
		MaxAttempts: cfg.MaxAttempts, StatementTimeout: cfg.StatementTimeout, Logger: logger,
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
	return w, nil
}

func (w *Worker) wake(queue string) {
	if c, ok := w.claimers[queue]; ok {
		c.Wake()
	}
}

// control acts on a message of pgdispatch's SQL functions (triggers.Control):
// cancel() names the running jobs it cancelled, whose claimers beat at
// once and stop the runs whose rows are no longer theirs (claimer.Cancel),
// and a change to the schedules table wakes the scheduler.
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
	if len(msg.Cancel) == 0 {
		return
	}
	for _, c := range w.claimers {
		c.Cancel(msg.Cancel)
	}
}

// wakeAll runs when the listener has connected again: whatever was notified
// while it was away is lost, so every claimer looks for due jobs and beats
// at once, which stops runs cancelled meanwhile, and the scheduler reads
// the schedules.
func (w *Worker) wakeAll() {
	for _, c := range w.claimers {
		c.Wake()
		c.CheckRuns()
	}
	w.scheduler.Wake()
}

// Run checks the schema, then serves the queues until ctx ends and shuts down
// gracefully: it stops claiming, lets running jobs finish for
// ShutdownTimeout, gives the rest back to pending and writes the last
// outcomes. It returns nil after a clean shutdown, and when ctx ends before
// the schema check is done: nothing had started.
func (w *Worker) Run(ctx context.Context) error {
	checkCtx, cancel := context.WithTimeout(ctx, cmp.Or(w.cfg.StatementTimeout, 10*time.Second))
	_, err := migrations.Check(checkCtx, w.cfg.Pool, w.cfg.Schema)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			w.logger.Info("worker stopped before it started")
			return nil
		}
		return err
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

// Migrate brings schema up to date on pool; see package migrations.
func Migrate(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	_, _, err := migrations.Migrate(ctx, pool, migrations.Config{Schema: schema})
	return err
}

// ID is the worker's id, as it appears in locked_by.
func (w *Worker) ID() string { return w.cfg.WorkerID }
