// Package claimer takes due jobs of one queue and runs them.
//
// A Claimer claims, in one statement, at most as many due jobs as it has
// free executor slots, with FOR UPDATE SKIP LOCKED. The claim leases them:
// each row reads running, with its attempt counted, locked_by set and
// locked_until a Lease away, for as long as its job runs. Each job runs on a
// runner goroutine (runners.go); a heartbeat renews the leases every
// Lease/3; outcomes are written back in batches, in id order (completer.go).
// A worker that dies stops renewing, and any worker's sweeper gives its jobs
// back once their leases expire.
//
// The claim loop (loop.go) is a state machine. An event (a notification,
// the loop's one timer, the fallback tick, a freed slot, the sleep key
// granted or lost) may make it claim, and the claim's result moves it on:
//
//	state      claims on                              then, when the claim
//	                                                  took every   took      found
//	                                                  free slot    some      none
//	─────────  ─────────────────────────────────────  ─────────   ───────   ──────────────────
//	awake      start                                  saturated   lingering lingering
//	saturated  all slots free, or 4 ms after the      saturated   lingering lingering
//	           first; a notification; the tick
//	lingering  its timer (0.5, 1, 2 ms); a            saturated   lingering lingering, or drowsy
//	           notification; the tick                                       after 2 ms of looks
//	drowsy     the key granted or lost; a             saturated   lingering asleep if the key was
//	(asks for  notification; the next run_at;                               just granted, else
//	the key)   stranded rows; the tick                                      drowsy
//	asleep     a notification; the next run_at;       saturated   lingering asleep
//	(holds     stranded rows; the tick; the key lost
//	the key)   (and goes to drowsy)
//	backoff    its timer (the retry); the tick        saturated   lingering lingering
//	paused     a notification (resume_queue sends     saturated   lingering lingering
//	           one); the tick
//
//	any state: a failed claim ─▶ backoff; a claim that finds the queue
//	           paused ─▶ paused; no free slot ─▶ saturated;
//	           Run's context ends ─▶ stopping
//
// Writers notify only while the claimer holds its queue's sleep key (see
// sleep.go); awake, it looks by itself. A claim that comes up short reports
// the earliest future run_at, and whether it skipped due rows another
// transaction held locked ("stranded rows"): their lock may end without a
// change that notifies, so the claimer looks again, 10 ms to 1 s later.
// Paused, the claimer gives the key back, so writers to a paused queue do
// not notify.
//
// Stopping is in two steps, as in River's producer: the claimer stops
// claiming and lets running jobs finish for ShutdownTimeout, then cancels
// them, gives the unfinished ones back, and flushes the outcomes it holds.
package claimer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/testhook"
	"github.com/pgdispatch/pgdispatch/migrations"
)

// The defaults of Options and Config.
const (
	DefaultConcurrency      = 100
	DefaultLease            = 30 * time.Second
	DefaultPollInterval     = 30 * time.Second
	DefaultJobTimeout       = 5 * time.Minute
	DefaultMaxJobTimeout    = time.Hour
	DefaultMaxAttempts      = 5
	DefaultShutdownTimeout  = 30 * time.Second
	DefaultStatementTimeout = 10 * time.Second
	DefaultRetryBase        = 30 * time.Second // the first retry's delay; see DefaultRetryBackoff
	DefaultClaimBytes       = 16 << 20
)

const (
	maxRetryBackoff    = 24 * time.Hour
	maxCompletionBatch = 1000
	// maxUnwritten is how many outcomes may wait to be written before
	// the claimer stops taking new jobs.
	maxUnwritten = 2 * maxCompletionBatch
	// abandonGrace is how long a cancelled executor has to return before its
	// job is given back without it.
	abandonGrace = 2 * time.Second
)

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

	// StatementTimeout bounds each database call. Default: 10s.
	StatementTimeout time.Duration
	// Observer, when set, is told of each job's start and outcome, for
	// metrics. Its methods must not block.
	Observer Observer
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
	// DeleteDone deletes jobs as soon as they are done instead of keeping
	// them for the sweeper to purge.
	DeleteDone bool
	// ShutdownTimeout is how long running jobs may go on after Run's context
	// ends before they are cancelled and given back. Default:
	// DefaultShutdownTimeout (30s).
	ShutdownTimeout time.Duration
}

// Observer watches a claimer's jobs. Its methods are called from the jobs'
// goroutines and must not block.
type Observer interface {
	// JobStarted is called as the executor is about to run job.
	JobStarted(job *executors.Job)
	// JobFinished is called with each attempt's outcome and how long the
	// executor ran (0 when it never ran: an unknown kind, a bad timeout).
	JobFinished(job *executors.Job, outcome Outcome, took time.Duration)
}

// Outcome is what became of an attempt, as an Observer hears it.
type Outcome string

// The outcomes of an attempt.
const (
	OutcomeDone      Outcome = "done"
	OutcomeRetry     Outcome = "retry"     // the job is pending again, due after a backoff
	OutcomeDead      Outcome = "dead"      // no attempt is left, or the error was permanent
	OutcomeReleased  Outcome = "released"  // given back at shutdown, its attempt uncounted
	OutcomeSnoozed   Outcome = "snoozed"   // pending again after the executor's delay, its attempt uncounted
	OutcomeCancelled Outcome = "cancelled" // cancelled by an operator (or its lease lost) while it ran: no outcome written
)

// The statuses of a job's row that the claimer writes.
const (
	statusPending = "pending"
	statusDone    = "done"
	statusDead    = "dead"
)

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

// Stats are counters of a claimer's life, for logs and metrics.
type Stats struct {
	Claims    int64 // claim statements run
	Claimed   int64 // jobs claimed
	Completed int64 // outcomes written
	Ticks     int64 // fallback ticks
	TickHits  int64 // fallback ticks that found due work: missed notifications
	Sleeps    int64 // times the claimer went to sleep holding its sleep key: writers then notify
	Paused    bool  // the last claim found the queue paused, and no claim has found it active since
}

// Claimer claims and runs the jobs of one queue. Create it with New.
type Claimer struct {
	cfg    Config
	logger *zap.Logger

	claimSQL, heartbeatSQL, completeSQL, deleteDoneSQL, notOwnedSQL string
	sleep                                                           *sleepLock
	poolSize                                                        int // the pool's MaxConns, read once: Pool.Config copies the whole config

	notified  chan struct{} // notifications, and Wake; capacity 1
	slotFreed chan struct{} // an executor slot came free; capacity 1
	flush     chan struct{} // outcomes wait in pending; capacity 1

	checkCancels chan struct{} // toCheck holds jobs; capacity 1

	mu        sync.Mutex
	executing int               // executors running now
	inflight  map[*run]struct{} // runs claimed and not yet recorded
	unwritten []outcome         // outcomes not yet written
	toCheck   map[*run]bool     // runs of jobs said to be cancelled, to check (Cancel)
	// A claim in flight may have committed, and its jobs been cancelled,
	// before its runs are known: the jobs Cancel is told of meanwhile wait
	// in heard for the claim to end (claim).
	claiming  bool
	heard     map[int64]bool
	heardMany bool // more than maxHeard: every run of the claim is checked

	claims, claimed, completed, ticks, tickHits, sleeps atomic.Int64
	paused                                              atomic.Bool
}

// New checks cfg, fills defaults and returns a Claimer.
func New(cfg Config) (*Claimer, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.Concurrency = cmp.Or(cfg.Concurrency, DefaultConcurrency)
	cfg.Lease = cmp.Or(cfg.Lease, DefaultLease)
	cfg.PollInterval = cmp.Or(cfg.PollInterval, DefaultPollInterval)
	cfg.JobTimeout = cmp.Or(cfg.JobTimeout, DefaultJobTimeout)
	cfg.MaxJobTimeout = cmp.Or(cfg.MaxJobTimeout, DefaultMaxJobTimeout)
	cfg.ClaimBytes = cmp.Or(cfg.ClaimBytes, DefaultClaimBytes)
	cfg.MaxAttempts = cmp.Or(cfg.MaxAttempts, DefaultMaxAttempts)
	cfg.ShutdownTimeout = cmp.Or(cfg.ShutdownTimeout, DefaultShutdownTimeout)
	cfg.StatementTimeout = cmp.Or(cfg.StatementTimeout, DefaultStatementTimeout)
	if cfg.RetryBackoff == nil {
		cfg.RetryBackoff = DefaultRetryBackoff
	}
	logger := cmp.Or(cfg.Logger, zap.NewNop()).Named("claimer").With(zap.String("queue", cfg.Queue))
	return &Claimer{
		cfg:           cfg,
		logger:        logger,
		claimSQL:      withSchema(claimSQL, cfg.Schema),
		heartbeatSQL:  withSchema(heartbeatSQL, cfg.Schema),
		completeSQL:   withSchema(completeSQL, cfg.Schema),
		deleteDoneSQL: withSchema(deleteDoneSQL, cfg.Schema),
		notOwnedSQL:   withSchema(notOwnedSQL, cfg.Schema),
		sleep:         newSleepLock(cfg.SleepConnConfig, cfg.Schema, cfg.Queue, cfg.StatementTimeout, logger),
		poolSize:      int(cfg.Pool.Config().MaxConns),
		notified:      make(chan struct{}, 1),
		slotFreed:     make(chan struct{}, 1),
		flush:         make(chan struct{}, 1),
		inflight:      map[*run]struct{}{},
		checkCancels:  make(chan struct{}, 1),
		toCheck:       map[*run]bool{},
		heard:         map[int64]bool{},
	}, nil
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

// Queue is the queue this claimer serves.
func (c *Claimer) Queue() string { return c.cfg.Queue }

// Wake asks the claimer to claim now. It never blocks; wake-ups that arrive
// while one is pending fold into it.
func (c *Claimer) Wake() { signal(c.notified) }

// Running is how many of the claimer's jobs are running now.
func (c *Claimer) Running() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.executing
}

// Stats returns the claimer's counters.
func (c *Claimer) Stats() Stats {
	return Stats{
		Claims:    c.claims.Load(),
		Claimed:   c.claimed.Load(),
		Completed: c.completed.Load(),
		Ticks:     c.ticks.Load(),
		TickHits:  c.tickHits.Load(),
		Sleeps:    c.sleeps.Load(),
		Paused:    c.paused.Load(),
	}
}

// Run claims and runs jobs until ctx ends, then shuts down as the package doc
// describes. It returns nil after a clean shutdown.
func (c *Claimer) Run(ctx context.Context) error {
	// Jobs run under workCtx, which outlives ctx until the hard stop.
	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()

	// The completer and the heartbeat outlive the hard stop: the last
	// outcomes must still be written and their leases kept meanwhile.
	bgCtx, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	var bg sync.WaitGroup
	bg.Add(4)
	go func() { defer bg.Done(); c.runCompleter(bgCtx) }()
	go func() { defer bg.Done(); c.runCancelChecks(bgCtx) }()
	go func() { defer bg.Done(); c.runHeartbeat(bgCtx, heartbeatHook(ctx, c.cfg.Queue)) }()
	go func() { defer bg.Done(); c.runWatchdog(bgCtx, workCtx) }()

	// The sleep key goes back as soon as claiming stops: peers take over.
	sleepCtx, stopSleep := context.WithCancel(ctx)
	sleepDone := make(chan struct{})
	go func() { defer close(sleepDone); c.sleep.run(sleepCtx) }()

	jobs := newRunners(func(r *run) { c.execute(workCtx, r) })
	c.claimLoop(ctx, jobs)
	stopSleep()
	<-sleepDone

	jobs.close(c.shutdown(cancelWork, jobs))
	stopBackground() // the completer flushes what it holds before it returns
	bg.Wait()
	c.logger.Info("claimer stopped", zap.Int64("claims", c.claims.Load()),
		zap.Int64("claimed", c.claimed.Load()), zap.Int64("completed", c.completed.Load()))
	return nil
}

// freeSlots is how many jobs the next claim may take: the executor slots
// not in use, less any excess of outcomes waiting to be written, so that
// claiming never outruns recording.
func (c *Claimer) freeSlots() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	free := c.cfg.Concurrency - c.executing
	if over := len(c.unwritten) - maxUnwritten; over > 0 {
		free -= over
	}
	return max(free, 0)
}

// heartbeatHook is the test hook of ctx for heartbeats, if any.
func heartbeatHook(ctx context.Context, queue string) func(int64) {
	h := testhook.From(ctx).Heartbeat
	if h == nil {
		return nil
	}
	return func(n int64) { h(queue, n) }
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
