// Package claimer takes due jobs of one queue and runs them.
//
// A Claimer claims, in one statement, at most as many due jobs as it has
// free executor slots, with FOR UPDATE SKIP LOCKED (claim.go). The claim
// leases them: each row reads running, with its attempt counted, locked_by
// set and locked_until a Lease away, for as long as its job runs. Its parts
// each do one thing, and ask one owner, the run tracker
// (internal/runstate), for the state of the runs:
//
//	loop.go, internal/machine  the claim loop and its states (below)
//	claim.go                   the claim statement
//	internal/cursor            where each claim starts: after the last job taken, or the front;
//	                           the looks from the front beside claims from the cursor
//	internal/runners           the goroutines the jobs run on
//	internal/attempt           one attempt: the executor, the outcome's decision, the watchdog
//	internal/completer         the outcomes, written in batches in id order
//	internal/lease             the heartbeat, every Lease/3 and on a cancel notice
//	internal/sleepkey          the sleep key, on a connection of its own
//	internal/giveback          the jobs of a claim whose reply was lost, given back
//	internal/jobtrace          the attempts' spans, when tracing is on
//
// A worker that dies stops renewing, and any worker's sweeper gives its jobs
// back once their leases expire. A claim whose reply is lost (its
// connection failed after it was sent) may have committed: before its next
// claim, the claimer gives back the jobs it left running under this worker
// with no run, their attempts uncounted, since no executor started on them.
//
// # The claim loop
//
// An event (a notification, the loop's one timer, the fallback tick, a
// freed slot, the sleep key granted or lost) may make the loop claim, and
// the claim's result moves it on:
//
//	state           claims on                              then, when the claim
//	                                                       took every   took       found
//	                                                       free slot    some       none
//	──────────────  ─────────────────────────────────────  ──────────   ─────────  ───────────────────
//	awake           start                                  saturated    lingering  lingering
//	saturated       every slot free, or 4 ms after the     saturated    lingering  lingering
//	                first freed one; a notification; the
//	                tick
//	lingering       its timer (0.5, 1, 2 ms); a            saturated    lingering  lingering, or drowsy
//	                notification; the tick                                         at the third empty look
//	                                                                               in a row
//	drowsy          the key granted or lost; a             saturated    lingering  asleep if the key was
//	(asks for       notification; its timer; the tick                              just granted, else
//	the key)                                                                       drowsy
//	asleep          a notification; its timer; the tick;   saturated    lingering  asleep
//	(holds the      the key lost (it goes to drowsy
//	key)            first)
//	backoff         its timer (the retry); the tick        saturated    lingering  lingering
//	paused          a notification (resume_queue sends     saturated    lingering  lingering
//	                one); the tick
//
//	any state: a failed claim ─▶ backoff; a claim that finds the queue
//	           paused ─▶ paused; no free slot at an event ─▶ saturated, with
//	           no claim; Run's context ends ─▶ stopping
//
// Saturated, the loop waits for slots to free, all of them or 4 ms after
// the first, so that a busy worker claims in full batches. Lingering, it
// looks by itself after a claim that came up short, so that under a stream
// of jobs less than about 2 ms apart it does not sleep and writers do not
// notify. Drowsy and asleep, it takes the sleep key: writers notify only
// while a claimer holds its queue's key (see internal/sleepkey), and the
// grant makes the loop look once more, since rows committed before it are
// visible then. Paused, it gives the key back, so writers to a paused queue
// do not notify. The timer is the gather wait while saturated, the next
// look while lingering, the retry in backoff (100 ms doubling to 10 s, at
// once after a dead connection, internal/retry), and, drowsy or asleep, the
// earliest future run_at that the last claim, which found nothing, reported
// (1 ms to 24 h away) or the next look for stranded rows: due rows the claim
// skipped because another transaction held them locked, whose lock may end
// without a change that notifies. Those looks come 10 ms to 1 s apart, as long after as the rows
// have been skipped. The tick claims in every state but stopping; a tick
// that finds jobs means a notification was missed, and is counted
// (Stats.TickHits).
//
// # Stopping
//
// Stopping is in two steps, as in River's producer: the claimer stops
// claiming and lets running jobs finish for ShutdownTimeout, then cancels
// them, gives the unfinished ones back, and flushes the outcomes it holds.
package claimer

import (
	"cmp"
	"context"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch/claimer/internal/attempt"
	"github.com/pgdispatch/pgdispatch/claimer/internal/completer"
	"github.com/pgdispatch/pgdispatch/claimer/internal/cursor"
	"github.com/pgdispatch/pgdispatch/claimer/internal/giveback"
	"github.com/pgdispatch/pgdispatch/claimer/internal/jobtrace"
	"github.com/pgdispatch/pgdispatch/claimer/internal/lease"
	"github.com/pgdispatch/pgdispatch/claimer/internal/pinned"
	"github.com/pgdispatch/pgdispatch/claimer/internal/runners"
	"github.com/pgdispatch/pgdispatch/claimer/internal/runstate"
	"github.com/pgdispatch/pgdispatch/claimer/internal/sleepkey"
	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/testhook"
)

// maxUnwritten is how many outcomes may wait to be written before the
// claimer takes fewer jobs.
const maxUnwritten = 2 * completer.MaxBatch

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

// outcomes are the Outcomes of the verdicts.
var outcomes = [...]Outcome{
	runstate.Done: OutcomeDone, runstate.Retry: OutcomeRetry, runstate.Dead: OutcomeDead,
	runstate.Snoozed: OutcomeSnoozed, runstate.Released: OutcomeReleased, runstate.Dropped: OutcomeCancelled,
}

// verdictObserver tells an Observer of the attempts.
type verdictObserver struct{ Observer }

func (o verdictObserver) JobFinished(job *executors.Job, v runstate.Verdict, took time.Duration) {
	o.Observer.JobFinished(job, outcomes[v], took)
}

// Stats are counters of a claimer's life, for logs and metrics.
type Stats struct {
	Claims    int64 // claim statements run
	Fronts    int64 // of which from the front of the queue, not from the cursor (internal/cursor)
	Claimed   int64 // jobs claimed
	Completed int64 // outcomes written
	Ticks     int64 // fallback ticks
	TickHits  int64 // fallback ticks that found due work: missed notifications
	Sleeps    int64 // times the claimer went to sleep holding its sleep key: writers then notify
	Paused    bool  // the last claim found the queue paused, and no claim has found it active since
}

// Claimer claims and runs the jobs of one queue. Create it with New.
type Claimer struct {
	cfg      Config
	logger   *zap.Logger
	claimSQL string
	// claimCursorSQL is claimSQL from the cursor, where the last claim
	// ended; cursor is that place (internal/cursor). Only the claim loop uses them.
	claimCursorSQL string
	cursor         cursor.Cursor
	// leanClaimSQL is claimSQL for the claims that expect few jobs, which
	// the loop says with quiet (machine.Lean).
	leanClaimSQL string
	quiet        bool
	// flowSQL claims the queue while it has flow limits, and flow says
	// whether it has and where the next claim_flow starts. Only the claim
	// loop uses them.
	flowSQL  string
	flow     flowState
	limited  *atomic.Bool   // flow.limited, for the completer, which runs beside the claim loop
	looker   *cursor.Looker // looks from the front beside claims from the cursor
	poolSize int            // the pool's MaxConns, read once: Pool.Config copies the whole config
	wakeSQL  string         // notifies the queue's sleeping claimers (announce)

	runs      *runstate.Tracker
	attempts  *attempt.Attempts
	completer *completer.Completer
	heartbeat *lease.Heartbeat
	sleep     *sleepkey.Lock
	trace     *jobtrace.Tracer // nil when tracing is off
	later     *laterWake       // wakes the claim loop when a job its outcomes put back is due

	notified chan struct{} // notifications, and Wake; capacity 1

	// claimSent and claimReturned are the test hooks (internal/testhook),
	// set by the claim loop.
	claimSent     func(queue string)
	claimReturned func(queue string, id int64)

	lost *giveback.Lost // the claims whose replies were lost, their jobs not given back yet

	claims, fronts, claimed, ticks, tickHits, sleeps atomic.Int64
	paused                                           atomic.Bool
}

// New checks cfg, fills defaults and returns a Claimer.
func New(cfg Config) (*Claimer, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	logger := cmp.Or(cfg.Logger, zap.NewNop()).Named("claimer").With(zap.String("queue", cfg.Queue))
	poolSize := int(cfg.Pool.Config().MaxConns)
	runs := runstate.New(cfg.Concurrency, maxUnwritten)
	tracer := jobtrace.New(cfg.TracerProvider, cfg.Queue)
	var obs attempt.Observer
	if cfg.Observer != nil {
		obs = verdictObserver{cfg.Observer}
	}
	limited := new(atomic.Bool)
	later := &laterWake{}
	c := &Claimer{
		limited: limited,
		cfg:     cfg, logger: logger, claimSQL: pinned.WithSchema(claimSQL, cfg.Schema),
		claimCursorSQL: pinned.WithSchema(cursor.SQL(claimSQL), cfg.Schema),
		leanClaimSQL:   pinned.WithSchema(leanClaimSQL, cfg.Schema),
		flowSQL:        pinned.WithSchema(flowSQL, cfg.Schema),
		wakeSQL:        pinned.WithSchema("SELECT {wake}($1)", cfg.Schema),
		poolSize:       poolSize, runs: runs,
		attempts: attempt.New(attempt.Config{
			Runs: runs, Registry: cfg.Registry, MaxJobTimeout: cfg.MaxJobTimeout, WorkerID: cfg.WorkerID,
			Policy:   attempt.Policy{JobTimeout: cfg.JobTimeout, Backoff: cfg.RetryBackoff},
			Observer: obs, Trace: tracer, Logger: logger,
		}),
		completer: completer.New(completer.Config{
			Pool: cfg.Pool, PoolSize: poolSize, Schema: cfg.Schema, Runs: runs, WorkerID: cfg.WorkerID,
			DeleteDone: cfg.DeleteDone, StatementTimeout: cfg.StatementTimeout, Logger: logger,
			Written: written(tracer, later), Queue: cfg.Queue, Limited: limited.Load,
		}),
		heartbeat: lease.New(lease.Config{
			Pool: cfg.Pool, PoolSize: poolSize, Schema: cfg.Schema, Runs: runs, WorkerID: cfg.WorkerID,
			Lease: cfg.Lease, StatementTimeout: cfg.StatementTimeout, Logger: logger,
		}),
		sleep: sleepkey.New(cfg.SleepConnConfig, cfg.Schema, cfg.Queue, cfg.StatementTimeout, logger),
		lost: giveback.New(giveback.Config{
			Pool: cfg.Pool, Schema: cfg.Schema, Queue: cfg.Queue, WorkerID: cfg.WorkerID, Lease: cfg.Lease,
			StatementTimeout: cfg.StatementTimeout, Logger: logger,
		}),
		looker:   cursor.NewLooker(cfg.Pool, cfg.Schema, cfg.Queue, cfg.StatementTimeout, logger),
		notified: make(chan struct{}, 1),
		trace:    tracer,
		later:    later,
	}
	later.wake, later.free, later.announce = c.Wake, runs.Free, c.announce
	return c, nil
}

// announce notifies every sleeping claimer of the queue, on every worker
// (wake, migration 009), for a job this claimer put back for later and
// cannot take itself (laterWake).
func (c *Claimer) announce() {
	ctx, cancel := context.WithTimeout(context.Background(), c.cfg.StatementTimeout)
	defer cancel()
	if _, err := c.cfg.Pool.Exec(ctx, c.wakeSQL, c.cfg.Queue); err != nil {
		c.logger.Warn("could not tell the other workers of a job put back for later: they claim it at their next claim", zap.Error(err))
	}
}

// Queue is the queue this claimer serves.
func (c *Claimer) Queue() string { return c.cfg.Queue }

// Wake asks the claimer to claim now. It never blocks; wake-ups that arrive
// while one is pending fold into it.
func (c *Claimer) Wake() { runstate.Signal(c.notified) }

// Running is how many of the claimer's jobs are running now.
func (c *Claimer) Running() int { return c.runs.Executing() }

// Stats returns the claimer's counters.
func (c *Claimer) Stats() Stats {
	return Stats{
		Claims:    c.claims.Load(),
		Fronts:    c.fronts.Load(),
		Claimed:   c.claimed.Load(),
		Completed: c.completer.Completed(),
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
	bg.Add(3)
	go func() { defer bg.Done(); c.completer.Run(bgCtx) }()
	go func() { defer bg.Done(); c.heartbeat.Run(bgCtx, heartbeatHook(ctx, c.cfg.Queue)) }()
	go func() { defer bg.Done(); c.attempts.Watch(bgCtx, workCtx) }()

	// The sleep key goes back as soon as claiming stops: peers take over.
	// The looks from the front stop with the claims.
	sleepCtx, stopSleep := context.WithCancel(ctx)
	var beside sync.WaitGroup
	beside.Go(func() { c.sleep.Run(sleepCtx) })
	beside.Go(func() { c.looker.Run(sleepCtx, c.Wake) })

	jobs := runners.New(func(r *runstate.Run) { c.attempts.Run(workCtx, r) })
	c.claimLoop(ctx, jobs)
	c.later.claimsEnded() // a job put back for later is now the others' to take
	if c.lost.Pending() { // a last try, as the loop would have made before its next claim
		c.giveBack(context.WithoutCancel(ctx))
	}
	stopSleep()
	beside.Wait()

	jobs.Close(c.shutdown(cancelWork, jobs))
	stopBackground() // the completer flushes what it holds before it returns
	bg.Wait()
	c.later.stop()
	c.logger.Info("claimer stopped", zap.Int64("claims", c.claims.Load()),
		zap.Int64("claimed", c.claimed.Load()), zap.Int64("completed", c.completer.Completed()))
	return nil
}

// shutdown lets running jobs finish for ShutdownTimeout, then cancels them
// and gives back at once those whose executors do not return within
// attempt.AbandonGrace. It reports whether every executor returned.
func (c *Claimer) shutdown(cancelWork context.CancelFunc, jobs *runners.Runners) bool {
	done := jobs.Wait()
	if n := c.Running(); n > 0 {
		c.logger.Info("stopping: waiting for running jobs", zap.Int("num_running", n),
			zap.Duration("shutdown_timeout", c.cfg.ShutdownTimeout))
	}
	grace := time.NewTimer(c.cfg.ShutdownTimeout)
	defer grace.Stop()
	select {
	case <-done:
		return true
	case <-grace.C:
	}

	c.logger.Info("stopping: shutdown timeout reached, cancelling running jobs", zap.Int("num_running", c.Running()))
	cancelWork()

	abandon := time.NewTimer(attempt.AbandonGrace)
	defer abandon.Stop()
	select {
	case <-done:
		return true
	case <-abandon.C:
	}
	c.attempts.AbandonAll()
	return false
}

// written is the completer's hook: later's, and tr's when tracing is on.
func written(tr *jobtrace.Tracer, later *laterWake) func([]runstate.Outcome, time.Time, time.Time) {
	return func(batch []runstate.Outcome, start, end time.Time) {
		if tr != nil {
			tr.Written(batch, start, end)
		}
		later.written(batch, start)
	}
}

// heartbeatHook is the test hook of ctx for heartbeats, if any.
func heartbeatHook(ctx context.Context, queue string) func(int64) {
	h := testhook.From(ctx).Heartbeat
	if h == nil {
		return nil
	}
	return func(n int64) { h(queue, n) }
}
