package machine

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Every transition of the claim loop's machine, one by one: which events
// make each state claim, and where each claim's result leads.
func TestMachineEvents(t *testing.T) {
	t.Parallel()
	const concurrency = 10
	all := []Event{EventWake, EventTimer, EventTick, EventSlotFreed, EventKeyGranted, EventKeyLost}
	// claims[state] lists the events that make state claim with some, not
	// all, slots free.
	claims := map[State][]Event{
		StateAwake:     {EventWake, EventTimer, EventTick, EventKeyGranted, EventKeyLost},
		StateSaturated: {EventWake, EventTimer, EventTick, EventKeyGranted, EventKeyLost},
		StateLingering: {EventWake, EventTimer, EventTick, EventKeyGranted, EventKeyLost},
		StateDrowsy:    {EventWake, EventTimer, EventTick, EventKeyGranted, EventKeyLost},
		StateAsleep:    {EventWake, EventTimer, EventTick, EventKeyGranted, EventKeyLost},
		StateBackoff:   {EventTimer, EventTick},
		StatePaused:    {EventWake, EventTimer, EventTick, EventKeyGranted, EventKeyLost},
	}
	for s, want := range claims {
		for _, ev := range all {
			m := &Machine{State: s, Timer: NoTimer}
			got := m.Event(ev, 3, concurrency)
			require.Equal(t, contains(want, ev), got, "%s on event %d", s, ev)
		}
	}
}

func contains(evs []Event, ev Event) bool {
	for _, e := range evs {
		if e == ev {
			return true
		}
	}
	return false
}

func TestMachineEventSideEffects(t *testing.T) {
	t.Parallel()
	const concurrency = 10

	// No free slot: StateSaturated, whatever the state, and no claim; the looks
	// at an empty queue start over.
	for s := range StateStopping {
		m := &Machine{State: s, Timer: time.Second, looks: 2}
		require.False(t, m.Event(EventWake, 0, concurrency), "%s", s)
		require.Equal(t, StateSaturated, m.State)
		require.Equal(t, NoTimer, m.Timer, "the timer of %s is dropped", s)
		require.Zero(t, m.looks)
	}

	// Saturated: a freed slot claims once every slot is free; before that,
	// the first one starts the gather timer, and later ones leave it be.
	m := &Machine{State: StateSaturated, Timer: NoTimer}
	require.False(t, m.Event(EventSlotFreed, 1, concurrency))
	require.Equal(t, gatherWait, m.Timer)
	require.True(t, m.Rearm)
	m.Rearm = false
	require.False(t, m.Event(EventSlotFreed, 2, concurrency))
	require.False(t, m.Rearm, "the gather timer runs on")
	require.True(t, m.Event(EventTimer, 2, concurrency), "the gather timer claims")
	m = &Machine{State: StateSaturated, Timer: NoTimer}
	require.True(t, m.Event(EventSlotFreed, concurrency, concurrency), "every slot free")

	// An event that claims nothing leaves a running timer alone: a stream of
	// freed slots while StateLingering must not push the next look out.
	m = &Machine{State: StateLingering, Timer: lookMin}
	require.False(t, m.Event(EventSlotFreed, 3, concurrency))
	require.False(t, m.Rearm)

	// Asleep: losing the key makes it StateDrowsy (the sleep lock asks again).
	m = &Machine{State: StateAsleep, Timer: NoTimer}
	require.True(t, m.Event(EventKeyLost, 3, concurrency))
	require.Equal(t, StateDrowsy, m.State)
}

func TestMachineClaimed(t *testing.T) {
	t.Parallel()
	next := 5 * time.Second
	cases := []struct {
		name  string
		from  State
		ev    Event
		r     Result
		looks int
		to    State
		timer time.Duration
	}{
		{"failed", StateLingering, EventTimer, Result{Limit: 5, Err: errors.New("x"), Delay: time.Second}, 0, StateBackoff, time.Second},
		{"full from awake", StateAwake, EventTimer, Result{Claimed: 5, Limit: 5}, 0, StateSaturated, NoTimer},
		{"full from asleep", StateAsleep, EventWake, Result{Claimed: 5, Limit: 5, Next: &next}, 0, StateSaturated, NoTimer},
		{"some from asleep", StateAsleep, EventWake, Result{Claimed: 2, Limit: 5}, 0, StateLingering, lookMin},
		{"some from saturated", StateSaturated, EventSlotFreed, Result{Claimed: 2, Limit: 5}, 0, StateLingering, lookMin},
		{"none from awake", StateAwake, EventTimer, Result{Limit: 5}, 0, StateLingering, lookMin},
		{"none, second look", StateLingering, EventTimer, Result{Limit: 5}, 1, StateLingering, 2 * lookMin},
		{"none, linger spent", StateLingering, EventTimer, Result{Limit: 5}, 2, StateDrowsy, NoTimer},
		{"none from saturated", StateSaturated, EventSlotFreed, Result{Limit: 5}, 0, StateLingering, lookMin},
		{"none after backoff", StateBackoff, EventTimer, Result{Limit: 5}, 0, StateLingering, lookMin},
		{"failed while lingering", StateLingering, EventTimer, Result{Limit: 5, Err: errors.New("x"), Delay: time.Second}, 2, StateBackoff, time.Second},
		{"none, key granted", StateDrowsy, EventKeyGranted, Result{Limit: 5}, 0, StateAsleep, NoTimer},
		{"none, StateDrowsy woken", StateDrowsy, EventWake, Result{Limit: 5}, 0, StateDrowsy, NoTimer},
		{"none, key lost", StateDrowsy, EventKeyLost, Result{Limit: 5}, 0, StateDrowsy, NoTimer},
		{"none while asleep", StateAsleep, EventWake, Result{Limit: 5}, 0, StateAsleep, NoTimer},
		{"none, a run_at ahead", StateAsleep, EventTick, Result{Limit: 5, Next: &next}, 0, StateAsleep, next},
		{"none, a run_at just past", StateDrowsy, EventKeyGranted, Result{Limit: 5, Next: new(time.Duration)}, 0, StateAsleep, minScheduleWait},
		{"a run_at sooner than the look", StateLingering, EventTimer, Result{Limit: 5, Next: new(time.Duration)}, 1, StateLingering, minScheduleWait},
		{"a run_at later than the look", StateLingering, EventTimer, Result{Limit: 5, Next: &next}, 1, StateLingering, 2 * lookMin},
		{"stranded while asleep", StateAsleep, EventWake, Result{Limit: 5, Stranded: true}, 0, StateAsleep, strandedMin},
		{"stranded, a run_at ahead", StateDrowsy, EventKeyGranted, Result{Limit: 5, Stranded: true, Next: &next}, 0, StateAsleep, strandedMin},
		{"paused while asleep", StateAsleep, EventWake, Result{Limit: 5, Paused: true}, 0, StatePaused, NoTimer},
		{"paused while lingering", StateLingering, EventTimer, Result{Limit: 5, Paused: true}, 1, StatePaused, NoTimer},
		{"still paused", StatePaused, EventTick, Result{Limit: 5, Paused: true}, 0, StatePaused, NoTimer},
		{"resumed, some", StatePaused, EventWake, Result{Claimed: 2, Limit: 5}, 0, StateLingering, lookMin},
		{"resumed, all", StatePaused, EventWake, Result{Claimed: 5, Limit: 5}, 0, StateSaturated, NoTimer},
		{"resumed, none", StatePaused, EventWake, Result{Limit: 5}, 0, StateLingering, lookMin},
	}
	for _, c := range cases {
		m := &Machine{State: c.from, looks: c.looks, Timer: NoTimer}
		m.Claimed(c.ev, c.r)
		require.Equal(t, c.to, m.State, c.name)
		require.Equal(t, c.timer, m.Timer, c.name)
	}
}

// A claim that took some jobs and told neither a run_at nor stranded rows
// leaves the stranded rows' backoff where it was: the looks after it tell
// whether the rows are still skipped.
func TestMachineUntoldKeepsStrandedBackoff(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m := &Machine{State: StateAsleep, Timer: NoTimer}
	m.Claimed(EventTick, Result{Limit: 5, Stranded: true, At: t0})
	require.Equal(t, strandedMin, m.Timer)
	m.Claimed(EventWake, Result{Claimed: 2, Limit: 5, Untold: true, At: t0.Add(20 * time.Millisecond)})
	require.Equal(t, StateLingering, m.State)
	require.Equal(t, lookMin, m.Timer, "the look after a short claim")
	m.State = StateAsleep
	m.Claimed(EventTick, Result{Limit: 5, Stranded: true, At: t0.Add(50 * time.Millisecond)})
	require.Equal(t, 50*time.Millisecond, m.Timer, "as long after as the rows were first skipped, not restarted")
}

// Looks for stranded rows come as long after as the rows were first
// skipped, from 10 ms to 1 s, however many claims other events make
// meanwhile, and start again from 10 ms once a claim skips none.
func TestMachineStrandedBackoff(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m := &Machine{State: StateAsleep, Timer: NoTimer}
	stranded := func(ev Event, after time.Duration) time.Duration {
		m.Claimed(ev, Result{Limit: 5, Stranded: true, At: t0.Add(after)})
		return m.Timer
	}
	require.Equal(t, strandedMin, stranded(EventWake, 0))
	require.Equal(t, strandedMin, stranded(EventWake, 2*time.Millisecond), "a claim woken by a notification")
	require.Equal(t, strandedMin, stranded(EventTimer, 10*time.Millisecond))
	require.Equal(t, 20*time.Millisecond, stranded(EventTimer, 20*time.Millisecond))
	require.Equal(t, 40*time.Millisecond, stranded(EventTimer, 40*time.Millisecond))
	require.Equal(t, strandedMax, stranded(EventTimer, time.Minute))
	m.Claimed(EventTimer, Result{Limit: 5, At: t0.Add(time.Minute)})
	require.Equal(t, NoTimer, m.Timer)
	require.Equal(t, strandedMin, stranded(EventTimer, 2*time.Minute))
}

// The looks while StateLingering pause 0.5, 1 and 2 ms; the claimer sleeps once
// the next pause would pass linger.
func TestLookWaits(t *testing.T) {
	t.Parallel()
	require.Equal(t, []time.Duration{lookMin, 2 * lookMin, 4 * lookMin, lookMax, lookMax},
		[]time.Duration{lookWait(0), lookWait(1), lookWait(2), lookWait(3), lookWait(20)})
	require.LessOrEqual(t, spent(2), linger)
	require.Greater(t, spent(3), linger)
}

// A claim that left due jobs held back by flow limits makes a freed slot
// claim in every state that waits for work, since the job that ended may
// have been what held them; the next claim that holds none ends that.
func TestMachineHeldClaimsOnFreedSlots(t *testing.T) {
	t.Parallel()
	const concurrency = 10
	for _, s := range []State{StateAwake, StateLingering, StateDrowsy, StateAsleep} {
		m := &Machine{State: s, Timer: NoTimer}
		m.Claimed(EventWake, Result{Limit: 3, Held: true})
		if s == StateAsleep {
			require.Equal(t, StateAsleep, m.State)
		}
		require.True(t, m.Event(EventSlotFreed, 3, concurrency), "held, %s claims when a slot frees", m.State)
		m.Claimed(EventSlotFreed, Result{Limit: 3})
		require.False(t, m.Event(EventSlotFreed, 3, concurrency), "not held, %s waits for work", m.State)
	}
	// A failed claim or a paused queue holds nothing.
	m := New()
	m.Claimed(EventWake, Result{Limit: 3, Held: true, Paused: true})
	require.False(t, m.Event(EventSlotFreed, 3, concurrency))
}

// A claim is lean when it expects few jobs: a notification starts it or
// the claim before came up short, and the two claims before did not both
// take jobs. The claims of a saturated loop, the first claim, and the
// retries after a failure are full.
func TestLeanClaims(t *testing.T) {
	t.Parallel()
	all := []Event{EventWake, EventTimer, EventTick, EventSlotFreed, EventKeyGranted, EventKeyLost}
	for _, s := range []State{StateAwake, StateSaturated, StateLingering, StateDrowsy, StateAsleep, StateBackoff, StatePaused} {
		for _, ev := range all {
			short := s == StateLingering || s == StateDrowsy || s == StateAsleep
			m := &Machine{State: s, Timer: NoTimer}
			require.Equal(t, short || ev == EventWake, m.Lean(ev), "%s on event %d", s, ev)
			m.taking = 1
			require.Equal(t, short || ev == EventWake, m.Lean(ev), "%s on event %d after a claim that took jobs", s, ev)
			m.taking = 2
			require.False(t, m.Lean(ev), "%s on event %d after two claims that took jobs", s, ev)
		}
	}
	// A lone job's round: woken asleep, it lingers, grows drowsy and
	// sleeps again, every claim lean.
	m := &Machine{State: StateAsleep, Timer: NoTimer}
	var lean []bool
	for _, ev := range []Event{EventWake, EventTimer, EventTimer, EventTimer, EventKeyGranted} {
		from, l := m.State, m.Lean(ev)
		require.True(t, m.Event(ev, 9, 10), "%s on event %d", from, ev)
		lean = append(lean, l)
		claimed := 0
		if ev == EventWake {
			claimed = 1
		}
		m.Claimed(ev, Result{Claimed: claimed, Limit: 9})
	}
	require.Equal(t, []bool{true, true, true, true, true}, lean)
	require.Equal(t, StateAsleep, m.State)
	// Jobs at the first priority in a stream, each claim taking some: the
	// third claim and every one after it are full, and take the later
	// priorities' due jobs too.
	m = &Machine{State: StateLingering, Timer: NoTimer}
	lean = lean[:0]
	for _, ev := range []Event{EventWake, EventTimer, EventTimer, EventWake} {
		lean = append(lean, m.Lean(ev))
		require.True(t, m.Event(ev, 9, 10))
		m.Claimed(ev, Result{Claimed: 1, Limit: 9, Untold: true})
	}
	require.Equal(t, []bool{true, true, false, false}, lean)
	// A claim that takes nothing, or fails, ends the run.
	m.Claimed(EventTimer, Result{Limit: 9})
	require.True(t, m.Lean(EventTimer))
	m.taking = 2
	m.Claimed(EventTimer, Result{Limit: 9, Err: errors.New("down")})
	m.State = StateLingering
	require.True(t, m.Lean(EventTimer))
}
