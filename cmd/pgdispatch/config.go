package main

import (
	"fmt"
	"io"
	"net/url"
	"os"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/claimer"
	"github.com/pgdispatch/pgdispatch/cmd/pgdispatch/internal/settings"
	"github.com/pgdispatch/pgdispatch/migrations"
	"github.com/pgdispatch/pgdispatch/sweeper"
)

// The settings every command that talks to the database reads.
var connSettings = []settings.Setting{
	{Env: "DATABASE_URL", Flag: "database-url", Help: "PostgreSQL connection string. When empty, built from the AT Worker's `DB_HOST` (localhost), `DB_PORT` (5432), `DB_USER` (postgres), `DB_PASSWORD` (postgres), `DB_NAME` (at_scheduler) and `DB_SSLMODE` (disable), if any of them is set"},
	{Env: "LISTEN_DATABASE_URL", Flag: "listen-database-url", Help: "where the listener connects, where each queue's claimer holds its sleep key (one more connection per queue), and where migrations run; empty: `DATABASE_URL`. Point it past a transaction-pooling PgBouncer on `DATABASE_URL`, which then gets no startup parameters and no prepared statements ([Behind PgBouncer](operations.md#behind-pgbouncer))"},
	{Env: "DB_SCHEMA", Flag: "schema", Default: pgdispatch.DefaultSchema, Help: "schema of pgdispatch's tables; `demo` uses `pgdispatch_demo`"},
	{Env: "STATEMENT_TIMEOUT", Flag: "statement-timeout", Default: settings.DurationText(pgdispatch.DefaultStatementTimeout), Help: "bound on every database call, and the server's `statement_timeout`"},
	{Env: "LOG_LEVEL", Flag: "log-level", Default: "info", Help: "`debug`, `info`, `warn` or `error`; `demo` and `bench` use `error`"},
	{Env: "LOG_FORMAT", Flag: "log-format", Default: "json", Help: "`json` or `console`; `demo` and `bench` use `console`"},
}

// The worker's settings, for run and demo.
var workerSettings = []settings.Setting{
	{
		Env: "WORKER_ID", Flag: "worker-id", Help: "this worker's name in `locked_by` and the logs; empty: the hostname, the process id and a random suffix, as in `db-7-1234-a1b2c3`, new at each start",
		Apply: func(v *settings.Values, cfg *pgdispatch.Config, errs *[]error) {
			cfg.WorkerID = v.Str("WORKER_ID")
			if cfg.WorkerID == "" {
				var err error
				cfg.WorkerID, err = pgdispatch.DefaultWorkerID()
				*errs = append(*errs, err)
			}
		},
	},
	{
		Env: "QUEUES", Flag: "queues", Default: pgdispatch.DefaultQueue, Help: "comma-separated queues to serve, each optionally `name:concurrency`",
		Apply: func(v *settings.Values, cfg *pgdispatch.Config, errs *[]error) {
			var err error
			if cfg.Queues, err = pgdispatch.ParseQueues(v.Str("QUEUES")); err != nil {
				*errs = append(*errs, fmt.Errorf("invalid QUEUES: %w", err))
			}
		},
	},
	settings.Count("CONCURRENCY", "concurrency", claimer.DefaultConcurrency, "jobs run at once per queue; one claim takes at most the free slots, so this is also the largest claim",
		func(c *pgdispatch.Config) *int { return &c.Concurrency }),
	settings.Duration("POLL_INTERVAL", "poll-interval", claimer.DefaultPollInterval, "fallback tick that claims without a notification",
		func(c *pgdispatch.Config) *time.Duration { return &c.PollInterval }),
	settings.Duration("LEASE", "lease", claimer.DefaultLease, "how long a claimed job stays this worker's without a heartbeat; renewed every `LEASE/3`",
		func(c *pgdispatch.Config) *time.Duration { return &c.Lease }),
	settings.Duration("SWEEP_INTERVAL", "sweep-interval", sweeper.DefaultInterval, "how often expired leases are given back and old jobs purged",
		func(c *pgdispatch.Config) *time.Duration { return &c.SweepInterval }),
	settings.Count("MAX_ATTEMPTS", "max-attempts", claimer.DefaultMaxAttempts, fmt.Sprintf("attempts for jobs whose `max_attempts` is NULL; at most %d", migrations.AttemptsLimit),
		func(c *pgdispatch.Config) *int { return &c.MaxAttempts }),
	settings.Duration("JOB_TIMEOUT", "job-timeout", claimer.DefaultJobTimeout, "bound on one attempt unless the payload's `timeout` says otherwise; an attempt cut short by shutdown after running longer counts",
		func(c *pgdispatch.Config) *time.Duration { return &c.JobTimeout }),
	settings.Duration("MAX_JOB_TIMEOUT", "max-job-timeout", claimer.DefaultMaxJobTimeout, "the longest `timeout` a payload may ask for; a job that asks for more is dead at once. At least `JOB_TIMEOUT`",
		func(c *pgdispatch.Config) *time.Duration { return &c.MaxJobTimeout }),
	{
		Env: "RETRY_BACKOFF", Flag: "retry-backoff", Default: settings.DurationText(claimer.DefaultRetryBase), Help: "delay before the first retry; each later one waits 4× longer (30s, 2m, 8m, 32m, …, capped at 24h), plus up to 10 % jitter",
		Apply: func(v *settings.Values, cfg *pgdispatch.Config, errs *[]error) {
			cfg.RetryBackoff = claimer.ExponentialBackoff(v.PositiveDuration("RETRY_BACKOFF", errs))
		},
	},
	{
		Env: "RETAIN_DONE", Flag: "retain-done", Default: settings.DurationText(sweeper.DefaultRetainDone), Help: "how long done jobs are kept; `0` deletes a job as soon as it is done",
		Apply: func(v *settings.Values, cfg *pgdispatch.Config, errs *[]error) {
			if cfg.RetainDone = v.Duration("RETAIN_DONE", errs); cfg.RetainDone == 0 && v.Str("RETAIN_DONE") != "" {
				cfg.RetainDone = pgdispatch.RetainDoneNone
			}
		},
	},
	settings.Count("CLAIM_BYTES", "claim-bytes", claimer.DefaultClaimBytes, "bound on the payloads one claim loads, in bytes: a claim stops adding jobs once their size passes it (a payload stored compressed counts decompressed), and takes one job at least",
		func(c *pgdispatch.Config) *int { return &c.ClaimBytes }),
	settings.Duration("RETAIN_DEAD", "retain-dead", sweeper.DefaultRetainDead, "how long dead and cancelled jobs are kept",
		func(c *pgdispatch.Config) *time.Duration { return &c.RetainDead }),
	settings.Duration("OLDEST_XMIN_WARN", "oldest-xmin-warn", sweeper.DefaultOldestXminWarn, "warn, once each time, when the database's oldest snapshot (the transaction or replication slot that holds back vacuum) is older than this; checked at each sweep, in its first transaction",
		func(c *pgdispatch.Config) *time.Duration { return &c.OldestXminWarn }),
	settings.Duration("SHUTDOWN_TIMEOUT", "shutdown-timeout", claimer.DefaultShutdownTimeout, "how long running jobs may finish after SIGINT or SIGTERM before they are given back",
		func(c *pgdispatch.Config) *time.Duration { return &c.ShutdownTimeout }),
	{Env: "SYNCHRONOUS_COMMIT", Flag: "synchronous-commit", Default: "on", Help: "`synchronous_commit` of the worker's own connections, never the writers': `on`, `off`, `local`, `remote_write` or `remote_apply`. Claims always commit without waiting for their WAL flush; `off` does the same for outcomes, heartbeats and sweeps. After a server crash, jobs whose claim or outcome was not yet flushed run again; nothing is lost either way"},
}

// The settings of run alone.
var serveSettings = []settings.Setting{
	{Env: "METRICS_ADDR", Flag: "metrics-addr", Help: "address of the HTTP server for `/metrics`, `/healthz` and `/readyz`, such as `127.0.0.1:9090`; empty: off. They have no authentication ([Metrics and health](#metrics-and-health))"},
}

// databaseURL is DATABASE_URL, or the URL the AT Worker's DB_* variables
// describe when it is empty and any of them is set.
func databaseURL(v *settings.Values) string {
	if u := v.Str("DATABASE_URL"); u != "" {
		return u
	}
	at := map[string]string{"DB_HOST": "localhost", "DB_PORT": "5432", "DB_USER": "postgres", "DB_PASSWORD": "postgres", "DB_NAME": "at_scheduler", "DB_SSLMODE": "disable"}
	set := false
	for name := range at {
		if e := os.Getenv(name); e != "" {
			at[name], set = e, true
		}
	}
	if !set {
		return ""
	}
	u := url.URL{
		Scheme: "postgres", User: url.UserPassword(at["DB_USER"], at["DB_PASSWORD"]), Host: at["DB_HOST"] + ":" + at["DB_PORT"],
		Path: "/" + at["DB_NAME"], RawQuery: url.Values{"sslmode": {at["DB_SSLMODE"]}}.Encode(),
	}
	return u.String()
}

// newLogger returns a logger that writes to w (the command's stderr, through
// the filter of package redact).
func newLogger(level, format string, w io.Writer) (*zap.Logger, error) {
	var lvl zapcore.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("invalid LOG_LEVEL %q: want debug, info, warn or error", level)
	}
	var cfg zap.Config
	switch format {
	case "json":
		cfg = zap.NewProductionConfig()
	case "console":
		cfg = zap.NewDevelopmentConfig()
		cfg.DisableStacktrace = true
	default:
		return nil, fmt.Errorf("invalid LOG_FORMAT %q: want json or console", format)
	}
	cfg.Level = zap.NewAtomicLevelAt(lvl)
	cfg.Sampling = nil
	enc := zapcore.NewJSONEncoder(cfg.EncoderConfig)
	if format == "console" {
		enc = zapcore.NewConsoleEncoder(cfg.EncoderConfig)
	}
	sink := zapcore.Lock(zapcore.AddSync(w))
	return cfg.Build(zap.ErrorOutput(sink), zap.WrapCore(func(zapcore.Core) zapcore.Core {
		return zapcore.NewCore(enc, sink, cfg.Level)
	}))
}
