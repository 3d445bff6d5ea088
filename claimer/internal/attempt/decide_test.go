package attempt

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/claimer/internal/runstate"
	"github.com/pgdispatch/pgdispatch/executors"
)

// Every outcome of an attempt, decided alone: done, snoozed, released at
// shutdown, dead (permanent, attempts used up), retried (after the
// backoff, after the executor's delay, at once after a counted shutdown),
// dropped when stopped, and the watchdog's abandoned attempts.
func TestDecide(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	policy := Policy{JobTimeout: time.Minute, Backoff: func(attempt int) time.Duration { return time.Duration(attempt) * time.Hour }}
	// A counted interruption after the job ran 2 minutes, past JobTimeout.
	long := "interrupted by worker shutdown after running 2m0s, longer than JOB_TIMEOUT (1m0s), so the attempt counts: boom"
	abandoned := fmt.Errorf("the executor did not return within %s of the job's end (timeout %s): abandoned", AbandonGrace, time.Minute)
	cases := []struct {
		name     string
		ending   Ending
		want     runstate.Verdict
		delay    time.Duration
		last     string // last_error; "" for none
		usedUp   bool
		giveBack bool
	}{
		{name: "done", ending: Ending{Attempt: 1, MaxAttempts: 5}, want: runstate.Done},
		{name: "done on the last attempt", ending: Ending{Attempt: 5, MaxAttempts: 5}, want: runstate.Done},
		{name: "failed: retry after the backoff of its attempt", ending: Ending{Err: boom, Attempt: 2, MaxAttempts: 5}, want: runstate.Retry, delay: 2 * time.Hour, last: "boom"},
		{name: "failed on the last attempt: dead", ending: Ending{Err: boom, Attempt: 5, MaxAttempts: 5}, want: runstate.Dead, last: "attempt 5 of 5: boom", usedUp: true},
		{name: "failed past the last attempt: dead", ending: Ending{Err: boom, Attempt: 7, MaxAttempts: 5}, want: runstate.Dead, last: "attempt 7 of 5: boom", usedUp: true},
		{name: "retry after the executor's delay", ending: Ending{Err: executors.RetryAfter(3*time.Second, boom), Attempt: 1, MaxAttempts: 5}, want: runstate.Retry, delay: 3 * time.Second, last: "boom"},
		{name: "retry after: no attempt left", ending: Ending{Err: executors.RetryAfter(3*time.Second, boom), Attempt: 5, MaxAttempts: 5}, want: runstate.Dead, last: "attempt 5 of 5: boom", usedUp: true},
		{name: "permanent: dead with attempts left", ending: Ending{Err: executors.Permanent(boom), Attempt: 1, MaxAttempts: 5}, want: runstate.Dead, last: "boom"},
		{name: "permanent, wrapped", ending: Ending{Err: fmt.Errorf("call: %w", executors.Permanent(boom)), Attempt: 1, MaxAttempts: 5}, want: runstate.Dead, last: "call: boom"},
		{name: "unsent: dead, the attempt given back", ending: Ending{Err: executors.Unsent(boom), Attempt: 1, MaxAttempts: 5}, want: runstate.Dead, last: "boom", giveBack: true},
		{name: "unsent on the last attempt: dead, the attempt given back", ending: Ending{Err: fmt.Errorf("call: %w", executors.Unsent(boom)), Attempt: 5, MaxAttempts: 5}, want: runstate.Dead, last: "call: boom", giveBack: true},
		{name: "snoozed: its delay, nothing recorded", ending: Ending{Err: executors.Snooze(time.Hour), Attempt: 5, MaxAttempts: 5}, want: runstate.Snoozed, delay: time.Hour},
		{name: "snoozed as the shutdown came", ending: Ending{Err: executors.Snooze(time.Hour), Interrupted: true, Ran: time.Hour, Attempt: 1, MaxAttempts: 5}, want: runstate.Snoozed, delay: time.Hour},
		{name: "interrupted within JobTimeout: released", ending: Ending{Err: context.Canceled, Interrupted: true, Ran: time.Minute, Attempt: 5, MaxAttempts: 5}, want: runstate.Released, last: "interrupted by worker shutdown: context canceled"},
		{name: "interrupted past JobTimeout: counts, retried at once", ending: Ending{Err: boom, Interrupted: true, Ran: 2 * time.Minute, Attempt: 1, MaxAttempts: 5}, want: runstate.Retry, last: long},
		{name: "interrupted past JobTimeout on the last attempt: dead", ending: Ending{Err: boom, Interrupted: true, Ran: 2 * time.Minute, Attempt: 5, MaxAttempts: 5}, want: runstate.Dead, last: "attempt 5 of 5: " + long, usedUp: true},
		{name: "interrupted past JobTimeout, permanent: counts, retried at once", ending: Ending{Err: executors.Permanent(boom), Interrupted: true, Ran: 2 * time.Minute, Attempt: 1, MaxAttempts: 5}, want: runstate.Retry, last: long},
		{name: "interrupted past JobTimeout, retry after: at once", ending: Ending{Err: executors.RetryAfter(time.Hour, boom), Interrupted: true, Ran: 2 * time.Minute, Attempt: 1, MaxAttempts: 5}, want: runstate.Retry, last: long},
		{name: "stopped: dropped", ending: Ending{Stopped: true, Attempt: 1, MaxAttempts: 5}, want: runstate.Dropped},
		{name: "stopped after it failed: dropped", ending: Ending{Err: boom, Stopped: true, Attempt: 5, MaxAttempts: 5}, want: runstate.Dropped},
		{name: "stopped at shutdown: dropped", ending: Ending{Err: context.Canceled, Stopped: true, Interrupted: true, Attempt: 1, MaxAttempts: 5}, want: runstate.Dropped},
		{name: "abandoned past its deadline: retried", ending: Ending{Err: abandoned, Ran: time.Minute + AbandonGrace, Attempt: 1, MaxAttempts: 5}, want: runstate.Retry, delay: time.Hour, last: abandoned.Error()},
		{name: "abandoned past its deadline, no attempt left: dead", ending: Ending{Err: abandoned, Ran: time.Minute + AbandonGrace, Attempt: 5, MaxAttempts: 5}, want: runstate.Dead, last: "attempt 5 of 5: " + abandoned.Error(), usedUp: true},
		{name: "abandoned at the hard stop: released", ending: Ending{Err: boom, Interrupted: true, Ran: time.Second, Attempt: 1, MaxAttempts: 5}, want: runstate.Released, last: "interrupted by worker shutdown: boom"},
		{name: "abandoned after its cancel: dropped", ending: Ending{Err: boom, Stopped: true, Ran: time.Hour, Attempt: 1, MaxAttempts: 5}, want: runstate.Dropped},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			d := Decide(c.ending, policy)
			require.Equal(t, c.want, d.Verdict)
			require.Equal(t, c.delay, d.Delay)
			require.Equal(t, c.usedUp, d.UsedUp)
			require.Equal(t, c.giveBack, d.GiveBack)
			if c.last == "" {
				require.Nil(t, d.LastError)
			} else {
				require.NotNil(t, d.LastError)
				require.Equal(t, c.last, *d.LastError)
			}
			if d.Verdict == runstate.Dead || d.Verdict == runstate.Retry || d.Verdict == runstate.Released {
				require.Error(t, d.Err, "the log names the failure")
			}
		})
	}
}

// The default backoff is called with the attempt that failed, and only
// for a retry.
func TestDecideCallsTheBackoffForRetriesOnly(t *testing.T) {
	t.Parallel()
	var calls []int
	p := Policy{JobTimeout: time.Minute, Backoff: func(attempt int) time.Duration { calls = append(calls, attempt); return time.Second }}
	Decide(Ending{Attempt: 1, MaxAttempts: 5}, p)
	Decide(Ending{Err: executors.Permanent(errors.New("x")), Attempt: 1, MaxAttempts: 5}, p)
	Decide(Ending{Err: errors.New("x"), Attempt: 5, MaxAttempts: 5}, p)
	Decide(Ending{Err: errors.New("x"), Attempt: 3, MaxAttempts: 5}, p)
	require.Equal(t, []int{3}, calls)
}

// last_error is printable and bounded, whatever the executor said.
func TestErrText(t *testing.T) {
	t.Parallel()
	s := *errText(errors.New("bad\x00byte \xff here, \x1b[31mred\x1b[0m\r\u202eevil, line\nnext"))
	require.True(t, utf8.ValidString(s))
	require.NotContains(t, s, "\x00")
	require.NotContains(t, s, "\x1b")
	require.NotContains(t, s, "\r")
	require.NotContains(t, s, "\u202e")
	require.Contains(t, s, `\x1b[31mred`)
	require.Contains(t, s, "line\nnext", "line feeds stay: a panic's stack reads better")
	long := *errText(errors.New(strings.Repeat("é", maxErrorLen)))
	require.True(t, utf8.ValidString(long))
	require.LessOrEqual(t, len(long), maxErrorLen+len("…"))
}

// A snooze until an instant keeps the instant, which the completer writes
// as the job's run_at, and its delay, for the log.
func TestDecideSnoozeUntil(t *testing.T) {
	t.Parallel()
	at := time.Date(2030, 1, 2, 3, 4, 5, 6000, time.UTC)
	d := Decide(Ending{Err: executors.SnoozeUntil(at, time.Minute), Attempt: 5, MaxAttempts: 5}, Policy{JobTimeout: time.Minute})
	require.Equal(t, runstate.Snoozed, d.Verdict)
	require.Equal(t, at, d.Until)
	require.Equal(t, time.Minute, d.Delay)
	require.Nil(t, d.LastError)
}
