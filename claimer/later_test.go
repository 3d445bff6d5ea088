package claimer

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/claimer/internal/runstate"
)

// laterCounts is a laterWake whose claimer has free slots, counting its
// wakes and announcements.
func laterCounts(free int) (l *laterWake, woke, announced *int) {
	woke, announced = new(int), new(int)
	return &laterWake{
		wake:     func() { *woke++ },
		free:     func() int { return free },
		announce: func() { *announced++ },
	}, woke, announced
}

// A due job put back for later wakes the claimer, and the other workers'
// claimers only while every slot of its own is taken.
func TestLaterWakeAnnouncesOnlyWhatItCannotTake(t *testing.T) {
	l, woke, announced := laterCounts(1)
	l.due = dueTimes{time.Now()}
	l.fire()
	require.Equal(t, 1, *woke)
	require.Equal(t, 0, *announced, "a free slot takes it")

	l, woke, announced = laterCounts(0)
	l.due = dueTimes{time.Now()}
	l.fire()
	require.Equal(t, 1, *woke)
	require.Equal(t, 1, *announced, "every slot taken")
}

// A claimer that stops before a job it put back is due tells the others,
// once, and a wake already run or never set tells no one.
func TestLaterWakeAnnouncesAtStopWhatIsNotDue(t *testing.T) {
	l, woke, announced := laterCounts(1)
	l.written([]runstate.Outcome{{Verdict: runstate.Retry, Delay: time.Hour}}, time.Now())
	l.stop()
	require.Equal(t, 0, *woke)
	require.Equal(t, 1, *announced)
	l.written([]runstate.Outcome{{Verdict: runstate.Snoozed, Delay: time.Hour}}, time.Now())
	l.stop()
	require.Equal(t, 1, *announced, "no wake is set once stopped")

	l, _, announced = laterCounts(1)
	l.stop()
	require.Equal(t, 0, *announced, "nothing put back")
}

// A wake that fires after the claim loop has ended, while the claimer waits
// for its running jobs, is announced however many slots are free: no claim
// of the claimer's takes the job, and the wake, no longer pending, is not
// announced at the stop.
func TestLaterWakeAnnouncesWhatIsDueOnceClaimsHaveEnded(t *testing.T) {
	l, woke, announced := laterCounts(1)
	l.claimsEnded()
	l.due = dueTimes{time.Now()} // as if written, and now due
	l.fire()
	require.Equal(t, 1, *woke)
	require.Equal(t, 1, *announced, "due once the claims have ended")
	l.stop()
	require.Equal(t, 1, *announced, "announced once")
}

// Two jobs due at once, with one slot free: the claimer takes one, and the
// others are told of the other.
func TestLaterWakeAnnouncesWhatIsDueBeyondTheFreeSlots(t *testing.T) {
	l, woke, announced := laterCounts(1)
	now := time.Now()
	l.due = dueTimes{now, now}
	l.fire()
	require.Equal(t, 1, *woke)
	require.Equal(t, 1, *announced)
}

// Every job put back for later is announced when it is due while every
// slot of the claimer is taken, not only the earliest: a later one, in the
// same batch or in a batch written while an earlier wake was set, is as
// much beyond the claimer's reach when it is due. (The claim loop's own
// timer, set to the queue's next run_at, wakes the claimer for it, and
// tells no one.)
func TestLaterWakeAnnouncesEachDueJobWhileSaturated(t *testing.T) {
	announced := make(chan struct{}, 10)
	l := &laterWake{wake: func() {}, free: func() int { return 0 }, announce: func() { announced <- struct{}{} }}
	now := time.Now()
	l.written([]runstate.Outcome{
		{Verdict: runstate.Retry, Delay: time.Millisecond},
		{Verdict: runstate.Snoozed, Delay: 50 * time.Millisecond},
	}, now)
	l.written([]runstate.Outcome{{Verdict: runstate.Retry, Delay: 100 * time.Millisecond}}, now)
	for i := range 3 {
		select {
		case <-announced:
		case <-time.After(10 * time.Second):
			t.Fatalf("announcement %d of 3 never came", i+1)
		}
	}
	l.stop()
}

// While an announcement waits (a pool short of connections, a server that
// does not answer, for up to the statement timeout), the wakes that fire
// meanwhile make one more when it is done, not one each at once.
func TestLaterWakeAnnouncesOneAtATime(t *testing.T) {
	var mu sync.Mutex
	started, release := make(chan struct{}, 100), make(chan struct{})
	inFlight, most, total := 0, 0, 0
	l := &laterWake{wake: func() {}, free: func() int { return 0 }, announce: func() {
		mu.Lock()
		inFlight++
		most, total = max(most, inFlight), total+1
		mu.Unlock()
		started <- struct{}{}
		<-release
		mu.Lock()
		inFlight--
		mu.Unlock()
	}}
	push := func() {
		l.mu.Lock()
		l.due = append(l.due, time.Now())
		l.mu.Unlock()
	}
	var first, ten sync.WaitGroup
	push()
	first.Go(l.fire)
	<-started
	for range 10 {
		push()
		ten.Go(l.fire)
	}
	ten.Wait() // each found an announcement under way, and returned
	close(release)
	first.Wait()
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 1, most, "one announcement at a time")
	require.Equal(t, 2, total, "the first, and one for the ten that fired meanwhile")
}
