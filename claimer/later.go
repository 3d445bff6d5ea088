package claimer

import (
	"container/heap"
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
// claimer cannot take it itself: when it is due while the claimer has
// fewer free slots than jobs due then, or after the claimer has stopped
// claiming (it waits for its running jobs), and when the claimer stops
// before it is due. So the wake keeps the due time of every such job, not
// only the earliest: the claim loop's own timer, set to the queue's next
// run_at, wakes this claimer for the later ones and tells no one. A claim
// the notification makes finds the job due, or its run_at as the queue's
// next.
type laterWake struct {
	wake     func()
	free     func() int // the claimer's free slots
	announce func()     // notifies every sleeping claimer of the queue; blocks for a round trip

	mu      sync.Mutex
	timer   *time.Timer
	at      time.Time // when timer fires
	due     dueTimes  // when each job put back for later is due, not yet fired
	stopped bool
	ended   bool // the claim loop has ended: the claimer takes no job
	// telling: an announcement is under way (one at a time: a pool short of
	// connections, or a server that does not answer, would otherwise pile
	// up a goroutine a wake); again: another was asked for meanwhile.
	telling, again bool
}

// laterSlack is how far ahead of its due time a job is taken into a wake
// that fires for an earlier one: jobs due within it are one wake, and one
// announcement, not one each.
const laterSlack = time.Millisecond

// dueTimes is a min-heap of due times (container/heap).
type dueTimes []time.Time

func (d dueTimes) Len() int           { return len(d) }
func (d dueTimes) Less(i, j int) bool { return d[i].Before(d[j]) }
func (d dueTimes) Swap(i, j int)      { d[i], d[j] = d[j], d[i] }
func (d *dueTimes) Push(x any)        { *d = append(*d, x.(time.Time)) }
func (d *dueTimes) Pop() any {
	old := *d
	t := old[len(old)-1]
	*d = old[:len(old)-1]
	return t
}

// written is the completer's hook: it keeps when each job of the batch put
// back for later is due, whose write began at start, and sets the wake for
// the earliest. A job snoozed until an instant (Until, on the database's
// clock) is due then, whatever its Delay, which is the worker's reckoning
// for its log and may be 0 or longer (executors.SnoozeUntil): it wakes at
// the earlier of the two, as a wake that comes too early costs only a
// claim.
func (l *laterWake) written(batch []runstate.Outcome, start time.Time) {
	var ats []time.Time
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
		if !t.IsZero() {
			ats = append(ats, t)
		}
	}
	if len(ats) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return
	}
	for _, t := range ats {
		heap.Push(&l.due, t)
	}
	l.arm()
}

// arm sets the timer to the earliest due time kept, unless it is set
// earlier already. l.mu is held.
func (l *laterWake) arm() {
	if len(l.due) == 0 {
		return
	}
	at := l.due[0]
	if l.timer != nil && time.Now().Before(l.at) && !at.Before(l.at) {
		return // an earlier wake is set
	}
	if l.timer != nil {
		l.timer.Stop()
	}
	l.at, l.timer = at, time.AfterFunc(time.Until(at), l.fire)
}

// fire wakes the claimer for the jobs due now, and the others too when it
// has fewer free slots than those jobs or no longer claims; then it sets
// the wake for the next.
func (l *laterWake) fire() {
	l.mu.Lock()
	n, until := 0, time.Now().Add(laterSlack)
	for len(l.due) > 0 && !l.due[0].After(until) {
		heap.Pop(&l.due)
		n++
	}
	ended := l.ended
	if !l.stopped {
		l.arm() // l.at has passed: a new timer, for the next job
	}
	l.mu.Unlock()
	if n == 0 {
		return // a timer stopped too late: the jobs were fired by another
	}
	l.wake()
	if ended || l.free() < n {
		l.tell()
	}
}

// tell announces, unless an announcement is under way: then that one
// announces once more when it is done, for all that asked meanwhile.
func (l *laterWake) tell() {
	l.mu.Lock()
	if l.telling {
		l.again = true
		l.mu.Unlock()
		return
	}
	l.telling = true
	l.mu.Unlock()
	for {
		l.announce()
		l.mu.Lock()
		if !l.again {
			l.telling = false
			l.mu.Unlock()
			return
		}
		l.again = false
		l.mu.Unlock()
	}
}

// claimsEnded says that the claim loop has ended: a wake that fires from
// now on, while the claimer waits for its running jobs, is announced, as no
// claim of its own will take the job.
func (l *laterWake) claimsEnded() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ended = true
}

// stop stops the wake, if one is set; jobs not yet due are announced to
// the other claimers instead, once, before stop returns.
func (l *laterWake) stop() {
	l.mu.Lock()
	if l.timer != nil {
		l.timer.Stop()
	}
	pending := len(l.due) > 0
	l.due, l.stopped = nil, true
	l.mu.Unlock()
	if pending {
		l.announce()
	}
}
