package claimer

import (
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/stmttimeout"
	"github.com/pgdispatch/pgdispatch/migrations"
)

// The defaults of Options and Config.
const (
	DefaultConcurrency     = 100
	DefaultLease           = 30 * time.Second
	DefaultPollInterval    = 30 * time.Second
	DefaultJobTimeout      = 5 * time.Minute
	DefaultMaxJobTimeout   = time.Hour
	DefaultMaxAttempts     = 5
	DefaultShutdownTimeout = 30 * time.Second
	DefaultRetryBase       = 30 * time.Second // the first retry's delay; see DefaultRetryBackoff
	DefaultClaimBytes      = 16 << 20
)

const maxRetryBackoff = 24 * time.Hour

// Config configures a Claimer. The zero value of every optional field means
// its default.
type Config struct {
	// Pool runs every statement. Required.
	Pool *pgxpool.Pool
	// Schema holds the jobs table. Required.
	Schema string
	// SleepConnConfig is where the claimer holds its queue's sleep key while
	// it sleeps, on a connection of its own. It needs a session: point it
	// past any transaction-pooling proxy, as the listener's. Required.
	SleepConnConfig *pgx.ConnConfig
	// Queue is the queue this claimer takes jobs from. Required.
	Queue string
	// WorkerID names this worker in locked_by. Required.
	WorkerID string
	// Registry picks the executor for each job's kind. Required.
	Registry *executors.Registry

	Options

	// DeleteDone deletes jobs as soon as they are done instead of keeping
	// them for the sweeper to purge (pgdispatch.RetainDoneNone).
	DeleteDone bool
	// StatementTimeout bounds each database call. Default:
	// pgdispatch.DefaultStatementTimeout (10s).
	StatementTimeout time.Duration
	// Observer, when set, is told of each job's start and outcome, for
	// metrics. Its methods must not block.
	Observer Observer
	// TracerProvider, when set, traces each attempt (package
	// claimer/internal/jobtrace). Default: no tracing, at no cost.
	TracerProvider trace.TracerProvider
	// Logger receives the claimer's logs. Default: no logging.
	Logger *zap.Logger
}

// Options are how a claimer claims and runs its jobs: the settings a worker
// passes to each of its claimers, and a user of a worker sets. The zero
// value of each means its default.
type Options struct {
	// Concurrency is how many jobs run at once. Default: DefaultConcurrency (100).
	Concurrency int
	// Lease is how long a claimed job stays this worker's without a
	// heartbeat. The heartbeat renews it every Lease/3. Default: DefaultLease (30s).
	Lease time.Duration
	// PollInterval is the fallback tick that claims even when no
	// notification came. Default: DefaultPollInterval (30s).
	PollInterval time.Duration
	// JobTimeout bounds one attempt unless the payload's "timeout" field says
	// otherwise. Default: DefaultJobTimeout (5m).
	JobTimeout time.Duration
	// MaxJobTimeout bounds the payload's "timeout": a job that asks for more
	// is dead at once. An attempt cut short by shutdown after it ran longer
	// than JobTimeout counts, so that a job that hangs cannot be given back
	// uncounted at every restart. Default: DefaultMaxJobTimeout (1h).
	MaxJobTimeout time.Duration
	// ClaimBytes bounds the payloads one claim loads: a claim stops adding
	// jobs once their size has passed it (a compressed payload counts
	// decompressed), and takes one job at least. Default: DefaultClaimBytes
	// (16 MiB).
	ClaimBytes int
	// MaxAttempts applies to jobs whose max_attempts is NULL. Default:
	// DefaultMaxAttempts (5).
	MaxAttempts int
	// RetryBackoff is the delay before the retry that follows attempt n.
	// Default: 30s * 4^(n-1), capped at 24h, plus up to 10 % jitter.
	RetryBackoff func(attempt int) time.Duration
	// ShutdownTimeout is how long running jobs may go on after Run's context
	// ends before they are cancelled and given back. Default:
	// DefaultShutdownTimeout (30s).
	ShutdownTimeout time.Duration
}

func (c *Config) validate() error {
	switch {
	case c.Pool == nil:
		return errors.New("claimer: Pool is required")
	case c.Schema == "":
		return errors.New("claimer: Schema is required")
	case c.SleepConnConfig == nil:
		return errors.New("claimer: SleepConnConfig is required")
	case c.Queue == "":
		return errors.New("claimer: Queue is required")
	case c.WorkerID == "":
		return errors.New("claimer: WorkerID is required")
	case c.Registry == nil:
		return errors.New("claimer: Registry is required")
	case c.Concurrency < 0, c.Lease < 0, c.PollInterval < 0, c.JobTimeout < 0, c.MaxJobTimeout < 0, c.ClaimBytes < 0,
		c.MaxAttempts < 0, c.ShutdownTimeout < 0, c.StatementTimeout < 0:
		return errors.New("claimer: durations and counts must not be negative")
	case c.JobTimeout > cmp.Or(c.MaxJobTimeout, DefaultMaxJobTimeout):
		return errors.New("claimer: JobTimeout must not exceed MaxJobTimeout")
	case c.MaxAttempts > migrations.AttemptsLimit:
		return fmt.Errorf("claimer: MaxAttempts must not exceed %d, the jobs table's bound", migrations.AttemptsLimit)
	}
	return nil
}

// withDefaults is cfg with the zero value of each optional field replaced
// by its default.
func (c Config) withDefaults() Config {
	c.Concurrency = cmp.Or(c.Concurrency, DefaultConcurrency)
	c.Lease = cmp.Or(c.Lease, DefaultLease)
	c.PollInterval = cmp.Or(c.PollInterval, DefaultPollInterval)
	c.JobTimeout = cmp.Or(c.JobTimeout, DefaultJobTimeout)
	c.MaxJobTimeout = cmp.Or(c.MaxJobTimeout, DefaultMaxJobTimeout)
	c.ClaimBytes = cmp.Or(c.ClaimBytes, DefaultClaimBytes)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, DefaultMaxAttempts)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, DefaultShutdownTimeout)
	c.StatementTimeout = cmp.Or(c.StatementTimeout, stmttimeout.Default)
	if c.RetryBackoff == nil {
		c.RetryBackoff = DefaultRetryBackoff
	}
	return c
}

// DefaultRetryBackoff waits 30s after the first attempt and four times longer
// after each one after (30s, 2m, 8m, 32m, ...), capped at 24h, plus up to 10 %
// jitter so that jobs that failed together do not retry together.
func DefaultRetryBackoff(attempt int) time.Duration {
	return ExponentialBackoff(DefaultRetryBase)(attempt)
}

// ExponentialBackoff returns a RetryBackoff that starts at base and grows
// fourfold per attempt, capped at 24h, plus up to 10 % jitter.
func ExponentialBackoff(base time.Duration) func(attempt int) time.Duration {
	return func(attempt int) time.Duration {
		d := base
		for i := 1; i < attempt && d < maxRetryBackoff; i++ {
			d *= 4
		}
		d = min(d, maxRetryBackoff)
		return d + rand.N(d/10+1) //nolint:gosec // jitter needs no crypto
	}
}
