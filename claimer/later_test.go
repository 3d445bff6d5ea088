package claimer

import (
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
	l.fire()
	require.Equal(t, 1, *woke)
	require.Equal(t, 0, *announced, "a free slot takes it")

	l, woke, announced = laterCounts(0)
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
