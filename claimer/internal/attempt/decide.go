package attempt

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/pgdispatch/pgdispatch/claimer/internal/runstate"
	"github.com/pgdispatch/pgdispatch/executors"
)

// maxErrorLen bounds last_error, in bytes.
const maxErrorLen = 2000

// Ending is how an attempt ended, as the outcome's decision sees it.
type Ending struct {
	// Err is what the executor returned, or why it was given up on (an
	// unknown kind, a bad payload, an executor that did not return). nil:
	// the attempt is done.
	Err error
	// Stopped: the run was stopped, its row no longer its attempt (an
	// operator cancelled the job, or its lease was lost).
	Stopped bool
	// Interrupted: the worker's hard stop cut the attempt short.
	Interrupted bool
	// Ran is how long the executor ran; 0 when it did not start.
	Ran                  time.Duration
	Attempt, MaxAttempts int
}

// Policy is what the worker's settings say of outcomes.
type Policy struct {
	// JobTimeout: an attempt interrupted after running longer counts.
	JobTimeout time.Duration
	// Backoff is the delay before the retry that follows attempt n.
	Backoff func(attempt int) time.Duration
}

// Decision is what becomes of an attempt.
type Decision struct {
	Verdict runstate.Verdict
	Delay   time.Duration // Retry and Snoozed: until the job is due again
	Until   time.Time     // Snoozed: when set, the instant the job is due again, not Delay from now
	// LastError is the row's new last_error (nil keeps the one before):
	// printable, and at most maxErrorLen bytes.
	LastError *string
	// Err is the failure as the decision read it, for the log.
	Err error
	// UsedUp: Dead because no attempt is left, not for a permanent error.
	UsedUp bool
	// GiveBack: Dead of an error that sent nothing (executors.Unsent),
	// its attempt given back.
	GiveBack bool
}

// Decide decides what becomes of an attempt. It is a pure function of its
// arguments, given a pure p.Backoff:
//
//	stopped                                       dropped: nothing is written
//	no error                                      done
//	executors.Snooze                              snoozed after its delay, the attempt given back
//	interrupted within JobTimeout                 released: due at once, the attempt given back
//	interrupted after JobTimeout                  counts: retry at once, or dead when none is left
//	executors.Permanent                           dead
//	executors.Unsent                              dead, the attempt given back
//	any other error, no attempt left              dead
//	executors.RetryAfter                          retry after its delay
//	any other error                               retry after p.Backoff(attempt)
func Decide(e Ending, p Policy) Decision {
	if e.Stopped {
		return Decision{Verdict: runstate.Dropped}
	}
	err := e.Err
	if err == nil {
		return Decision{Verdict: runstate.Done}
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
		return Decision{Verdict: runstate.Snoozed, Delay: snooze.Delay, Until: snooze.Until}
	case e.Interrupted && e.Ran <= p.JobTimeout:
		last := errText(fmt.Errorf("interrupted by worker shutdown: %w", err))
		return Decision{Verdict: runstate.Released, Err: err, LastError: last}
	case e.Interrupted:
		// A job that outlasts JobTimeout at every shutdown would otherwise
		// be given back, uncounted, for ever.
		err = fmt.Errorf("interrupted by worker shutdown after running %s, longer than JOB_TIMEOUT (%s), so the attempt counts: %w",
			e.Ran.Round(time.Millisecond), p.JobTimeout, err)
	case errors.As(err, &permanent):
		return Decision{Verdict: runstate.Dead, Err: err, LastError: errText(err), GiveBack: permanent.Unsent}
	}
	if e.Attempt >= e.MaxAttempts {
		last := errText(fmt.Errorf("attempt %d of %d: %w", e.Attempt, e.MaxAttempts, err))
		return Decision{Verdict: runstate.Dead, Err: err, UsedUp: true, LastError: last}
	}
	d := Decision{Verdict: runstate.Retry, Err: err, LastError: errText(err)}
	switch {
	case e.Interrupted:
		d.Delay = 0 // another worker may take it at once
	case errors.As(err, &retryAfter):
		d.Delay = retryAfter.Delay
	default:
		d.Delay = p.Backoff(e.Attempt)
	}
	return d
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
