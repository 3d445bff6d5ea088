package claimer

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch/executors"
)

// maxErrorLen bounds last_error, in bytes.
const maxErrorLen = 2000

// run is one run of a claimed job, from its claim until its outcome is
// written. The claimer tracks runs, not job ids: a job whose lease was lost
// (a stalled worker, given back by the sweeper) may be claimed again by the
// same worker while its first run still goes on.
type run struct {
	job       *executors.Job
	claimedAt time.Time         // the row's updated_at as the claim wrote it: the claim's mark
	started   atomic.Int64      // when the executor started, in Unix nanoseconds; 0 until then
	deadline  atomic.Int64      // when the attempt times out, in Unix nanoseconds; 0 until it starts
	attempt   executors.Attempt // what the executor records

	// Guarded by the claimer's mu.
	reported    bool               // its outcome is in unwritten (or was written, or dropped)
	cancelled   error              // why the run was cancelled (cancel), nil while it was not
	cancelledAt time.Time          // when it was
	stop        context.CancelFunc // cancels the executor's context; nil until it starts
}

// outcome is what becomes of one attempt.
type outcome struct {
	run     *run
	status  string        // done, pending (retry or release) or dead
	delay   time.Duration // before the retry
	err     *string       // last_error; nil keeps the one before
	release bool          // interrupted by shutdown, or snoozed: give the attempt back
	snooze  bool          // snoozed by the executor
	entry   *string       // the failed attempt's entry in errors, as JSON; nil for none
	result  *string       // the done attempt's result, as JSON; nil for none
	drop    bool          // the run was cancelled: nothing is written
}

// execute runs one claimed job and queues its outcome, unless the job was
// abandoned meanwhile: then its slot and outcome are already accounted for.
func (c *Claimer) execute(workCtx context.Context, r *run) {
	job := r.job
	o, took := c.attempt(workCtx, r)
	if o, ok := c.report(r, o); ok {
		c.observe(job, o, took)
		return
	}
	c.logger.Warn("an abandoned job's executor returned at last; its result is dropped",
		zap.Int64("job_id", job.ID), zap.Int("attempt", job.Attempt))
}

// report queues o as the outcome of r and frees its slot; a run that was
// cancelled meanwhile has its outcome dropped instead. It returns the
// outcome as reported, and false, having done nothing, when r has an
// outcome already: it was given up on.
func (c *Claimer) report(r *run, o outcome) (outcome, bool) {
	c.mu.Lock()
	if r.reported {
		c.mu.Unlock()
		return o, false
	}
	r.reported = true
	c.executing--
	if r.cancelled != nil {
		o.drop = true
		delete(c.inflight, r)
	} else {
		c.unwritten = append(c.unwritten, o)
	}
	c.mu.Unlock()
	if !o.drop {
		signal(c.flush)
	} else {
		c.jobLogger(r.job).Info("job cancelled while it ran: its outcome is dropped", zap.NamedError("cause", r.cancelled))
	}
	signal(c.slotFreed)
	return o, true
}

// attempt runs one attempt and returns its outcome and how long the executor
// ran (0 when it did not).
func (c *Claimer) attempt(workCtx context.Context, r *run) (outcome, time.Duration) {
	job := r.job
	log := c.jobLogger(job)
	exec, ok := c.cfg.Registry.Lookup(job.Kind)
	if !ok {
		err := fmt.Errorf("unknown kind %q: no executor is registered for it (known kinds: %s)",
			job.Kind, strings.Join(c.cfg.Registry.Kinds(), ", "))
		return c.classify(log, r, executors.Permanent(err), false, 0), 0
	}
	timeout, set, err := executors.PayloadDuration(job.Payload, "timeout")
	if err != nil {
		return c.classify(log, r, executors.Permanent(err), false, 0), 0
	}
	if set && timeout > c.cfg.MaxJobTimeout {
		err := fmt.Errorf("payload.timeout: %s is longer than the worker's MAX_JOB_TIMEOUT (%s)", timeout, c.cfg.MaxJobTimeout)
		return c.classify(log, r, executors.Permanent(err), false, 0), 0
	}
	if !set || timeout == 0 {
		timeout = c.cfg.JobTimeout
	}
	job.Timeout = timeout

	// One context per run, the fewest layers: each costs the busiest
	// workers' CPU (allocations, and the parent's lock).
	start := time.Now()
	ctx, cancel := context.WithDeadline(r.attempt.Context(workCtx), start.Add(timeout))
	defer cancel()
	c.mu.Lock()
	r.stop = cancel // cancel() stops the run
	cancelled := r.cancelled != nil
	c.mu.Unlock()
	if cancelled {
		return outcome{run: r, drop: true}, 0
	}

	log.Debug("job started")
	if c.cfg.Observer != nil {
		c.cfg.Observer.JobStarted(job)
	}
	r.started.Store(start.UnixNano())
	// The watchdog gives up on the job if the executor ignores ctx.
	r.deadline.Store(start.Add(timeout).UnixNano())
	err = safeExecute(ctx, exec, job)
	timedOut := errors.Is(ctx.Err(), context.DeadlineExceeded)
	cancel()
	if err != nil && timedOut {
		err = fmt.Errorf("timed out after %s: %w", timeout, err)
	}
	c.mu.Lock()
	cancelled = r.cancelled != nil
	c.mu.Unlock()
	if cancelled {
		return outcome{run: r, drop: true}, time.Since(start)
	}
	// workCtx ends only at the hard stop: a failure then is the shutdown's.
	released := err != nil && workCtx.Err() != nil
	took := time.Since(start)
	log.Debug("job returned", zap.Duration("duration", took), zap.Bool("ok", err == nil))
	return c.classify(log, r, err, released, took), took
}

// observe tells the Observer of an attempt's outcome.
func (c *Claimer) observe(job *executors.Job, o outcome, took time.Duration) {
	if c.cfg.Observer == nil {
		return
	}
	result := Outcome(o.status)
	switch {
	case o.drop:
		result = OutcomeCancelled
	case o.snooze:
		result = OutcomeSnoozed
	case o.release:
		result = OutcomeReleased
	case o.status == statusPending:
		result = OutcomeRetry
	}
	c.cfg.Observer.JobFinished(job, result, took)
}

// watchdogInterval is how often the watchdog looks for executors that
// outlived their jobs' deadlines. It sends nothing to the database.
const watchdogInterval = 500 * time.Millisecond

// runWatchdog abandons jobs whose executors have not returned abandonGrace
// after their deadline: an executor that ignores its context must not hold
// the job and its slot for ever (the heartbeat would keep the lease).
func (c *Claimer) runWatchdog(ctx, workCtx context.Context) {
	t := time.NewTicker(watchdogInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		limit := now.Add(-abandonGrace).UnixNano()
		for _, r := range c.unreported(func(r *run) bool { d := r.deadline.Load(); return d != 0 && d < limit }) {
			err := fmt.Errorf("the executor did not return within %s of the job's end (timeout %s): abandoned", abandonGrace, r.job.Timeout)
			c.abandon(r, err, workCtx.Err() != nil)
		}
		// A cancelled run gets the same grace from its cancel: its outcome
		// is dropped, and its slot is free again.
		for _, r := range c.unreported(func(r *run) bool { return r.cancelled != nil && now.Sub(r.cancelledAt) > abandonGrace }) {
			c.abandon(r, errors.New("the executor did not return after its job was cancelled: abandoned"), false)
		}
	}
}

// unreported lists the runs whose outcome is not known yet and that match.
func (c *Claimer) unreported(match func(*run) bool) []*run {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*run
	for r := range c.inflight {
		if !r.reported && match(r) {
			out = append(out, r)
		}
	}
	return out
}

// abandon records an outcome for r, whose executor has not returned: a
// retry, dead, or, when released, given back. Its slot is free again, the
// executor's goroutine is left to finish or not, and its result is dropped.
func (c *Claimer) abandon(r *run, err error, released bool) {
	o := c.classify(c.jobLogger(r.job), r, err, released, r.ran())
	if o, ok := c.report(r, o); ok {
		c.observe(r.job, o, r.ran())
	}
}

// jobLogger is the logger of one job's life. Its fields are added lazily:
// zap's With costs an allocation per job, which a busy worker notices.
func (c *Claimer) jobLogger(job *executors.Job) jobLog {
	return jobLog{c.logger, job}
}

type jobLog struct {
	l   *zap.Logger
	job *executors.Job
}

func (j jobLog) fields(extra []zap.Field) []zap.Field {
	return append([]zap.Field{zap.Int64("job_id", j.job.ID), zap.String("kind", j.job.Kind), zap.Int("attempt", j.job.Attempt)}, extra...)
}

func (j jobLog) Debug(msg string, f ...zap.Field) {
	if ce := j.l.Check(zap.DebugLevel, msg); ce != nil {
		ce.Write(j.fields(f)...)
	}
}

func (j jobLog) Info(msg string, f ...zap.Field) { j.l.Info(msg, j.fields(f)...) }
func (j jobLog) Warn(msg string, f ...zap.Field) { j.l.Warn(msg, j.fields(f)...) }

// safeExecute turns a panic in the executor into an error of this job alone.
func safeExecute(ctx context.Context, exec executors.Executor, job *executors.Job) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("executor panicked: %v\n%s", r, firstLines(string(debug.Stack()), 12))
		}
	}()
	return exec.Execute(ctx, job)
}

// classify turns an attempt's error into its outcome. released: the
// attempt was cut short by the worker's shutdown after it ran for took.
// A done attempt's outcome carries its result, and a counted failure's
// its entry in the job's errors.
func (c *Claimer) classify(log jobLog, r *run, err error, released bool, took time.Duration) outcome {
	o := c.decide(log, r, err, released, took)
	switch {
	case o.status == statusDone:
		if res := r.result(); res != nil {
			o.result = ptr(string(res))
		}
	case !o.release:
		o.entry = c.entry(r, *o.err)
	}
	return o
}

func (c *Claimer) decide(log jobLog, r *run, err error, released bool, took time.Duration) outcome {
	job := r.job
	o := outcome{run: r}
	if err == nil {
		o.status = statusDone
		log.Debug("job done")
		return o
	}
	// Declared past the success, which is most outcomes: errors.As moves
	// each to the heap.
	var (
		permanent  *executors.PermanentError
		retryAfter *executors.RetryAfterError
		snooze     *executors.SnoozeError
	)
	switch {
	case errors.As(err, &snooze):
		o.status, o.release, o.snooze, o.delay = statusPending, true, true, snooze.Delay
		log.Debug("job snoozed", zap.Duration("delay", snooze.Delay))
		return o
	case released && took <= c.cfg.JobTimeout:
		o.status, o.release = statusPending, true
		o.err = errText(fmt.Errorf("interrupted by worker shutdown: %w", err))
		log.Info("job given back at shutdown", zap.Error(err))
		return o
	case released:
		// A job that outlasts JobTimeout at every shutdown would otherwise
		// be given back, uncounted, for ever.
		err = fmt.Errorf("interrupted by worker shutdown after running %s, longer than JOB_TIMEOUT (%s), so the attempt counts: %w",
			took.Round(time.Millisecond), c.cfg.JobTimeout, err)
	case errors.As(err, &permanent):
		o.status, o.err = statusDead, errText(err)
		log.Warn("job dead: permanent error", zap.Error(err))
		return o
	}
	if job.Attempt >= job.MaxAttempts {
		o.status = statusDead
		o.err = errText(fmt.Errorf("attempt %d of %d: %w", job.Attempt, job.MaxAttempts, err))
		log.Warn("job dead: attempts used up", zap.Error(err), zap.Int("max_attempts", job.MaxAttempts))
		return o
	}
	o.status, o.err = statusPending, errText(err)
	switch {
	case released:
		o.delay = 0 // another worker may take it at once
	case errors.As(err, &retryAfter):
		o.delay = retryAfter.Delay
	default:
		o.delay = c.cfg.RetryBackoff(job.Attempt)
	}
	log.Warn("job failed: will retry", zap.Error(err), zap.Duration("retry_in", o.delay))
	return o
}

// historyEntry is a failed attempt's entry in the job's errors.
type historyEntry struct {
	Attempt    int             `json:"attempt"`
	StartedAt  *time.Time      `json:"started_at"` // nil when the executor did not start
	FinishedAt time.Time       `json:"finished_at"`
	Worker     string          `json:"worker"`
	Error      string          `json:"error"`
	Result     json.RawMessage `json:"result,omitempty"`
}

// entry is r's entry in the job's errors, as JSON.
func (c *Claimer) entry(r *run, errText string) *string {
	e := historyEntry{
		Attempt: r.job.Attempt, FinishedAt: time.Now().UTC(), Worker: c.cfg.WorkerID,
		Error: errText, Result: r.result(),
	}
	if s := r.started.Load(); s != 0 {
		e.StartedAt = ptr(time.Unix(0, s).UTC())
	}
	b, err := json.Marshal(e)
	if err != nil { // a result is valid JSON (executors.RecordResult); this cannot happen
		c.logger.Error("a history entry did not marshal", zap.Error(err))
		return nil
	}
	return ptr(string(b))
}

// result is what r's executor recorded, or nil.
func (r *run) result() json.RawMessage {
	return r.attempt.Result()
}

func ptr[T any](v T) *T { return &v }

// ran is how long r's executor has run; 0 before it started.
func (r *run) ran() time.Duration {
	if s := r.started.Load(); s != 0 {
		return time.Since(time.Unix(0, s))
	}
	return 0
}

// errText makes err fit last_error: printable (executors.Printable: valid
// UTF-8, control characters other than tab and line feed escaped, NUL
// among them), at most maxErrorLen bytes.
func errText(err error) *string {
	s := executors.Printable(err.Error())
	if len(s) > maxErrorLen {
		cut := maxErrorLen
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut] + "…"
	}
	return &s
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	return strings.Join(lines[:min(n, len(lines))], "\n")
}

// shutdown lets running jobs finish for ShutdownTimeout, then cancels them and
// gives back at once those whose executors do not return within abandonGrace.
// It reports whether every executor returned.
func (c *Claimer) shutdown(cancelWork context.CancelFunc, jobs *runners) bool {
	done := jobs.wait()
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

	abandon := time.NewTimer(abandonGrace)
	defer abandon.Stop()
	select {
	case <-done:
		return true
	case <-abandon.C:
	}
	for _, r := range c.unreported(func(*run) bool { return true }) {
		c.abandon(r, errors.New("the executor did not return after cancellation"), true)
	}
	return false
}
