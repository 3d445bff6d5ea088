package claimer

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
	all := []event{evWake, evTimer, evTick, evSlotFreed, evKeyGranted, evKeyLost}
	// claims[state] lists the events that make state claim with some, not
	// all, slots free.
	claims := map[state][]event{
		awake:     {evWake, evTimer, evTick, evKeyGranted, evKeyLost},
		saturated: {evWake, evTimer, evTick, evKeyGranted, evKeyLost},
		lingering: {evWake, evTimer, evTick, evKeyGranted, evKeyLost},
		drowsy:    {evWake, evTimer, evTick, evKeyGranted, evKeyLost},
		asleep:    {evWake, evTimer, evTick, evKeyGranted, evKeyLost},
		backoff:   {evTimer, evTick},
		paused:    {evWake, evTimer, evTick, evKeyGranted, evKeyLost},
	}
	for s, want := range claims {
		for _, ev := range all {
			m := &machine{state: s, timer: noTimer}
			got := m.event(ev, 3, concurrency)
			require.Equal(t, contains(want, ev), got, "%s on event %d", s, ev)
		}
	}
}

func contains(evs []event, ev event) bool {
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

	// No free slot: saturated, whatever the state, and no claim; the looks
	// at an empty queue start over.
	for s := range stopping {
		m := &machine{state: s, timer: time.Second, looks: 2}
		require.False(t, m.event(evWake, 0, concurrency), "%s", s)
		require.Equal(t, saturated, m.state)
		require.Equal(t, noTimer, m.timer, "the timer of %s is dropped", s)
		require.Zero(t, m.looks)
	}

	// Saturated: a freed slot claims once every slot is free; before that,
	// the first one starts the gather timer, and later ones leave it be.
	m := &machine{state: saturated, timer: noTimer}
	require.False(t, m.event(evSlotFreed, 1, concurrency))
	require.Equal(t, gatherWait, m.timer)
	require.True(t, m.rearm)
	m.rearm = false
	require.False(t, m.event(evSlotFreed, 2, concurrency))
	require.False(t, m.rearm, "the gather timer runs on")
	require.True(t, m.event(evTimer, 2, concurrency), "the gather timer claims")
	m = &machine{state: saturated, timer: noTimer}
	require.True(t, m.event(evSlotFreed, concurrency, concurrency), "every slot free")

	// An event that claims nothing leaves a running timer alone: a stream of
	// freed slots while lingering must not push the next look out.
	m = &machine{state: lingering, timer: lookMin}
	require.False(t, m.event(evSlotFreed, 3, concurrency))
	require.False(t, m.rearm)

	// Asleep: losing the key makes it drowsy (the sleep lock asks again).
	m = &machine{state: asleep, timer: noTimer}
	require.True(t, m.event(evKeyLost, 3, concurrency))
	require.Equal(t, drowsy, m.state)
}

func TestMachineClaimed(t *testing.T) {
	t.Parallel()
	next := 5 * time.Second
	cases := []struct {
		name  string
		from  state
		ev    event
		r     claimResult
		looks int
		to    state
		timer time.Duration
	}{
		{"failed", lingering, evTimer, claimResult{limit: 5, err: errors.New("x"), delay: time.Second}, 0, backoff, time.Second},
		{"full from awake", awake, evTimer, claimResult{claimed: 5, limit: 5}, 0, saturated, noTimer},
		{"full from asleep", asleep, evWake, claimResult{claimed: 5, limit: 5, next: &next}, 0, saturated, noTimer},
		{"some from asleep", asleep, evWake, claimResult{claimed: 2, limit: 5}, 0, lingering, lookMin},
		{"some from saturated", saturated, evSlotFreed, claimResult{claimed: 2, limit: 5}, 0, lingering, lookMin},
		{"none from awake", awake, evTimer, claimResult{limit: 5}, 0, lingering, lookMin},
		{"none, second look", lingering, evTimer, claimResult{limit: 5}, 1, lingering, 2 * lookMin},
		{"none, linger spent", lingering, evTimer, claimResult{limit: 5}, 2, drowsy, noTimer},
		{"none from saturated", saturated, evSlotFreed, claimResult{limit: 5}, 0, lingering, lookMin},
		{"none after backoff", backoff, evTimer, claimResult{limit: 5}, 0, lingering, lookMin},
		{"failed while lingering", lingering, evTimer, claimResult{limit: 5, err: errors.New("x"), delay: time.Second}, 2, backoff, time.Second},
		{"none, key granted", drowsy, evKeyGranted, claimResult{limit: 5}, 0, asleep, noTimer},
		{"none, drowsy woken", drowsy, evWake, claimResult{limit: 5}, 0, drowsy, noTimer},
		{"none, key lost", drowsy, evKeyLost, claimResult{limit: 5}, 0, drowsy, noTimer},
		{"none while asleep", asleep, evWake, claimResult{limit: 5}, 0, asleep, noTimer},
		{"none, a run_at ahead", asleep, evTick, claimResult{limit: 5, next: &next}, 0, asleep, next},
		{"none, a run_at just past", drowsy, evKeyGranted, claimResult{limit: 5, next: new(time.Duration)}, 0, asleep, minScheduleWait},
		{"a run_at sooner than the look", lingering, evTimer, claimResult{limit: 5, next: new(time.Duration)}, 1, lingering, minScheduleWait},
		{"a run_at later than the look", lingering, evTimer, claimResult{limit: 5, next: &next}, 1, lingering, 2 * lookMin},
		{"stranded while asleep", asleep, evWake, claimResult{limit: 5, stranded: true}, 0, asleep, strandedMin},
		{"stranded, a run_at ahead", drowsy, evKeyGranted, claimResult{limit: 5, stranded: true, next: &next}, 0, asleep, strandedMin},
		{"paused while asleep", asleep, evWake, claimResult{limit: 5, paused: true}, 0, paused, noTimer},
		{"paused while lingering", lingering, evTimer, claimResult{limit: 5, paused: true}, 1, paused, noTimer},
		{"still paused", paused, evTick, claimResult{limit: 5, paused: true}, 0, paused, noTimer},
		{"resumed, some", paused, evWake, claimResult{claimed: 2, limit: 5}, 0, lingering, lookMin},
		{"resumed, all", paused, evWake, claimResult{claimed: 5, limit: 5}, 0, saturated, noTimer},
		{"resumed, none", paused, evWake, claimResult{limit: 5}, 0, lingering, lookMin},
	}
	for _, c := range cases {
		m := &machine{state: c.from, looks: c.looks, timer: noTimer}
		m.claimed(c.ev, c.r)
		require.Equal(t, c.to, m.state, c.name)
		require.Equal(t, c.timer, m.timer, c.name)
	}
}

// Looks for stranded rows come as long after as the rows were first
// skipped, from 10 ms to 1 s, however many claims other events make
// meanwhile, and start again from 10 ms once a claim skips none.
func TestMachineStrandedBackoff(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m := &machine{state: asleep, timer: noTimer}
	stranded := func(ev event, after time.Duration) time.Duration {
		m.claimed(ev, claimResult{limit: 5, stranded: true, at: t0.Add(after)})
		return m.timer
	}
	require.Equal(t, strandedMin, stranded(evWake, 0))
	require.Equal(t, strandedMin, stranded(evWake, 2*time.Millisecond), "a claim woken by a notification")
	require.Equal(t, strandedMin, stranded(evTimer, 10*time.Millisecond))
	require.Equal(t, 20*time.Millisecond, stranded(evTimer, 20*time.Millisecond))
	require.Equal(t, 40*time.Millisecond, stranded(evTimer, 40*time.Millisecond))
	require.Equal(t, strandedMax, stranded(evTimer, time.Minute))
	m.claimed(evTimer, claimResult{limit: 5, at: t0.Add(time.Minute)})
	require.Equal(t, noTimer, m.timer)
	require.Equal(t, strandedMin, stranded(evTimer, 2*time.Minute))
}

// The looks while lingering pause 0.5, 1 and 2 ms; the claimer sleeps once
// the next pause would pass linger.
func TestLookWaits(t *testing.T) {
	t.Parallel()
	require.Equal(t, []time.Duration{lookMin, 2 * lookMin, 4 * lookMin, lookMax, lookMax},
		[]time.Duration{lookWait(0), lookWait(1), lookWait(2), lookWait(3), lookWait(20)})
	require.LessOrEqual(t, spent(2), linger)
	require.Greater(t, spent(3), linger)
}
