package claimer

import (
	"sync"
	"time"

	"github.com/pgdispatch/pgdispatch/claimer/internal/runstate"
)

// laterWake wakes the claimer when the earliest job that its own outcomes
// put back to pending for later (a retry after its backoff, a snooze) is
// due. Those outcomes notify no sleeping claimer (migration 025): the
// claimer may have gone to sleep before they were written, with no timer
// that covers them. A claim that a wake makes too early finds the job's
// run_at as the queue's next, and sets the loop's timer to it.
//
// The other workers of the queue do not know of such a job either, so the
// wake tells them (announce: a notification on the queue) when this
// claimer cannot take it itself: when it is due while every slot of the
// claimer is taken, and when the claimer stops before it is due. A claim
// the notification makes finds the job due, or its run_at as the queue's
// next.
type laterWake struct {
	wake     func()
	free     func() int // the claimer's free slots
	announce func()     // notifies every sleeping claimer of the queue; blocks for a round trip

	mu      sync.Mutex
	timer   *time.Timer
	at      time.Time // when timer fires
	stopped bool
}

// written is the completer's hook: it sets the wake for the batch's
// earliest job put back for later, whose write began at start. A job
// snoozed until an instant (Until, on the database's clock) is due then,
// whatever its Delay, which is the worker's reckoning for its log and may
// be 0 or longer (executors.SnoozeUntil): it wakes at the earlier of the
// two, as a wake that comes too early costs only a claim.
func (l *laterWake) written(batch []runstate.Outcome, start time.Time) {
	var at time.Time
	for _, o := range batch {
		if o.Verdict != runstate.Retry && o.Verdict != runstate.Snoozed {
			continue
		}
		var t time.Time
		if o.Delay > 0 {
			t = start.Add(o.Delay)
		}
		if !o.Until.IsZero() && (t.IsZero() || o.Until.Before(t)) {
			t = o.Until
		}
		if !t.IsZero() && (at.IsZero() || t.Before(at)) {
			at = t
		}
	}
	if at.IsZero() {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return
	}
	if l.timer != nil && time.Now().Before(l.at) && !at.Before(l.at) {
		return // an earlier wake is set
	}
	if l.timer != nil {
		l.timer.Stop()
	}
	l.at, l.timer = at, time.AfterFunc(time.Until(at), l.fire)
}

// fire wakes the claimer, and the others too while its slots are all taken.
func (l *laterWake) fire() {
	l.wake()
	if l.free() == 0 {
		l.announce()
	}
}

// stop stops the wake, if one is set; a wake not yet due is announced to
// the other claimers instead, before stop returns.
func (l *laterWake) stop() {
	l.mu.Lock()
	pending := l.timer != nil && l.timer.Stop()
	l.stopped = true
	l.mu.Unlock()
	if pending {
		l.announce()
	}
}
