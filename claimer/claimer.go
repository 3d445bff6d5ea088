// Package claimer takes due jobs of one queue and runs them.
//
// A Claimer claims in one statement at most as many due jobs as it has free
// executor slots, with FOR UPDATE SKIP LOCKED. Each job runs on a runner
// goroutine under a lease that a heartbeat renews; outcomes are written back
// in batches, in id order. While the queue is busy, a claim is held instead
// (held.go): its transaction stays open for up to Hold, its row locks stand
// for the lease, and the outcomes of the jobs done by then are written in it.
//
// While its queue has work, the claimer claims again when its slots free (in
// full batches: once all are free, or 4ms after the first), and half a
// millisecond after each claim that emptied the queue. Writers do not
// NOTIFY an awake claimer. Once the queue has stayed empty for Linger, the
// claimer goes to sleep: it takes the queue's sleep key (see sleep.go and
// migration 003), looks once more, and then waits to be woken by the
// listener, by the earliest known future run_at, or by the slow fallback
// tick. While it sleeps, writers notify.
//
// As it starts, beside its first claims, it readies the pool connections it
// uses while busy (warm.go), so that its first burst of jobs does not wait
// for new connections and plans.
//
// Stopping is in two steps, as in River's producer: when Run's context ends
// the claimer stops claiming and lets running jobs finish for
// ShutdownTimeout; then it cancels them, gives the unfinished ones back to
// pending at once, and flushes the outcomes it holds.
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
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/retry"
)

const (
	defaultConcurrency  = 100
	defaultLease        = 30 * time.Second
	defaultPollInterval = 30 * time.Second
	defaultLinger       = 2 * time.Millisecond
	defaultHold         = 50 * time.Millisecond
	maxHold             = 10 * time.Second
	// minPoll and maxPoll bound the pauses between looks at a queue while
	// the claimer lingers.
	minPoll                 = 500 * time.Microsecond
	maxPoll                 = 4 * time.Millisecond
	defaultJobTimeout       = 5 * time.Minute
	defaultMaxAttempts      = 5
	defaultShutdownTimeout  = 30 * time.Second
	defaultStatementTimeout = 10 * time.Second
	defaultRetryBackoff     = 30 * time.Second
	maxRetryBackoff         = 24 * time.Hour
	maxCompletionBatch      = 1000
	// minScheduleWait and maxScheduleWait bound the sleep until a scheduled
	// run_at.
	minScheduleWait = time.Millisecond
	maxScheduleWait = 24 * time.Hour
	// maxPendingOutcomes is how many outcomes may wait to be written before
	// the claimer stops taking new jobs.
	maxPendingOutcomes = 2 * maxCompletionBatch
	// abandonGrace is how long a cancelled executor has to return before its
	// job is given back without it.
	abandonGrace = 2 * time.Second
	// poolReadEvery is how often at most a claim that found jobs reads the
	// pool's counts to see whether it opened connections since the last
	// warm-up (warm.go); so a pool that replaces connections without end is
	// warmed once a second at most.
	poolReadEvery = time.Second
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

	// Concurrency is how many jobs run at once. Default: 100.
	Concurrency int
	// Lease is how long a claimed job stays this worker's without a
	// heartbeat. The heartbeat renews it every Lease/3. Default: 30s.
	Lease time.Duration
	// PollInterval is the fallback tick that claims even when no
	// notification came. Default: 30s.
	PollInterval time.Duration
	// Linger is how long the claimer keeps looking at an empty queue, at
	// growing intervals from 0.5ms to 4ms, before it goes to sleep. Under a
	// steady stream of jobs it then never sleeps, and writers never notify.
	// Default: 2ms; negative: sleep at the first empty claim.
	Linger time.Duration
	// JobTimeout bounds one attempt unless the payload's "timeout" field says
	// otherwise. Default: 5m.
	JobTimeout time.Duration
	// MaxAttempts applies to jobs whose max_attempts is NULL. Default: 5.
	MaxAttempts int
	// RetryBackoff is the delay before the retry that follows attempt n.
	// Default: 30s * 4^(n-1), capped at 24h, plus up to 10 % jitter.
	RetryBackoff func(attempt int) time.Duration
	// DeleteDone deletes jobs as soon as they are done instead of keeping
	// them for the sweeper to purge.
	DeleteDone bool
	// Hold is how long a claim that follows a busy one keeps its jobs under
	// its own transaction's row locks before it leases them (held.go): jobs
	// done within it are recorded in that transaction, with no lease
	// written. Default: 50ms; negative: every claim leases its jobs at once.
	Hold time.Duration
	// HeldLimit bounds the held batches open at once across the claimers
	// that share it (a Worker's). Default: a limit of the claimer's own,
	// HeldLimitFor(the pool's size, 1).
	HeldLimit *HeldLimit
	// ShutdownTimeout is how long running jobs may go on after Run's context
	// ends before they are cancelled and given back. Default: 30s.
	ShutdownTimeout time.Duration
	// StatementTimeout bounds each database call. Default: 10s.
	StatementTimeout time.Duration
	// OnSleep, when set, is called each time the claimer has taken its sleep
	// key and found the queue still empty: from then on writers notify. It
	// must not block. For tests.
	OnSleep func()
	// Observer, when set, is told of each job's start and outcome, for
	// metrics. Its methods must not block.
	Observer Observer
	// Logger receives the claimer's logs. Default: no logging.
	Logger *zap.Logger
}

// Observer watches a claimer's jobs. Its methods are called from the jobs'
// goroutines and must not block.
type Observer interface {
	// JobStarted is called as the executor is about to run job.
	JobStarted(job *executors.Job)
	// JobFinished is called with each attempt's outcome: "done", "retry",
	// "dead" or "released" (given back at shutdown), and how long the
	// executor ran (0 when it never ran: an unknown kind, a bad timeout).
	JobFinished(job *executors.Job, outcome string, took time.Duration)
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
	case c.Hold > maxHold:
		return fmt.Errorf("claimer: Hold must not exceed %s: a held claim keeps a transaction open, which holds back vacuum", maxHold)
	case c.Concurrency < 0, c.Lease < 0, c.PollInterval < 0, c.JobTimeout < 0,
		c.MaxAttempts < 0, c.ShutdownTimeout < 0, c.StatementTimeout < 0:
		return errors.New("claimer: durations and counts must not be negative")
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
	Held      int64 // claims that held their jobs under their own transaction
	Leased    int64 // held jobs that ran past Hold and were leased
}

// Claimer claims and runs the jobs of one queue. Create it with New.
type Claimer struct {
	cfg    Config
	logger *zap.Logger

	claimSQL, heartbeatSQL, completeSQL         string
	heldClaimSQL, heldCompleteSQL, leaseHeldSQL string
	heldClaimPastSQL                            string
	sleep                                       *sleepLock

	baseCtx  context.Context // Run's context without its cancellation: held batches commit under it
	poolSize int             // the pool's MaxConns, read once: Pool.Config copies the whole config
	maxHeld  int             // held batches open at once at most, of this claimer's own
	heldWG   sync.WaitGroup  // held batches not yet committed
	warmWG   sync.WaitGroup  // warm-ups under way (warm.go)
	warming  atomic.Bool     // a warm-up is under way: warmBeside starts no second one
	// warmedThrough is the pool's NewConnsCount as the last warm-up ended:
	// a pool that has opened connections since may have replaced warmed
	// ones (warm.go).
	warmedThrough atomic.Int64
	resume        resume // where held claims start; the claim loop's own

	wake      chan struct{} // notifications and timers; capacity 1
	slotFreed chan struct{} // an executor slot came free; capacity 1
	flush     chan struct{} // outcomes wait in pending; capacity 1

	mu       sync.Mutex
	running  int                // executors running now
	inflight map[int64]*running // claimed and not yet recorded, by id
	pending  []outcome          // outcomes not yet written
	held     int                // held batches open

	claims, claimed, completed, ticks, tickHits, sleeps atomic.Int64
	heldClaims, leasedLate                              atomic.Int64
	pastClaims                                          atomic.Int64 // held claims that started past a row (resume)
	sleeping                                            atomic.Bool  // see Sleeping
}

// New checks cfg, fills defaults and returns a Claimer.
func New(cfg Config) (*Claimer, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.Concurrency = cmp.Or(cfg.Concurrency, defaultConcurrency)
	cfg.Lease = cmp.Or(cfg.Lease, defaultLease)
	cfg.PollInterval = cmp.Or(cfg.PollInterval, defaultPollInterval)
	cfg.Linger = cmp.Or(cfg.Linger, defaultLinger)
	cfg.Hold = cmp.Or(cfg.Hold, defaultHold)
	cfg.JobTimeout = cmp.Or(cfg.JobTimeout, defaultJobTimeout)
	cfg.MaxAttempts = cmp.Or(cfg.MaxAttempts, defaultMaxAttempts)
	cfg.ShutdownTimeout = cmp.Or(cfg.ShutdownTimeout, defaultShutdownTimeout)
	cfg.StatementTimeout = cmp.Or(cfg.StatementTimeout, defaultStatementTimeout)
	if cfg.RetryBackoff == nil {
		cfg.RetryBackoff = DefaultRetryBackoff
	}
	logger := cmp.Or(cfg.Logger, zap.NewNop()).Named("claimer").With(zap.String("queue", cfg.Queue))
	jobsTable := pgx.Identifier{cfg.Schema, "jobs"}.Sanitize()
	poolSize := int(cfg.Pool.Config().MaxConns) // Config is a deep copy: read once
	if cfg.HeldLimit == nil {
		cfg.HeldLimit = HeldLimitFor(poolSize, 1)
	}
	return &Claimer{
		cfg:              cfg,
		logger:           logger,
		claimSQL:         withTable(claimSQL, jobsTable),
		heartbeatSQL:     withTable(heartbeatSQL, jobsTable),
		completeSQL:      withTable(completeSQL, jobsTable),
		heldClaimSQL:     withTable(heldClaimSQL, jobsTable),
		heldClaimPastSQL: withTable(withPast(heldClaimSQL), jobsTable),
		heldCompleteSQL:  withTable(heldCompleteSQL, jobsTable),
		leaseHeldSQL:     withTable(leaseHeldSQL, jobsTable),
		baseCtx:          context.Background(),
		poolSize:         poolSize,
		maxHeld:          min(maxHeld, cfg.HeldLimit.n),
		sleep:            newSleepLock(cfg.SleepConnConfig, cfg.Schema, cfg.Queue, cfg.StatementTimeout, logger),
		wake:             make(chan struct{}, 1),
		slotFreed:        make(chan struct{}, 1),
		flush:            make(chan struct{}, 1),
		inflight:         map[int64]*running{},
	}, nil
}

// DefaultRetryBackoff waits 30s after the first attempt and four times longer
// after each one after (30s, 2m, 8m, 32m, ...), capped at 24h, plus up to 10 %
// jitter so that jobs that failed together do not retry together.
func DefaultRetryBackoff(attempt int) time.Duration {
	return ExponentialBackoff(defaultRetryBackoff)(attempt)
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
func (c *Claimer) Wake() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// Sleeping reports whether the claimer sleeps: it holds its queue's sleep
// key and has looked at the queue since it took it, so a job committed from
// now on is found by a notification (or the fallback tick).
func (c *Claimer) Sleeping() bool { return c.sleeping.Load() && c.sleep.holding.Load() }

// Running is how many of the claimer's jobs are running now.
func (c *Claimer) Running() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.running
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
		Held:      c.heldClaims.Load(),
		Leased:    c.leasedLate.Load(),
	}
}

// Run claims and runs jobs until ctx ends, then shuts down as the package doc
// describes. It returns nil after a clean shutdown.
func (c *Claimer) Run(ctx context.Context) error {
	c.baseCtx = context.WithoutCancel(ctx)
	// Jobs run under workCtx, which outlives ctx until the hard stop.
	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()

	// The completer and the heartbeat outlive the hard stop: the last
	// outcomes must still be written and their leases kept meanwhile.
	bgCtx, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	var bg sync.WaitGroup
	bg.Add(3)
	go func() { defer bg.Done(); c.runCompleter(bgCtx) }()
	go func() { defer bg.Done(); c.runHeartbeat(bgCtx) }()
	go func() { defer bg.Done(); c.runWatchdog(bgCtx, workCtx) }()

	// The sleep key goes back as soon as claiming stops: peers take over.
	sleepCtx, stopSleep := context.WithCancel(ctx)
	sleepDone := make(chan struct{})
	go func() { defer close(sleepDone); c.sleep.run(sleepCtx) }()

	c.warmBeside(ctx, false)
	jobs := newRunners(func(r *running) { c.execute(workCtx, r) })
	c.claimLoop(ctx, jobs)
	c.warmWG.Wait()
	stopSleep()
	<-sleepDone

	jobs.close(c.shutdown(cancelWork, jobs))
	c.heldWG.Wait()  // every job has reported (or been given back): held batches commit
	stopBackground() // the completer flushes what it holds before it returns
	bg.Wait()
	c.logger.Info("claimer stopped", zap.Int64("claims", c.claims.Load()), zap.Int64("held_claims", c.heldClaims.Load()),
		zap.Int64("claimed", c.claimed.Load()), zap.Int64("completed", c.completed.Load()), zap.Int64("leased_late", c.leasedLate.Load()))
	return nil
}

func (c *Claimer) claimLoop(ctx context.Context, jobs *runners) {
	c.logger.Info("claimer started", zap.Int("concurrency", c.cfg.Concurrency),
		zap.Duration("poll_interval", c.cfg.PollInterval))
	tick := time.NewTicker(c.cfg.PollInterval)
	defer tick.Stop()
	sched := time.NewTimer(0) // claim once at start
	defer sched.Stop()
	var (
		backlog   bool // the last claim was cut short by free slots
		gathering bool // backlog: waiting a moment for more slots to free
		asleep    bool // the queue stayed empty for Linger: the sleep key is wanted
		idle      int  // empty claims in a row while awake
		fromTick  bool
		fromGrant bool
		busy      bool      // the last claim found jobs: the next may hold its own
		poolRead  time.Time // when a claim that found jobs last read the pool's counts
		backoff   = retry.New(c.poolSize)
	)
	for {
		fromGrant = false
		select {
		case <-ctx.Done():
			return
		case <-c.wake:
		case <-c.sleep.recheck:
			fromGrant = c.sleep.holding.Load()
		case <-sched.C:
		case <-tick.C:
			fromTick = true
			c.ticks.Add(1)
		case <-c.slotFreed:
			if !backlog {
				continue
			}
			// Claim in full batches: a claim per freed slot would take a
			// few jobs at a time, at the full cost of a claim each. Wait
			// until every slot is free, or for maxPoll at most.
			if c.freeSlots() < c.cfg.Concurrency {
				if !gathering {
					gathering = true
					resetTimer(sched, maxPoll)
				}
				continue
			}
		}
		gathering = false

		free := c.freeSlots()
		if free == 0 {
			// Claim again when a slot frees, notified or not.
			backlog, asleep, idle = true, false, 0
			c.wakeUp()
			continue
		}
		var (
			claimed []*running
			next    *time.Duration
			err     error
			from    *claimKey
			started = time.Now()
		)
		hold, open := false, false
		if busy {
			hold, open = c.mayHold()
		}
		if hold {
			from = c.resume.next(open, started)
			claimed, next, err = c.claimHeld(ctx, free, from)
		} else {
			claimed, next, err = c.claim(ctx, free)
		}
		c.resume.claimed(from, started, claimed, free, err)
		busy = err == nil && len(claimed) > 0
		if busy && started.Sub(poolRead) >= poolReadEvery {
			poolRead = started
			if c.cfg.Pool.Stat().NewConnsCount() > c.warmedThrough.Load() {
				c.warmBeside(ctx, true) // the burst runs on connections no warm-up readied
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			delay := backoff.Next(err)
			c.logger.Warn("claim failed", zap.Error(err), zap.Int("failures", backoff.Failures()), zap.Duration("retry_in", delay))
			resetTimer(sched, delay)
			continue
		}
		backoff = retry.New(c.poolSize)
		if fromTick && len(claimed) > 0 {
			c.tickHits.Add(1)
			c.logger.Info("fallback tick found due jobs: a notification was missed",
				zap.Int("num_claimed", len(claimed)), zap.Int64("tick_hits", c.tickHits.Load()))
		}
		fromTick = false
		for _, r := range claimed {
			jobs.start(r)
		}

		if fromGrant && len(claimed) > 0 {
			c.logger.Debug("the look after taking the sleep key found jobs", zap.Int("num_claimed", len(claimed)))
		}
		// A full claim means more may be due: the next freed slot claims again.
		backlog = len(claimed) == free
		wait := time.Duration(-1) // until the next claim; -1: none planned
		switch {
		case len(claimed) > 0:
			asleep, idle = false, 0
			c.wakeUp()
			if !backlog {
				wait = minPoll
			}
		case asleep:
			if fromGrant {
				c.sleeping.Store(true)
				c.sleeps.Add(1)
				if c.cfg.OnSleep != nil {
					c.cfg.OnSleep()
				}
			}
		default:
			idle++
			var lingering bool
			if wait, lingering = lingerWait(c.cfg.Linger, idle); !lingering {
				wait = -1
				asleep = true
				c.sleep.sleep()
				c.logger.Debug("queue empty: going to sleep")
			}
		}
		if next != nil && !backlog && (wait < 0 || *next < wait) {
			wait = max(*next, minScheduleWait)
		}
		if wait >= 0 {
			resetTimer(sched, wait)
		} else if !backlog {
			sched.Stop()
		}
	}
}

// wakeUp ends a sleep: it gives the sleep key back.
func (c *Claimer) wakeUp() {
	c.sleeping.Store(false)
	c.sleep.wake()
}

// lingerWait is the pause before the next look at a queue found empty idle
// times in a row (idle >= 1): 0.5ms, 1ms, 2ms, then 4ms each. It reports false once
// those pauses would add up to more than linger: time to sleep.
func lingerWait(linger time.Duration, idle int) (time.Duration, bool) {
	var spent, wait time.Duration
	for i := range idle {
		wait = min(minPoll<<min(i, 8), maxPoll)
		spent += wait
	}
	return wait, spent <= linger
}

func resetTimer(t *time.Timer, d time.Duration) {
	t.Stop()
	t.Reset(max(d, 0))
}

// freeSlots is how many jobs the next claim may take: the executor slots
// not in use, less any excess of outcomes waiting to be written, so that
// claiming never outruns recording.
func (c *Claimer) freeSlots() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	free := c.cfg.Concurrency - c.running
	if over := len(c.pending) - maxPendingOutcomes; over > 0 {
		free -= over
	}
	return max(free, 0)
}

// mayHold reports whether the next claim may be held (held.go), and whether
// a held batch is still open. Only a claim that follows a busy one is held:
// at an empty queue, a held claim would need one more round trip to end its
// transaction. When it may, it has taken a place in the HeldLimit, which
// claimHeld gives back unless it opens a batch, and the batch when it ends.
func (c *Claimer) mayHold() (hold, open bool) {
	if c.cfg.Hold < 0 {
		return false, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.held < c.maxHeld && c.cfg.HeldLimit.tryAcquire(), c.held > 0
}

// claim takes up to limit due jobs and marks them running. When it claimed
// fewer than limit it also returns the wait until the queue's earliest future
// run_at, by the database's clock.
func (c *Claimer) claim(ctx context.Context, limit int) ([]*running, *time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.StatementTimeout)
	defer cancel()
	c.claims.Add(1)
	results := c.sendPinned(ctx, claimPlanSQL, c.claimSQL, c.claimArgs(limit)...)
	claimed, next, err := c.readClaim(results, nil)
	// Close reads the end of the transaction: only a committed claim runs.
	if closeErr := results.Close(); err == nil && closeErr != nil {
		err = fmt.Errorf("claim jobs: %w", closeErr)
	}
	if err != nil {
		return nil, nil, err
	}
	if len(claimed) == 0 {
		return nil, next, nil
	}
	runs := c.track(claimed, nil)
	c.logger.Debug("claimed jobs", zap.Int("num_claimed", len(claimed)))
	return runs, next, nil
}

// track records claimed jobs as running, held by b when b is not nil.
func (c *Claimer) track(jobs []*executors.Job, b *heldBatch) []*running {
	c.claimed.Add(int64(len(jobs)))
	runs := make([]*running, len(jobs))
	c.mu.Lock()
	defer c.mu.Unlock()
	c.running += len(jobs)
	for i, j := range jobs {
		runs[i] = &running{attempt: j.Attempt, job: j, held: b}
		c.inflight[j.ID] = runs[i]
	}
	if b != nil {
		c.held++
	}
	return runs
}

// sendPinned sends settings (planSQL or claimPlanSQL) and then sql, in one
// round trip and one transaction. Read the settings' result first.
func (c *Claimer) sendPinned(ctx context.Context, settings, sql string, args ...any) pgx.BatchResults {
	batch := &pgx.Batch{}
	batch.Queue(settings)
	batch.Queue(sql, args...)
	return c.cfg.Pool.SendBatch(ctx, batch)
}

// execPinned runs sql after planSQL, as sendPinned, and returns its tag once
// the transaction has committed.
func (c *Claimer) execPinned(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	results := c.sendPinned(ctx, planSQL, sql, args...)
	_, err := results.Exec()
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = results.Exec()
	}
	if closeErr := results.Close(); err == nil {
		err = closeErr
	}
	return tag, err
}

// readClaim reads a claim's results: the settings', then the claimed rows
// and the wait until the next run_at. With lost not nil, the rows have
// heldClaimSQL's lost column too, appended to it.
func (c *Claimer) readClaim(results pgx.BatchResults, lost *[]bool) ([]*executors.Job, *time.Duration, error) {
	if _, err := results.Exec(); err != nil {
		return nil, nil, fmt.Errorf("claim jobs: %w", err)
	}
	rows, err := results.Query()
	if err != nil {
		return nil, nil, fmt.Errorf("claim jobs: %w", err)
	}
	defer rows.Close()
	var (
		claimed []*executors.Job
		next    *time.Duration
	)
	// Value types, not pointers: a pointer per column and row was a tenth
	// of the worker's CPU in a drain (pprof). Only the row of a claim that
	// found nothing has NULLs.
	var (
		id                   pgtype.Int8
		kind                 pgtype.Text
		priority             pgtype.Int2
		attempt, maxAttempts pgtype.Int4
		runAt, createdAt     pgtype.Timestamptz
		nextIn               pgtype.Float8
		wasLost              pgtype.Bool
		payload              []byte
	)
	dest := []any{&id, &kind, &payload, &priority, &attempt, &maxAttempts, &runAt, &createdAt, &nextIn}
	if lost != nil {
		dest = append(dest, &wasLost)
	}
	for rows.Next() {
		payload = nil // a new slice per row: the scan would reuse the last one
		if err := rows.Scan(dest...); err != nil {
			return nil, nil, fmt.Errorf("claim jobs: scan: %w", err)
		}
		if nextIn.Valid {
			d := scheduleWait(nextIn.Float64)
			next = &d
		}
		if !id.Valid {
			continue // the one row of a claim that found nothing
		}
		if lost != nil {
			*lost = append(*lost, wasLost.Valid && wasLost.Bool)
		}
		claimed = append(claimed, &executors.Job{
			ID: id.Int64, Queue: c.cfg.Queue, Kind: kind.String, Payload: payload, Priority: priority.Int16,
			Attempt: int(attempt.Int32), MaxAttempts: int(maxAttempts.Int32), RunAt: runAt.Time, CreatedAt: createdAt.Time,
		})
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("claim jobs: %w", err)
	}
	return claimed, next, nil
}

// scheduleWait turns the seconds until the earliest future run_at into a
// wait, capped at maxScheduleWait: a job due in the year 9999 is further
// away than a time.Duration reaches, and the conversion would overflow to a
// negative wait, a claim every millisecond. The fallback tick comes sooner
// than the cap anyway.
func scheduleWait(seconds float64) time.Duration {
	if !(seconds < maxScheduleWait.Seconds()) { // also NaN
		return maxScheduleWait
	}
	return time.Duration(seconds * float64(time.Second))
}

// runHeartbeat renews the leases of this claimer's jobs every Lease/3.
func (c *Claimer) runHeartbeat(ctx context.Context) {
	t := time.NewTicker(max(c.cfg.Lease/3, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ids := c.inflightIDs()
		if len(ids) == 0 {
			continue
		}
		c.renewLeases(ctx, ids)
	}
}

// renewLeases runs one heartbeat. A heartbeat that meets a dead connection
// is tried again at once, as a claim is (retry.Backoff): while every slot is busy
// with long jobs, nothing else uses the pool, and after a restart or a mass
// termination each of its idle connections is dead. One dead connection per
// tick would let the leases lapse after three (Lease/3 apart), and the
// sweeper would hand the running jobs to another worker. Any other failure
// waits for the next tick, within the lease.
func (c *Claimer) renewLeases(ctx context.Context, ids []int64) {
	backoff := retry.New(c.poolSize)
	for {
		callCtx, cancel := context.WithTimeout(ctx, c.cfg.StatementTimeout)
		tag, err := c.execPinned(callCtx, c.heartbeatSQL, c.heartbeatArgs(ids)...)
		cancel()
		if err == nil {
			if n := tag.RowsAffected(); n < int64(len(ids)) {
				c.logger.Debug("heartbeat renewed fewer leases than jobs held",
					zap.Int64("renewed", n), zap.Int("num_jobs", len(ids)))
			}
			return
		}
		if ctx.Err() != nil {
			return
		}
		again := backoff.Next(err) == 0
		c.logger.Warn("heartbeat failed", zap.Error(err), zap.Int("num_jobs", len(ids)),
			zap.Int("failures", backoff.Failures()), zap.Bool("retry_now", again))
		if !again {
			return
		}
	}
}

func (c *Claimer) inflightIDs() []int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	ids := make([]int64, 0, len(c.inflight))
	for id, r := range c.inflight {
		if r.held != nil && !r.held.leased {
			continue // its claim's transaction holds it: nothing to renew
		}
		ids = append(ids, id)
	}
	return ids
}
