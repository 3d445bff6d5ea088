// Package machine is the claim loop's state machine, without I/O: for each
// event it decides whether the loop claims, and after each claim, which
// state the loop is in and when its one timer fires. The states and their
// transitions are drawn in the claimer package's doc; machine_test.go
// tests each transition alone.
package machine

import "time"

// State is where the claim loop stands.
type State uint8

// The states.
const (
	StateAwake     State = iota // the queue may hold due jobs: claim at once
	StateSaturated              // every free slot taken: claim as slots free, in full batches
	StateLingering              // the last claim came up short: look again soon, for linger in all
	StateDrowsy                 // asked for the sleep key; look once more when it is granted
	StateAsleep                 // holds the key and found nothing: writers notify
	StateBackoff                // the last claim failed: try again after a delay
	StatePaused                 // the queue is paused: look again when woken or at the tick
	StateStopping               // Run's context ended
)

var stateNames = [...]string{"awake", "saturated", "lingering", "drowsy", "asleep", "backoff", "paused", "stopping"}

func (s State) String() string { return stateNames[s] }

// HoldsKey reports whether the loop wants the sleep key in state s.
func (s State) HoldsKey() bool { return s == StateDrowsy || s == StateAsleep }

// Event is what woke the claim loop.
type Event uint8

// The events.
const (
	EventWake       Event = iota // a notification, or Wake
	EventTimer                   // the loop's one timer; what it means depends on the state
	EventTick                    // the fallback tick
	EventSlotFreed               // a job's outcome freed its slot
	EventKeyGranted              // the sleep key was granted
	EventKeyLost                 // the sleep key was lost, or a wait for it ended without it
)

const (
	// linger is how long the loop keeps looking at a queue that came up
	// short before it goes to sleep, at pauses from lookMin to lookMax.
	linger  = 2 * time.Millisecond
	lookMin = 500 * time.Microsecond
	lookMax = 4 * time.Millisecond
	// gatherWait bounds the wait for more slots to free in saturated.
	gatherWait = 4 * time.Millisecond
	// strandedMin and strandedMax bound the pauses between looks while a
	// claim skips due rows that another transaction has locked: when that
	// transaction ends without changing status, run_at or queue, no trigger
	// notifies, so the loop must look again by itself.
	strandedMin = 10 * time.Millisecond
	strandedMax = time.Second
	// minScheduleWait and MaxScheduleWait bound the wait for a future run_at.
	minScheduleWait = time.Millisecond
	MaxScheduleWait = 24 * time.Hour
	// NoTimer stops the loop's timer.
	NoTimer time.Duration = -1
)

// Result is what a claim tells the machine.
type Result struct {
	Claimed, Limit int
	// Next is the wait until the queue's earliest future run_at, when the
	// claim came up short and there is one.
	Next *time.Duration
	// Stranded: the claim came up short, yet skipped due rows that another
	// transaction held locked.
	Stranded bool
	// Paused: the queue is paused, and nothing was claimed.
	Paused bool
	// Untold: the claim took jobs, fewer than Limit, and told neither Next
	// nor Stranded (the plain claim reads them only when it takes none).
	// The look that follows it, lingering, tells them.
	Untold bool
	// Held: due jobs wait for their key's running jobs to end (flow
	// limits): a job of this worker that ends may let them start.
	Held  bool
	Err   error
	Delay time.Duration // before the next try, after Err
	At    time.Time     // when the claim ended
}

// Machine decides, for each event, whether the loop claims, and after each
// claim, which state it is in and when its timer fires.
type Machine struct {
	State State
	Timer time.Duration // when the loop's timer fires from now; NoTimer: stopped
	Rearm bool          // Timer changed: the loop sets its timer anew, and clears Rearm
	looks int           // empty looks in a row while lingering
	// gather: saturated, the gather timer runs.
	gather bool
	// held: the last claim left due jobs held back by flow limits, so a
	// freed slot makes the loop claim whatever the state.
	held bool
	// taking counts the last claims in a row that took jobs (Lean).
	taking int
	// stranded is when the claims began to skip locked due rows, zero while
	// they skip none. The next look comes as long after as that began, from
	// strandedMin to strandedMax: the looks back off with time, however
	// often other events make the loop claim meanwhile.
	stranded time.Time
}

// New is a machine in StateAwake, its timer due at once.
func New() *Machine { return &Machine{State: StateAwake, Timer: 0, Rearm: true} }

// Event reports whether ev makes the loop claim now, with free of
// concurrency slots free. It may change the state and the timer.
func (m *Machine) Event(ev Event, free, concurrency int) bool {
	if free == 0 {
		m.State, m.gather, m.Timer, m.Rearm, m.looks = StateSaturated, false, NoTimer, true, 0
		return false
	}
	switch m.State {
	case StateSaturated:
		if ev != EventSlotFreed || free == concurrency {
			return true
		}
		if !m.gather {
			m.gather, m.Timer, m.Rearm = true, gatherWait, true
		}
		return false
	case StateBackoff:
		return ev == EventTimer || ev == EventTick
	case StateAsleep:
		// A grant while asleep follows a loss the loop may not have seen
		// (the two signals fold into one): look, since writers did not
		// notify in between.
		if ev == EventKeyLost {
			m.State = StateDrowsy // the sleep lock takes the key again by itself
		}
		return ev != EventSlotFreed || m.held
	default:
		return ev != EventSlotFreed || m.held
	}
}

// Claimed moves the machine on after a claim that ev started.
func (m *Machine) Claimed(ev Event, r Result) {
	m.gather, m.Rearm, m.held = false, true, r.Held && r.Err == nil && !r.Paused
	if r.Err == nil && r.Claimed > 0 {
		m.taking = min(m.taking+1, 2)
	} else {
		m.taking = 0
	}
	switch {
	case r.Err != nil:
		m.State, m.Timer, m.looks = StateBackoff, r.Delay, 0
		return
	case r.Paused:
		// Without the sleep key, so writers do not notify for the queue:
		// resume_queue() does.
		m.State, m.Timer, m.looks, m.stranded = StatePaused, NoTimer, 0, time.Time{}
		return
	case r.Claimed == r.Limit:
		m.State, m.Timer, m.looks, m.stranded = StateSaturated, NoTimer, 0, time.Time{}
		return
	case r.Claimed > 0:
		m.State, m.looks = StateLingering, 0
		m.Timer = lookWait(0)
	case m.State == StateAsleep:
		m.Timer = NoTimer
	case m.State == StateDrowsy:
		if ev == EventKeyGranted {
			m.State = StateAsleep
		}
		m.Timer = NoTimer
	default:
		m.looks++
		if spent(m.looks) > linger {
			m.State, m.Timer = StateDrowsy, NoTimer
		} else {
			m.State, m.Timer = StateLingering, lookWait(m.looks-1)
		}
	}
	if r.Untold {
		// The look comes sooner than either timer would, and tells them:
		// the stranded rows' backoff keeps its start until then.
		return
	}
	if r.Next != nil {
		m.soon(max(*r.Next, minScheduleWait))
	}
	if !r.Stranded {
		m.stranded = time.Time{}
		return
	}
	if m.stranded.IsZero() {
		m.stranded = r.At
	}
	m.soon(min(max(r.At.Sub(m.stranded), strandedMin), strandedMax))
}

// Lean reports whether the claim that ev would start now expects few jobs
// or none: a notification starts it (most often of a lone job) or the
// claim before came up short (the looks while lingering, at the sleep
// key's grant, and while asleep). Such a claim may take only the due jobs
// of the queue's first priority, if it says when it takes nothing while
// others are due. After two claims in a row that took jobs the claim is
// full, and takes the due jobs of the next priorities too: a stream of
// jobs at the first priority, each claim finding one, would otherwise keep
// them waiting, free slots or not. A lone job's claim and the looks after
// it stay lean.
func (m *Machine) Lean(ev Event) bool {
	if m.taking >= 2 {
		return false
	}
	switch m.State {
	case StateLingering, StateDrowsy, StateAsleep:
		return true
	}
	return ev == EventWake
}

// soon makes the timer fire within d.
func (m *Machine) soon(d time.Duration) {
	if m.Timer == NoTimer || d < m.Timer {
		m.Timer = d
	}
}

// lookWait is the pause after the (looks+1)th look in a row that found
// nothing: 0.5ms, 1ms, 2ms, then 4ms each.
func lookWait(looks int) time.Duration { return min(lookMin<<min(looks, 8), lookMax) }

// spent is the time the first looks pauses add up to.
func spent(looks int) time.Duration {
	var d time.Duration
	for i := range looks {
		d += lookWait(i)
	}
	return d
}
