package runstate

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Tracker owns the state of a claimer's runs.
type Tracker struct {
	concurrency  int
	maxUnwritten int // outcomes that may wait before claims shrink

	slotFreed chan struct{} // capacity 1
	toWrite   chan struct{} // capacity 1
	notices   atomic.Uint64 // cancel notices heard

	mu        sync.Mutex
	executing int
	inflight  map[*Run]struct{} // runs claimed and not yet recorded
	unwritten []Outcome
}

// New returns a Tracker of concurrency slots, which claims no more than
// the slots left while more than maxUnwritten outcomes wait to be written.
func New(concurrency, maxUnwritten int) *Tracker {
	return &Tracker{
		concurrency: concurrency, maxUnwritten: maxUnwritten,
		slotFreed: make(chan struct{}, 1), toWrite: make(chan struct{}, 1),
		inflight: map[*Run]struct{}{},
	}
}

// SlotFreed is signalled when a slot came free, or written outcomes let
// claims grow again.
func (t *Tracker) SlotFreed() <-chan struct{} { return t.slotFreed }

// ToWrite is signalled when outcomes wait to be written.
func (t *Tracker) ToWrite() <-chan struct{} { return t.toWrite }

// Free is how many jobs the next claim may take: the slots not in use,
// less any excess of outcomes waiting to be written, so that claiming
// never outruns recording.
func (t *Tracker) Free() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	free := t.concurrency - t.executing
	if over := len(t.unwritten) - t.maxUnwritten; over > 0 {
		free -= over
	}
	return max(free, 0)
}

// Executing is how many runs hold a slot.
func (t *Tracker) Executing() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.executing
}

// Add takes in a claim's runs, each holding a slot.
func (t *Tracker) Add(runs []*Run) {
	t.mu.Lock()
	t.executing += len(runs)
	for _, r := range runs {
		t.inflight[r] = struct{}{}
	}
	t.mu.Unlock()
}

// Start hands r the cancel of its executor's context, and reports
// whether r was stopped already: then its executor must not run.
func (t *Tracker) Start(r *Run, stop context.CancelFunc) (stopped bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r.stopContext = stop
	return r.stopped != nil
}

// Stopped reports whether r was stopped.
func (t *Tracker) Stopped(r *Run) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return r.stopped != nil
}

// Report records o as the outcome of r and frees its slot; a run that was
// stopped meanwhile has its outcome dropped instead. It returns the
// outcome as recorded, and false, having done nothing, when r has an
// outcome already: it was given up on.
func (t *Tracker) Report(r *Run, o Outcome) (Outcome, bool) {
	t.mu.Lock()
	if r.reported {
		t.mu.Unlock()
		return o, false
	}
	r.reported = true
	t.executing--
	if r.stopped != nil {
		o = Outcome{Run: r, Verdict: Dropped, Cause: r.stopped}
		delete(t.inflight, r)
	} else {
		t.unwritten = append(t.unwritten, o)
	}
	t.mu.Unlock()
	if o.Verdict != Dropped {
		Signal(t.toWrite)
	}
	Signal(t.slotFreed)
	return o, true
}

// Notice is told of a cancel notice naming jobs ids. It marks the runs of
// those jobs, so that a stop of theirs is put down to the cancel, and
// returns how many there are. Anyone may NOTIFY: the notice stops nothing
// by itself.
func (t *Tracker) Notice(ids []int64) int {
	t.notices.Add(1)
	named := make(map[int64]bool, len(ids))
	for _, id := range ids {
		named[id] = true
	}
	n := 0
	t.mu.Lock()
	defer t.mu.Unlock()
	for r := range t.inflight {
		if !r.reported && r.stopped == nil && named[r.Job.ID] {
			r.noticed = true
			n++
		}
	}
	return n
}

// Notices counts the cancel notices heard: a claim that saw it change
// while in flight may hold a job a notice named before its runs were
// known.
func (t *Tracker) Notices() uint64 { return t.notices.Load() }

// Inflight is the runs claimed and not yet recorded, in the order of their
// jobs' ids, then of their claims: statements lock their rows in id order.
func (t *Tracker) Inflight() []*Run {
	t.mu.Lock()
	runs := make([]*Run, 0, len(t.inflight))
	for r := range t.inflight {
		runs = append(runs, r)
	}
	t.mu.Unlock()
	slices.SortFunc(runs, func(a, b *Run) int {
		return cmp.Or(cmp.Compare(a.Job.ID, b.Job.ID), a.ClaimedAt.Compare(b.ClaimedAt))
	})
	return runs
}

// Stop stops those of runs that are not reported yet: their executors'
// contexts end and their outcomes will be dropped. It returns how many it
// stopped for a cancel notice, and how many for no notice (a lost lease).
func (t *Tracker) Stop(runs []*Run) (cancelled, lost int) {
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, r := range runs {
		if r.reported || r.stopped != nil {
			continue
		}
		r.stopped, r.stoppedAt = ErrLeaseLost, now
		if r.noticed {
			r.stopped = ErrCancelled
			cancelled++
		} else {
			lost++
		}
		if r.stopContext != nil {
			r.stopContext()
		}
	}
	return cancelled, lost
}

// Overdue lists the unreported runs whose executors are late: past their
// deadline by grace (late), or stopped grace ago (stopped).
func (t *Tracker) Overdue(now time.Time, grace time.Duration) (late, stopped []*Run) {
	limit := now.Add(-grace)
	t.mu.Lock()
	defer t.mu.Unlock()
	for r := range t.inflight {
		if r.reported {
			continue
		}
		if d := r.deadline.Load(); d != 0 && d < limit.UnixNano() {
			late = append(late, r)
		} else if r.stopped != nil && r.stoppedAt.Before(limit) {
			stopped = append(stopped, r)
		}
	}
	return late, stopped
}

// Unreported lists the runs whose outcomes are not known yet.
func (t *Tracker) Unreported() []*Run {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []*Run
	for r := range t.inflight {
		if !r.reported {
			out = append(out, r)
		}
	}
	return out
}

// Unwritten is the first outcomes waiting to be written, at most n. They
// stay until Written.
func (t *Tracker) Unwritten(n int) []Outcome {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.unwritten[:min(len(t.unwritten), n)]
}

// Written forgets the first n outcomes, as Unwritten returned them, and
// their runs.
func (t *Tracker) Written(n int) {
	t.mu.Lock()
	for _, o := range t.unwritten[:n] {
		delete(t.inflight, o.Run)
	}
	// The outcomes left move to the front, so that the array is used
	// again rather than grown anew behind them. The n written are the
	// writer's no longer: it calls Written once done with them.
	left := copy(t.unwritten, t.unwritten[n:])
	clear(t.unwritten[left:])
	t.unwritten = t.unwritten[:left]
	t.mu.Unlock()
	Signal(t.slotFreed) // a claim held back by unwritten outcomes may grow
}

// UnwrittenCount is how many outcomes wait to be written.
func (t *Tracker) UnwrittenCount() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.unwritten)
}

// Signal makes a non-blocking send on ch, of capacity 1: signals that
// arrive while one is pending fold into it.
func Signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
