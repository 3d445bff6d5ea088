// Package runstate owns the state of a claimer's runs. One Tracker per
// claimer holds every run from its claim until its outcome is written:
// which runs execute, which were stopped and why, and which outcomes wait
// to be written. The loop, the attempts, the heartbeat and the completer
// ask it; none of them keeps a run's state of its own.
package runstate

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"time"

	"github.com/pgdispatch/pgdispatch/executors"
)

// The causes of a run's stop.
var (
	// ErrCancelled: a cancel notice named the job, and its row is no longer
	// this run's attempt.
	ErrCancelled = errors.New("the job was cancelled")
	// ErrLeaseLost: the heartbeat found the row no longer running under
	// this worker's claim, without a notice: the sweeper gave it back (and
	// it may have been claimed again since), or it was cancelled and the
	// notice missed.
	ErrLeaseLost = errors.New("the job's row is no longer this worker's running attempt (its lease was lost, or it was cancelled)")
)

// Run is one run of a claimed job, from its claim until its outcome is
// written. Runs are tracked, not job ids: a job whose lease was lost (a
// stalled worker, given back by the sweeper) may be claimed again by the
// same worker while its first run still goes on.
type Run struct {
	Job       *executors.Job
	ClaimedAt time.Time         // the row's updated_at as the claim wrote it: the claim's mark
	Recorded  executors.Attempt // what the executor records
	started   atomic.Int64      // when the executor started, in Unix nanoseconds; 0 until then
	deadline  atomic.Int64      // when the attempt times out, in Unix nanoseconds; 0 until it starts

	// Guarded by the Tracker's mu.
	reported    bool               // its outcome is in unwritten (or was written, or dropped)
	noticed     bool               // a cancel notice named its job
	stopped     error              // why the run was stopped, nil while it was not
	stoppedAt   time.Time          // when it was
	stopContext context.CancelFunc // cancels the executor's context; nil until it starts
}

// Begin marks the executor's start, and when its attempt times out.
func (r *Run) Begin(start, deadline time.Time) {
	r.started.Store(start.UnixNano())
	r.deadline.Store(deadline.UnixNano())
}

// StartedAt is when the executor started; zero before.
func (r *Run) StartedAt() time.Time {
	if s := r.started.Load(); s != 0 {
		return time.Unix(0, s)
	}
	return time.Time{}
}

// Ran is how long the executor has run; 0 before it started.
func (r *Run) Ran() time.Duration {
	if s := r.started.Load(); s != 0 {
		return time.Since(time.Unix(0, s))
	}
	return 0
}

// Result is what the executor recorded, or nil.
func (r *Run) Result() json.RawMessage { return r.Recorded.Result() }

// Verdict is what becomes of an attempt.
type Verdict uint8

// The verdicts.
const (
	Done     Verdict = iota
	Retry            // pending again after a delay, the attempt counted
	Dead             // no attempt is left, or the error was permanent
	Snoozed          // pending again after the executor's delay, the attempt given back
	Released         // given back at the worker's shutdown, the attempt given back
	Dropped          // the run was stopped (cancelled, or its lease lost): nothing is written
)

// Outcome is the outcome of one run, as the completer writes it.
type Outcome struct {
	Run     *Run
	Verdict Verdict
	Delay   time.Duration // Retry, Snoozed: until the job is due again
	Until   time.Time     // Snoozed: when set, the instant the job is due again, not Delay from now
	Err     *string       // last_error; nil keeps the one before
	Entry   *string       // a counted failure's entry in the job's errors, as JSON; nil for none
	Result  *string       // a done attempt's result, as JSON; nil for none
	Cause   error         // Dropped: why the run was stopped
	Unsent  bool          // Dead: the job sent nothing (executors.Unsent), the attempt given back
}

// Status is the row's status once the outcome is written.
func (o Outcome) Status() string {
	switch o.Verdict {
	case Done:
		return "done"
	case Dead:
		return "dead"
	default:
		return "pending"
	}
}

// GivesBack reports whether the outcome gives the attempt back.
func (o Outcome) GivesBack() bool {
	return o.Verdict == Snoozed || o.Verdict == Released || (o.Verdict == Dead && o.Unsent)
}
