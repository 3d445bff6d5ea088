// Package attempt runs a claimer's attempts: each calls its job's executor
// under the job's timeout, decides the outcome (Decide, a pure function)
// and hands it to the run's owner, the runstate.Tracker. A watchdog gives
// up on executors that do not return.
package attempt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/pgdispatch/pgdispatch/claimer/internal/jobtrace"
	"github.com/pgdispatch/pgdispatch/claimer/internal/runstate"
	"github.com/pgdispatch/pgdispatch/executors"
)

// Observer hears of each attempt's start and outcome. Its methods must not
// block.
type Observer interface {
	JobStarted(job *executors.Job)
	// JobFinished is called with each attempt's outcome and how long the
	// executor ran (0 when it never ran).
	JobFinished(job *executors.Job, verdict runstate.Verdict, took time.Duration)
}

// Config configures Attempts. Every field is required but Observer and
// Trace.
type Config struct {
	Runs          *runstate.Tracker
	Registry      *executors.Registry
	Policy        Policy
	MaxJobTimeout time.Duration // the longest payload "timeout"
	WorkerID      string
	Observer      Observer
	Trace         *jobtrace.Tracer // nil when tracing is off
	Logger        *zap.Logger
}

// Attempts runs the attempts of one claimer.
type Attempts struct{ cfg Config }

// New returns Attempts.
func New(cfg Config) *Attempts { return &Attempts{cfg: cfg} }

// Run runs one attempt of r and reports its outcome, unless the run was
// given up on meanwhile: then its slot and outcome are already accounted
// for. Jobs run under workCtx, which ends at the worker's hard stop.
func (a *Attempts) Run(workCtx context.Context, r *runstate.Run) {
	ending := a.try(workCtx, r)
	if a.report(r, ending) {
		return
	}
	a.cfg.Logger.Warn("an abandoned job's executor returned at last; its result is dropped",
		zap.Int64("job_id", r.Job.ID), zap.Int("attempt", r.Job.Attempt))
}

// try runs the executor of r's job, and says how the attempt ended.
func (a *Attempts) try(workCtx context.Context, r *runstate.Run) Ending {
	job := r.Job
	ending := Ending{Attempt: job.Attempt, MaxAttempts: job.MaxAttempts}
	exec, ok := a.cfg.Registry.Lookup(job.Kind)
	if !ok {
		ending.Err = executors.Permanent(fmt.Errorf("unknown kind %q: no executor is registered for it (known kinds: %s)",
			job.Kind, strings.Join(a.cfg.Registry.Kinds(), ", ")))
		return ending
	}
	timeout, set, err := executors.PayloadDuration(job.Payload, "timeout")
	if err != nil {
		ending.Err = executors.Permanent(err)
		return ending
	}
	if set && timeout > a.cfg.MaxJobTimeout {
		ending.Err = executors.Permanent(fmt.Errorf("payload.timeout: %s is longer than the worker's MAX_JOB_TIMEOUT (%s)", timeout, a.cfg.MaxJobTimeout))
		return ending
	}
	if !set || timeout == 0 {
		timeout = a.cfg.Policy.JobTimeout
	}
	job.Timeout = timeout

	// One context per run, the fewest layers: each costs the busiest
	// workers' CPU (allocations, and the parent's lock).
	start := time.Now()
	base := r.Recorded.Context(workCtx)
	if a.cfg.Trace != nil {
		base = a.cfg.Trace.Context(base, r)
	}
	ctx, cancel := context.WithDeadline(base, start.Add(timeout))
	defer cancel()
	if a.cfg.Runs.Start(r, cancel) {
		ending.Stopped = true
		return ending
	}
	log := a.jobLog(r)
	log.Debug("job started")
	if a.cfg.Observer != nil {
		a.cfg.Observer.JobStarted(job)
	}
	// The watchdog gives up on the job if the executor ignores ctx.
	r.Begin(start, start.Add(timeout))
	err = safeExecute(ctx, exec, job)
	timedOut := errors.Is(ctx.Err(), context.DeadlineExceeded)
	cancel()
	ending.Ran = time.Since(start)
	if a.cfg.Runs.Stopped(r) {
		ending.Stopped = true
		return ending
	}
	if err != nil && timedOut {
		err = fmt.Errorf("timed out after %s: %w", timeout, err)
	}
	// workCtx ends only at the hard stop: a failure then is the shutdown's.
	ending.Err, ending.Interrupted = err, err != nil && workCtx.Err() != nil
	log.Debug("job returned", zap.Duration("duration", ending.Ran), zap.Bool("ok", err == nil))
	return ending
}

// report decides the outcome of r's attempt, hands it to the Tracker and
// tells the Observer. It reports false, having done nothing, when r has
// an outcome already.
func (a *Attempts) report(r *runstate.Run, e Ending) bool {
	d := Decide(e, a.cfg.Policy)
	o := runstate.Outcome{Run: r, Verdict: d.Verdict, Delay: d.Delay, Until: d.Until, Err: d.LastError, Unsent: d.GiveBack}
	switch d.Verdict {
	case runstate.Done:
		if res := r.Result(); res != nil {
			o.Result = ptr(string(res))
		}
	case runstate.Retry, runstate.Dead:
		o.Entry = a.entry(r, *d.LastError)
	}
	o, ok := a.cfg.Runs.Report(r, o)
	if !ok {
		return false
	}
	if a.cfg.Trace != nil {
		a.cfg.Trace.Reported(o)
	}
	a.log(r, o, d)
	if a.cfg.Observer != nil {
		a.cfg.Observer.JobFinished(r.Job, o.Verdict, e.Ran)
	}
	return true
}

// log logs an attempt's outcome o, as d decided it.
func (a *Attempts) log(r *runstate.Run, o runstate.Outcome, d Decision) {
	job, log := r.Job, a.jobLog(r)
	switch o.Verdict {
	case runstate.Done:
		log.Debug("job done")
	case runstate.Snoozed:
		log.Debug("job snoozed", zap.Duration("delay", o.Delay))
	case runstate.Released:
		log.Info("job given back at shutdown", zap.Error(d.Err))
	case runstate.Dead:
		if d.UsedUp {
			log.Warn("job dead: attempts used up", zap.Error(d.Err), zap.Int("max_attempts", job.MaxAttempts))
		} else {
			log.Warn("job dead: permanent error", zap.Error(d.Err))
		}
	case runstate.Retry:
		log.Warn("job failed: will retry", zap.Error(d.Err), zap.Duration("retry_in", o.Delay))
	case runstate.Dropped:
		log.Info("job cancelled while it ran: its outcome is dropped", zap.NamedError("cause", o.Cause))
	}
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
func (a *Attempts) entry(r *runstate.Run, errText string) *string {
	e := historyEntry{
		Attempt: r.Job.Attempt, FinishedAt: time.Now().UTC(), Worker: a.cfg.WorkerID,
		Error: errText, Result: r.Result(),
	}
	if s := r.StartedAt(); !s.IsZero() {
		e.StartedAt = ptr(s.UTC())
	}
	b, err := json.Marshal(e)
	if err != nil { // a result is valid JSON (executors.RecordResult); this cannot happen
		a.cfg.Logger.Error("a history entry did not marshal", zap.Error(err))
		return nil
	}
	return ptr(string(b))
}

func ptr[T any](v T) *T { return &v }

// safeExecute turns a panic in the executor into an error of this job alone.
func safeExecute(ctx context.Context, exec executors.Executor, job *executors.Job) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("executor panicked: %v\n%s", r, firstLines(string(debug.Stack()), 12))
		}
	}()
	return exec.Execute(ctx, job)
}

// jobLog is the logger of one job's life. Its fields are added lazily:
// zap's With costs an allocation per job, which a busy worker notices.
type jobLog struct {
	l       *zap.Logger
	job     *executors.Job
	traceID string // the attempt's trace, when tracing is on
}

// jobLog is the logger of r's attempt.
func (a *Attempts) jobLog(r *runstate.Run) jobLog {
	l := jobLog{l: a.cfg.Logger, job: r.Job}
	if a.cfg.Trace != nil {
		l.traceID = a.cfg.Trace.TraceID(r)
	}
	return l
}

func (j jobLog) fields(extra []zap.Field) []zap.Field {
	f := append([]zap.Field{zap.Int64("job_id", j.job.ID), zap.String("kind", j.job.Kind), zap.Int("attempt", j.job.Attempt)}, extra...)
	if j.traceID != "" {
		f = append(f, zap.String("trace_id", j.traceID))
	}
	return f
}

// Debug logs at debug level, which a worker runs without: the level is
// asked first, and the entry is made in a frame of its own. zap's Check
// takes a frame of over a kilobyte, and on the job's path it made a
// runner's stack outgrow its 4 KiB; the garbage collector shrinks the stack
// of a runner waiting for its next job, so it grew again after every
// collection, several times a second in a drain (pprof: runtime.newstack,
// runtime.copystack, 5 % of the worker's CPU).
func (j jobLog) Debug(msg string, f ...zap.Field) {
	if j.l.Core().Enabled(zapcore.DebugLevel) {
		j.debug(msg, f)
	}
}

//go:noinline
func (j jobLog) debug(msg string, f []zap.Field) {
	if ce := j.l.Check(zap.DebugLevel, msg); ce != nil {
		ce.Write(j.fields(f)...)
	}
}

func (j jobLog) Info(msg string, f ...zap.Field) { j.l.Info(msg, j.fields(f)...) }
func (j jobLog) Warn(msg string, f ...zap.Field) { j.l.Warn(msg, j.fields(f)...) }
