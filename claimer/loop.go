package claimer

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch/internal/retry"
	"github.com/pgdispatch/pgdispatch/internal/testhook"
)

// state is where the claim loop stands; the package doc has the
// transitions, and machine makes them.
type state uint8

const (
	awake     state = iota // the queue may hold due jobs: claim at once
	saturated              // every free slot taken: claim as slots free, in full batches
	lingering              // the last claim came up short: look again soon, for linger in all
	drowsy                 // asked for the sleep key; look once more when it is granted
	asleep                 // holds the key and found nothing: writers notify
	backoff                // the last claim failed: try again after a delay
	paused                 // the queue is paused: look again when woken or at the tick
	stopping               // Run's context ended
)

var stateNames = [...]string{"awake", "saturated", "lingering", "drowsy", "asleep", "backoff", "paused", "stopping"}

func (s state) String() string { return stateNames[s] }

// holdsKey reports whether the loop wants the sleep key in state s.
func (s state) holdsKey() bool { return s == drowsy || s == asleep }

// event is what woke the claim loop.
type event uint8

const (
	evWake       event = iota // a notification, or Wake
	evTimer                   // the loop's one timer; what it means depends on the state
	evTick                    // the fallback tick
	evSlotFreed               // a job's outcome freed its slot
	evKeyGranted              // the sleep key was granted
	evKeyLost                 // the sleep key was lost, or a wait for it ended without it
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
	// minScheduleWait and maxScheduleWait bound the wait for a future run_at.
	minScheduleWait = time.Millisecond
	maxScheduleWait = 24 * time.Hour
	// noTimer stops the loop's timer.
	noTimer time.Duration = -1
)

// claimResult is what a claim tells the machine.
type claimResult struct {
	claimed, limit int
	// next is the wait until the queue's earliest future run_at, when the
	// claim came up short and there is one.
	next *time.Duration
	// stranded: the claim came up short, yet skipped due rows that another
	// transaction held locked.
	stranded bool
	// paused: the queue is paused, and nothing was claimed.
	paused bool
	err    error
	delay  time.Duration // before the next try, after err
	at     time.Time     // when the claim ended
}

// machine decides, for each event, whether the loop claims, and after each
// claim, which state it is in and when its timer fires. It does no I/O, so
// each transition can be tested alone (loop_test.go).
type machine struct {
	state  state
	timer  time.Duration // when the loop's timer fires from now; noTimer: stopped
	rearm  bool          // timer changed: the loop sets its timer anew
	looks  int           // empty looks in a row while lingering
	gather bool          // saturated: the gather timer runs
	// stranded is when the claims began to skip locked due rows, zero while
	// they skip none. The next look comes as long after as that began, from
	// strandedMin to strandedMax: the looks back off with time, however
	// often other events make the loop claim meanwhile.
	stranded time.Time
}

func newMachine() *machine { return &machine{state: awake, timer: 0, rearm: true} }

// event reports whether ev makes the loop claim now, with free of
// concurrency slots free. It may change the state and the timer.
func (m *machine) event(ev event, free, concurrency int) bool {
	if free == 0 {
		m.state, m.gather, m.timer, m.rearm, m.looks = saturated, false, noTimer, true, 0
		return false
	}
	switch m.state {
	case saturated:
		if ev != evSlotFreed || free == concurrency {
			return true
		}
		if !m.gather {
			m.gather, m.timer, m.rearm = true, gatherWait, true
		}
		return false
	case backoff:
		return ev == evTimer || ev == evTick
	case asleep:
		// A grant while asleep follows a loss the loop may not have seen
		// (the two signals fold into one): look, since writers did not
		// notify in between.
		if ev == evKeyLost {
			m.state = drowsy // the sleep lock takes the key again by itself
		}
		return ev != evSlotFreed
	default:
		return ev != evSlotFreed
	}
}

// claimed moves the machine on after a claim that ev started.
func (m *machine) claimed(ev event, r claimResult) {
	m.gather, m.rearm = false, true
	switch {
	case r.err != nil:
		m.state, m.timer, m.looks = backoff, r.delay, 0
		return
	case r.paused:
		// Without the sleep key, so writers do not notify for the queue:
		// resume_queue() does.
		m.state, m.timer, m.looks, m.stranded = paused, noTimer, 0, time.Time{}
		return
	case r.claimed == r.limit:
		m.state, m.timer, m.looks, m.stranded = saturated, noTimer, 0, time.Time{}
		return
	case r.claimed > 0:
		m.state, m.looks = lingering, 0
		m.timer = lookWait(0)
	case m.state == asleep:
		m.timer = noTimer
	case m.state == drowsy:
		if ev == evKeyGranted {
			m.state = asleep
		}
		m.timer = noTimer
	default:
		m.looks++
		if spent(m.looks) > linger {
			m.state, m.timer = drowsy, noTimer
		} else {
			m.state, m.timer = lingering, lookWait(m.looks-1)
		}
	}
	if r.next != nil {
		m.soon(max(*r.next, minScheduleWait))
	}
	if !r.stranded {
		m.stranded = time.Time{}
		return
	}
	if m.stranded.IsZero() {
		m.stranded = r.at
	}
	m.soon(min(max(r.at.Sub(m.stranded), strandedMin), strandedMax))
}

// soon makes the timer fire within d.
func (m *machine) soon(d time.Duration) {
	if m.timer == noTimer || d < m.timer {
		m.timer = d
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

// claimLoop runs the machine until ctx ends: it waits for an event, claims
// when the machine says so, starts the claimed jobs, and carries out each
// change of state (the sleep key, the timer).
func (c *Claimer) claimLoop(ctx context.Context, jobs *runners) {
	c.logger.Info("claimer started", zap.Int("concurrency", c.cfg.Concurrency),
		zap.Duration("poll_interval", c.cfg.PollInterval))
	hooks := testhook.From(ctx)
	tick := time.NewTicker(c.cfg.PollInterval)
	defer tick.Stop()
	m := newMachine()
	timer := time.NewTimer(0)
	defer timer.Stop()
	failures := retry.New(c.poolSize)
	for {
		var ev event
		select {
		case <-ctx.Done():
			c.enter(m.state, stopping, hooks)
			return
		case <-c.notified:
			ev = evWake
		case <-c.sleep.recheck:
			ev = evKeyLost
			if c.sleep.holding.Load() {
				ev = evKeyGranted
			}
		case <-timer.C:
			ev = evTimer
		case <-tick.C:
			ev = evTick
			c.ticks.Add(1)
		case <-c.slotFreed:
			ev = evSlotFreed
		}
		from := m.state
		free := c.freeSlots()
		if m.event(ev, free, c.cfg.Concurrency) {
			// Not cut short by ctx: a claim the server committed must reach
			// its jobs, which then go through the shutdown as running ones.
			r := c.claim(context.WithoutCancel(ctx), free, jobs)
			r.at = time.Now()
			if r.err != nil {
				if ctx.Err() != nil {
					c.enter(from, stopping, hooks)
					return
				}
				r.delay = failures.Next(r.err)
				c.logger.Warn("claim failed", zap.Error(r.err), zap.Int("failures", failures.Failures()),
					zap.Duration("retry_in", r.delay))
			} else {
				failures = retry.New(c.poolSize)
			}
			if r.err == nil && r.paused != c.paused.Load() {
				c.paused.Store(r.paused)
				if r.paused {
					c.logger.Info("the queue is paused: no claims until it is resumed")
				} else {
					c.logger.Info("the queue is active again")
				}
			}
			if ev == evTick && r.claimed > 0 {
				c.tickHits.Add(1)
				c.logger.Info("fallback tick found due jobs: a notification was missed",
					zap.Int("num_claimed", r.claimed), zap.Int64("tick_hits", c.tickHits.Load()))
			}
			m.claimed(ev, r)
		}
		c.enter(from, m.state, hooks)
		if m.rearm { // else the timer runs on: an event that changed nothing must not push it out
			m.rearm = false
			if m.timer == noTimer {
				timer.Stop()
			} else {
				timer.Reset(m.timer)
			}
		}
	}
}

// enter carries out a move from one state to another: it asks for the
// sleep key or gives it back, and counts the sleeps.
func (c *Claimer) enter(from, to state, hooks *testhook.Hooks) {
	if from == to {
		return
	}
	switch {
	case to.holdsKey() && !from.holdsKey():
		c.sleep.request()
	case !to.holdsKey() && from.holdsKey():
		c.sleep.release()
	}
	if to == asleep {
		c.sleeps.Add(1)
	}
	c.logger.Debug("claimer state", zap.Stringer("from", from), zap.Stringer("to", to))
	if hooks.ClaimerState != nil {
		hooks.ClaimerState(c.cfg.Queue, from.String(), to.String())
	}
}
