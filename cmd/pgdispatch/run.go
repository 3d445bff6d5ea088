package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/cmd/pgdispatch/internal/settings"
	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/executors/email"
	"github.com/pgdispatch/pgdispatch/executors/httpcallback"
	"github.com/pgdispatch/pgdispatch/executors/rabbitmq"
	"github.com/pgdispatch/pgdispatch/internal/tracing"
	"github.com/pgdispatch/pgdispatch/metrics"
	"github.com/pgdispatch/pgdispatch/migrations"
	"github.com/pgdispatch/pgdispatch/signing"
)

// conn is what every database command shares: the pool, schema and logger.
type conn struct {
	pool    *pgxpool.Pool
	schema  string
	timeout time.Duration
	logger  *zap.Logger
	// listenURL is LISTEN_DATABASE_URL: PostgreSQL itself, past any
	// transaction pooler of the pool.
	listenURL string
}

// openConn validates the connection settings, connects and pings.
func openConn(ctx context.Context, v *settings.Values, dbURL string) (*conn, error) {
	var errs []error
	timeout := v.PositiveDuration("STATEMENT_TIMEOUT", &errs)
	schema := v.Str("DB_SCHEMA")
	if schema == "" {
		errs = append(errs, errors.New("invalid DB_SCHEMA: must not be empty"))
	}
	logger, err := newLogger(v.Str("LOG_LEVEL"), v.Str("LOG_FORMAT"), v.Output())
	errs = append(errs, err)
	if dbURL == "" {
		errs = append(errs, errors.New("no database: set DATABASE_URL (or DB_HOST and friends), or pass --database-url"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	direct := v.Str("LISTEN_DATABASE_URL")
	pc := pgdispatch.PoolConfig{StatementTimeout: timeout, ListenURL: direct}
	if v.Has("SYNCHRONOUS_COMMIT") { // the worker commands: their own bookkeeping only
		pc.SynchronousCommit = v.Str("SYNCHRONOUS_COMMIT")
	}
	pool, err := newPool(ctx, dbURL, "DATABASE_URL", pc)
	if err != nil {
		return nil, err
	}
	if pgdispatch.BehindPooler(dbURL, direct) {
		logger.Debug("DATABASE_URL goes through a transaction pooler: LISTEN_DATABASE_URL names another server")
	}
	return &conn{pool: pool, schema: schema, timeout: timeout, logger: logger, listenURL: direct}, nil
}

// withConn connects as v says, runs f, and closes the connection.
func withConn(ctx context.Context, v *settings.Values, f func(c *conn) error) error {
	c, err := openConn(ctx, v, databaseURL(v))
	if err != nil {
		return err
	}
	defer c.pool.Close()
	return f(c)
}

// newPool connects as pgdispatch.NewPool does, naming setting in the error
// of a URL that does not parse.
func newPool(ctx context.Context, url, setting string, cfg pgdispatch.PoolConfig) (*pgxpool.Pool, error) {
	if _, err := pgxpool.ParseConfig(url); err != nil {
		return nil, fmt.Errorf("invalid %s: %w", setting, pgdispatch.ConnStringError(err))
	}
	return pgdispatch.NewPool(ctx, url, cfg)
}

// workerConfig builds the worker's config from its settings.
func workerConfig(v *settings.Values, c *conn) (pgdispatch.Config, error) {
	var errs []error
	cfg := pgdispatch.Config{Pool: c.pool, Schema: c.schema, StatementTimeout: c.timeout, Logger: c.logger}
	for _, s := range workerSettings {
		if s.Apply != nil {
			s.Apply(v, &cfg, &errs)
		}
	}
	errs = append(errs,
		refuse(cfg.MaxAttempts > migrations.AttemptsLimit, "invalid MAX_ATTEMPTS %d: at most %d, as the jobs table allows", cfg.MaxAttempts, migrations.AttemptsLimit),
		refuse(cfg.JobTimeout > cfg.MaxJobTimeout, "JOB_TIMEOUT (%s) must not exceed MAX_JOB_TIMEOUT (%s)", cfg.JobTimeout, cfg.MaxJobTimeout))
	if c.listenURL != "" {
		var err error
		cfg.ListenConnConfig, err = pgdispatch.ListenConnConfigOf(c.listenURL)
		errs = append(errs, refuse(err != nil, "invalid LISTEN_DATABASE_URL: %w", err))
	}
	return cfg, errors.Join(errs...)
}

func runCommand(ctx context.Context, args []string, _, stderr io.Writer) error {
	fs := newFlagSet("run", "Serve the queues until SIGINT or SIGTERM, then shut down gracefully.", stderr)
	v := settings.New(fs, connSettings, workerSettings, executorSettings, serveSettings, atWorkerSettings)
	migrate := fs.Bool("migrate", false, "create or upgrade the schema before starting")
	if err := parse(fs, args); err != nil {
		return err
	}
	atWorker, err := applyATWorkerSettings(v)
	if err != nil {
		return err
	}
	c, err := openConn(ctx, v, databaseURL(v))
	if err != nil {
		return err
	}
	defer c.pool.Close()
	for _, a := range atWorker {
		c.logger.Info("the AT Worker's setting stands in for pgdispatch's, which is unset",
			zap.String("at_worker", a[0]), zap.String("pgdispatch", a[1]))
	}
	cfg, err := workerConfig(v, c)
	if err != nil {
		return err
	}
	cfg.SigningKeys = signing.NewKeyring()
	if cfg.Endpoints, err = buildBreaker(v, c.pool, cfg.Schema, cfg.StatementTimeout, c.logger); err != nil {
		return err
	}
	registry, closeExecutors, err := buildRegistry(v, c.logger, cfg.WorkerID, cfg.SigningKeys, cfg.Endpoints)
	if err != nil {
		return err
	}
	defer closeExecutors()
	cfg.Registry = registry
	if *migrate {
		if err := runMigrate(ctx, c); err != nil {
			return err
		}
	}
	// The schema is checked before anything is logged (the worker checks it
	// again), so that a missing one is said in one line.
	if err := c.checkSchema(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	logExecutors(c.logger, v, registry)
	var (
		m  *metrics.Metrics
		ml net.Listener
	)
	if addr := v.Str("METRICS_ADDR"); addr != "" {
		if ml, err = metrics.Listen(addr); err != nil {
			return err
		}
		defer func() { _ = ml.Close() }()
		m = metrics.New(c.pool, registry)
		cfg.Observer = m
	}
	tp, err := tracing.NewProvider(ctx, cfg.WorkerID, c.logger)
	if err != nil {
		return err
	}
	if tp != nil {
		cfg.TracerProvider = tp
		defer tracing.Shutdown(ctx, tp, c.logger)
	}
	w, err := pgdispatch.NewWorker(cfg)
	if err != nil {
		return err
	}
	if m != nil {
		return m.Run(ctx, w, ml, c.logger)
	}
	return w.Run(ctx)
}

// logExecutors logs the executors the registry holds, pgdispatch's own
// first, and the ones the settings leave out, each with the setting it
// needs (buildRegistry registers those to fail their jobs, saying so).
func logExecutors(logger *zap.Logger, v *settings.Values, reg *executors.Registry) {
	configured, missing := reg.Describe(httpcallback.Kind, rabbitmq.Kind, email.Kind)
	if i := slices.Index(configured, httpcallback.Kind); i >= 0 && v.Str("HTTP_SIGNING_SECRET") != "" {
		configured[i] += " (signed)"
	} else if i >= 0 {
		configured[i] += " (signed when 'secrets rotate' made a secret)"
	}
	logger.Info("executors", zap.Strings("configured", configured), zap.Strings("not_configured", missing))
}

// checkSchema refuses a schema that is missing or older than this binary,
// saying what to run.
func (c *conn) checkSchema(ctx context.Context) error {
	checkCtx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	_, err := migrations.Check(checkCtx, c.pool, c.schema)
	return err
}

func migrateCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("migrate", "Create or upgrade the schema. Safe to run from many processes at once.", stderr)
	v := settings.New(fs, connSettings)
	if err := parse(fs, args); err != nil {
		return err
	}
	return withConn(ctx, v, func(c *conn) error {
		if err := runMigrate(ctx, c); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "schema %q is at version %d\n", c.schema, migrations.Latest())
		return nil
	})
}

// runMigrate migrates, past the pool's pooler if it has one
// (pgdispatch.MigrateWith).
func runMigrate(ctx context.Context, c *conn) error {
	from, to, err := pgdispatch.MigrateWith(ctx, c.pool, pgdispatch.MigrateConfig{Schema: c.schema, ListenURL: c.listenURL, StatementTimeout: c.timeout})
	if err == nil && from != to {
		c.logger.Info("migrated", zap.String("schema", c.schema), zap.Int32("from", from), zap.Int32("to", to))
	}
	return err
}

func enqueueCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("enqueue", "Add a job and print its id (the existing job's id on a dedup-key conflict, with a warning when that job differs).", stderr)
	v := settings.New(fs, connSettings)
	kind := fs.String("kind", "", "the job's kind: http_callback, rabbitmq, email, noop or a custom one (required)")
	payload := fs.String("payload", "{}", "the job's payload, as JSON")
	queue := fs.String("queue", pgdispatch.DefaultQueue, "the queue")
	runAt := fs.String("run-at", "", "when the job becomes due: RFC 3339 (2026-01-02T15:04:05Z) or a delay from now (90s, 2h)")
	priority := fs.Int("priority", 0, "smaller runs first")
	dedupKey := fs.String("dedup-key", "", "idempotency key: while a job with it exists, no new one is made")
	maxAttempts := fs.Int("max-attempts", 0, "attempts allowed (default: the worker's MAX_ATTEMPTS)")
	flowKey := fs.String("flow-key", "", "the key the flow limits of the queue apply to, such as a customer (default: none)")
	if err := parse(fs, args); err != nil {
		return err
	}
	errs := []error{
		refuse(*kind == "", "--kind is required"),
		refuse(!json.Valid([]byte(*payload)), "--payload is not valid JSON: %q", *payload),
		refuse(*priority < math.MinInt16 || *priority > math.MaxInt16, "--priority must fit in a smallint"),
		refuse(*maxAttempts < 0, "--max-attempts must not be negative"),
	}
	var at time.Time
	if *runAt != "" {
		if d, err := time.ParseDuration(*runAt); err == nil {
			at = time.Now().Add(d)
		} else if t, err := time.Parse(time.RFC3339, *runAt); err == nil {
			at = t
		} else {
			errs = append(errs, fmt.Errorf("--run-at %q: want RFC 3339 or a duration such as 90s", *runAt))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	var e pgdispatch.Enqueued
	err := onDatabase(ctx, v, 0, func(ctx context.Context, c *conn) (err error) {
		e, err = pgdispatch.Schema(c.schema).EnqueueChecked(ctx, c.pool, pgdispatch.Job{
			Kind: *kind, Payload: json.RawMessage(*payload), Queue: *queue, RunAt: at,
			Priority: int16(*priority), DedupKey: *dedupKey, MaxAttempts: *maxAttempts,
			FlowKey: *flowKey,
		})
		return err
	})
	if err != nil {
		return err
	}
	if e.Conflict {
		fmt.Fprintf(stderr, "warning: job %d holds the dedup key and differs from this job (kind, queue, payload, priority, max attempts, flow key or a later run_at): no job was created\n", e.ID)
	}
	fmt.Fprintln(stdout, e.ID)
	return nil
}
