package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/claimer"
	"github.com/pgdispatch/pgdispatch/migrations"
	"github.com/pgdispatch/pgdispatch/sweeper"
)

// setting is one configuration value: an environment variable and the flag
// that overrides it. Flags win over the environment, which wins over .env.
// Secrets have no flag, so that they never show in a process listing.
// Usage shows a flag's built-in default, never the environment's value,
// which may hold a password (DATABASE_URL); what is printed passes through
// the filter of package redact. A worker's setting carries apply, which
// parses its value into the worker's config; its default is the package's
// own, so that it is written once. help is its meaning in Markdown, from
// which the setting tables of docs/reference.md are generated (go test
// -run TestReference -update); --help prints it plain.
type setting struct {
	env, flag, def, help string
	apply                func(v *values, cfg *pgdispatch.Config, errs *[]error)
	// standsFor, of an AT Worker setting, is the pgdispatch setting it stands
	// in for, read in unit ("s", "m", or "" for a count).
	standsFor, unit string
}

// The settings every command that talks to the database reads.
var connSettings = []setting{
	{env: "DATABASE_URL", flag: "database-url", help: "PostgreSQL connection string. When empty, built from the AT Worker's `DB_HOST` (localhost), `DB_PORT` (5432), `DB_USER` (postgres), `DB_PASSWORD` (postgres), `DB_NAME` (at_scheduler) and `DB_SSLMODE` (disable), if any of them is set"},
	{env: "LISTEN_DATABASE_URL", flag: "listen-database-url", help: "where the listener connects, where each queue's claimer holds its sleep key (one more connection per queue), and where migrations run; empty: `DATABASE_URL`. Point it past a transaction-pooling PgBouncer on `DATABASE_URL`, which then gets no startup parameters and no prepared statements ([Behind PgBouncer](operations.md#behind-pgbouncer))"},
	{env: "DB_SCHEMA", flag: "schema", def: pgdispatch.DefaultSchema, help: "schema of pgdispatch's tables; `demo` uses `pgdispatch_demo`"},
	{env: "STATEMENT_TIMEOUT", flag: "statement-timeout", def: durationText(pgdispatch.DefaultStatementTimeout), help: "bound on every database call, and the server's `statement_timeout`"},
	{env: "LOG_LEVEL", flag: "log-level", def: "info", help: "`debug`, `info`, `warn` or `error`; `demo` and `bench` use `error`"},
	{env: "LOG_FORMAT", flag: "log-format", def: "json", help: "`json` or `console`; `demo` and `bench` use `console`"},
}

// The worker's settings, for run and demo.
var workerSettings = []setting{
	{
		env: "WORKER_ID", flag: "worker-id", help: "this worker's name in `locked_by` and the logs; empty: the hostname, the process id and a random suffix, as in `db-7-1234-a1b2c3`, new at each start",
		apply: func(v *values, cfg *pgdispatch.Config, errs *[]error) {
			cfg.WorkerID = v.str("WORKER_ID")
			if cfg.WorkerID == "" {
				var err error
				cfg.WorkerID, err = pgdispatch.DefaultWorkerID()
				*errs = append(*errs, err)
			}
		},
	},
	{
		env: "QUEUES", flag: "queues", def: pgdispatch.DefaultQueue, help: "comma-separated queues to serve, each optionally `name:concurrency`",
		apply: func(v *values, cfg *pgdispatch.Config, errs *[]error) {
			var err error
			if cfg.Queues, err = pgdispatch.ParseQueues(v.str("QUEUES")); err != nil {
				*errs = append(*errs, fmt.Errorf("invalid QUEUES: %w", err))
			}
		},
	},
	countSetting("CONCURRENCY", "concurrency", claimer.DefaultConcurrency, "jobs run at once per queue; one claim takes at most the free slots, so this is also the largest claim",
		func(c *pgdispatch.Config) *int { return &c.Concurrency }),
	durationSetting("POLL_INTERVAL", "poll-interval", claimer.DefaultPollInterval, "fallback tick that claims without a notification",
		func(c *pgdispatch.Config) *time.Duration { return &c.PollInterval }),
	durationSetting("LEASE", "lease", claimer.DefaultLease, "how long a claimed job stays this worker's without a heartbeat; renewed every `LEASE/3`",
		func(c *pgdispatch.Config) *time.Duration { return &c.Lease }),
	durationSetting("SWEEP_INTERVAL", "sweep-interval", sweeper.DefaultInterval, "how often expired leases are given back and old jobs purged",
		func(c *pgdispatch.Config) *time.Duration { return &c.SweepInterval }),
	countSetting("MAX_ATTEMPTS", "max-attempts", claimer.DefaultMaxAttempts, fmt.Sprintf("attempts for jobs whose `max_attempts` is NULL; at most %d", migrations.AttemptsLimit),
		func(c *pgdispatch.Config) *int { return &c.MaxAttempts }),
	durationSetting("JOB_TIMEOUT", "job-timeout", claimer.DefaultJobTimeout, "bound on one attempt unless the payload's `timeout` says otherwise; an attempt cut short by shutdown after running longer counts",
		func(c *pgdispatch.Config) *time.Duration { return &c.JobTimeout }),
	durationSetting("MAX_JOB_TIMEOUT", "max-job-timeout", claimer.DefaultMaxJobTimeout, "the longest `timeout` a payload may ask for; a job that asks for more is dead at once. At least `JOB_TIMEOUT`",
		func(c *pgdispatch.Config) *time.Duration { return &c.MaxJobTimeout }),
	{
		env: "RETRY_BACKOFF", flag: "retry-backoff", def: durationText(claimer.DefaultRetryBase), help: "delay before the first retry; each later one waits 4× longer (30s, 2m, 8m, 32m, …, capped at 24h), plus up to 10 % jitter",
		apply: func(v *values, cfg *pgdispatch.Config, errs *[]error) {
			cfg.RetryBackoff = claimer.ExponentialBackoff(v.positiveDuration("RETRY_BACKOFF", errs))
		},
	},
	{
		env: "RETAIN_DONE", flag: "retain-done", def: durationText(sweeper.DefaultRetainDone), help: "how long done jobs are kept; `0` deletes a job as soon as it is done",
		apply: func(v *values, cfg *pgdispatch.Config, errs *[]error) {
			if cfg.RetainDone = v.duration("RETAIN_DONE", errs); cfg.RetainDone == 0 && v.str("RETAIN_DONE") != "" {
				cfg.RetainDone = pgdispatch.RetainDoneNone
			}
		},
	},
	countSetting("CLAIM_BYTES", "claim-bytes", claimer.DefaultClaimBytes, "bound on the payloads one claim loads, in bytes: a claim stops adding jobs once their size passes it (a payload stored compressed counts decompressed), and takes one job at least",
		func(c *pgdispatch.Config) *int { return &c.ClaimBytes }),
	durationSetting("RETAIN_DEAD", "retain-dead", sweeper.DefaultRetainDead, "how long dead and cancelled jobs are kept",
		func(c *pgdispatch.Config) *time.Duration { return &c.RetainDead }),
	durationSetting("OLDEST_XMIN_WARN", "oldest-xmin-warn", sweeper.DefaultOldestXminWarn, "warn, once each time, when the database's oldest snapshot (the transaction or replication slot that holds back vacuum) is older than this; checked after each sweep",
		func(c *pgdispatch.Config) *time.Duration { return &c.OldestXminWarn }),
	durationSetting("SHUTDOWN_TIMEOUT", "shutdown-timeout", claimer.DefaultShutdownTimeout, "how long running jobs may finish after SIGINT or SIGTERM before they are given back",
		func(c *pgdispatch.Config) *time.Duration { return &c.ShutdownTimeout }),
	{env: "SYNCHRONOUS_COMMIT", flag: "synchronous-commit", def: "on", help: "`synchronous_commit` of the worker's own connections, never the writers': `on`, `off`, `local`, `remote_write` or `remote_apply`. Claims always commit without waiting for their WAL flush; `off` does the same for outcomes, heartbeats and sweeps. After a server crash, jobs whose claim or outcome was not yet flushed run again; nothing is lost either way"},
}

// durationSetting is a setting of a positive duration, field of the
// worker's config.
func durationSetting(env, flag string, def time.Duration, help string, field func(*pgdispatch.Config) *time.Duration) setting {
	return setting{
		env: env, flag: flag, def: durationText(def), help: help,
		apply: func(v *values, cfg *pgdispatch.Config, errs *[]error) { *field(cfg) = v.positiveDuration(env, errs) },
	}
}

// countSetting is a setting of a whole number above 0, field of the
// worker's config.
func countSetting(env, flag string, def int, help string, field func(*pgdispatch.Config) *int) setting {
	return setting{
		env: env, flag: flag, def: strconv.Itoa(def), help: help,
		apply: func(v *values, cfg *pgdispatch.Config, errs *[]error) { *field(cfg) = v.positiveInt(env, errs) },
	}
}

// durationText writes d as a setting's default is written: "30s", "5m",
// "1h", "168h".
func durationText(d time.Duration) string {
	switch {
	case d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d%time.Minute == 0:
		return fmt.Sprintf("%dm", d/time.Minute)
	}
	return d.String()
}

// The settings of run alone.
var serveSettings = []setting{
	{env: "METRICS_ADDR", flag: "metrics-addr", help: "address of the HTTP server for `/metrics`, `/healthz` and `/readyz`, such as `127.0.0.1:9090`; empty: off. They have no authentication ([Metrics and health](#metrics-and-health))"},
}

// withDefaults returns a copy of settings with other defaults, by variable.
func withDefaults(settings []setting, defaults map[string]string) []setting {
	out := make([]setting, len(settings))
	copy(out, settings)
	for i := range out {
		if d, ok := defaults[out[i].env]; ok {
			out[i].def = d
		}
	}
	return out
}

// values holds the settings of one command once flags are parsed.
type values struct {
	fs    *flag.FlagSet
	vals  map[string]*string // by env name
	flags map[string]string  // flag names, by env name
}

func newValues(fs *flag.FlagSet, groups ...[]setting) *values {
	v := &values{fs: fs, vals: map[string]*string{}, flags: map[string]string{}}
	for _, g := range groups {
		for _, s := range g {
			def := s.def
			if e, ok := os.LookupEnv(s.env); ok {
				def = e
			}
			if s.flag == "" {
				v.vals[s.env] = &def
				continue
			}
			// Registered with the built-in default, which usage prints; the
			// environment's value is set after.
			p := fs.String(s.flag, s.def, plain(s.help)+" ($"+s.env+")")
			*p = def
			v.vals[s.env], v.flags[s.env] = p, s.flag
		}
	}
	return v
}

var (
	markdownLink = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)    // [text](target)
	seeAlso      = regexp.MustCompile(` \(\[[^\]]*\]\([^)]*\)\)`) // " ([text](target))"
)

// plain is help without its Markdown: no pointer to elsewhere in the docs,
// links' text, and code spans' code.
func plain(help string) string {
	help = markdownLink.ReplaceAllString(seeAlso.ReplaceAllString(help, ""), "$1")
	return strings.ReplaceAll(help, "`", "")
}

func (v *values) str(env string) string { return strings.TrimSpace(*v.vals[env]) }

func (v *values) has(env string) bool { _, ok := v.vals[env]; return ok }

func (v *values) duration(env string, errs *[]error) time.Duration {
	d, err := parseDuration(v.str(env))
	if err != nil {
		*errs = append(*errs, fmt.Errorf("invalid %s %q: %w", env, v.str(env), err))
	}
	return d
}

func (v *values) positiveDuration(env string, errs *[]error) time.Duration {
	d, err := parseDuration(v.str(env))
	if err == nil && d == 0 {
		err = errors.New("must be more than 0")
	}
	if err != nil {
		*errs = append(*errs, fmt.Errorf("invalid %s %q: %w", env, v.str(env), err))
	}
	return d
}

func (v *values) positiveInt(env string, errs *[]error) int {
	n, err := strconv.Atoi(v.str(env))
	if err != nil || n <= 0 {
		*errs = append(*errs, fmt.Errorf("invalid %s %q: must be a whole number above 0", env, v.str(env)))
	}
	return n
}

// parseDuration reads a Go duration ("30s", "5m") or a whole number of
// seconds, as the AT Worker's settings were.
func parseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if n, nerr := strconv.Atoi(s); nerr == nil {
		d, err = time.Duration(n)*time.Second, nil
	}
	switch {
	case err != nil:
		return 0, errors.New(`want a duration such as "30s" or "5m", or a number of seconds`)
	case d < 0:
		return 0, errors.New("must not be negative")
	}
	return d, nil
}

// databaseURL is DATABASE_URL, or the URL the AT Worker's DB_* variables
// describe when it is empty and any of them is set.
func (v *values) databaseURL() string {
	if u := v.str("DATABASE_URL"); u != "" {
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
