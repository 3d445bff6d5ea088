package runstate

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/executors"
)

func newRun(id int64) *Run { return &Run{Job: &executors.Job{ID: id}, ClaimedAt: time.Unix(id, 0)} }

// A run's life as its owner sees it: claimed, started, reported, written;
// its slot is free once reported, and its entry gone once written.
func TestTrackerRunLife(t *testing.T) {
	t.Parallel()
	tr := New(3, 10)
	a, b := newRun(2), newRun(1)
	tr.Add([]*Run{a, b})
	require.Equal(t, 2, tr.Executing())
	require.Equal(t, 1, tr.Free())
	require.Equal(t, []*Run{b, a}, tr.Inflight(), "in id order")

	require.False(t, tr.Start(a, func() {}))
	o, ok := tr.Report(a, Outcome{Run: a, Verdict: Done})
	require.True(t, ok)
	require.Equal(t, Done, o.Verdict)
	require.Equal(t, 2, tr.Free())
	_, ok = tr.Report(a, Outcome{Run: a, Verdict: Retry})
	require.False(t, ok, "a run has one outcome")
	require.Equal(t, []Outcome{{Run: a, Verdict: Done}}, tr.Unwritten(5))
	require.Equal(t, []*Run{b}, tr.Unreported())

	tr.Written(1)
	require.Zero(t, tr.UnwrittenCount())
	require.Equal(t, []*Run{b}, tr.Inflight())
}

// A stopped run has its executor's context cancelled, is put down to the
// cancel a notice named it in, and has its outcome dropped.
func TestTrackerStop(t *testing.T) {
	t.Parallel()
	tr := New(10, 10)
	named, other, done := newRun(1), newRun(2), newRun(3)
	tr.Add([]*Run{named, other, done})
	ctx, cancel := context.WithCancel(context.Background())
	require.False(t, tr.Start(named, cancel))
	_, _ = tr.Report(done, Outcome{Run: done, Verdict: Done})

	before := tr.Notices()
	require.Equal(t, 1, tr.Notice([]int64{1, 3, 99}), "the reported run is not counted")
	require.Equal(t, before+1, tr.Notices())
	cancelled, lost := tr.Stop([]*Run{named, other, done})
	require.Equal(t, 1, cancelled)
	require.Equal(t, 1, lost, "the reported run is not stopped")
	require.Error(t, ctx.Err())
	cancelled, lost = tr.Stop([]*Run{named, other})
	require.Zero(t, cancelled+lost, "stopped once")

	require.True(t, tr.Stopped(other))
	require.True(t, tr.Start(other, func() {}), "a stopped run's executor does not start")
	o, ok := tr.Report(named, Outcome{Run: named, Verdict: Retry})
	require.True(t, ok)
	require.Equal(t, Dropped, o.Verdict)
	require.ErrorIs(t, o.Cause, ErrCancelled)
	o, _ = tr.Report(other, Outcome{Run: other, Verdict: Done})
	require.ErrorIs(t, o.Cause, ErrLeaseLost)
	require.Equal(t, 1, tr.UnwrittenCount(), "only the done run's outcome waits")
	require.Equal(t, []*Run{done}, tr.Inflight(), "dropped runs are forgotten")
}

// Outcomes reported while a batch is written do not touch the batch the
// writer holds, and wait, in the order reported, for the next, once the
// written ones are let go of.
func TestTrackerUnwrittenWhileWriting(t *testing.T) {
	t.Parallel()
	tr := New(10, 10)
	runs := []*Run{newRun(1), newRun(2), newRun(3), newRun(4), newRun(5), newRun(6)}
	tr.Add(runs)
	for _, r := range runs[:3] {
		_, _ = tr.Report(r, Outcome{Run: r, Verdict: Done})
	}
	batch := tr.Unwritten(2)
	for _, r := range runs[3:] {
		_, _ = tr.Report(r, Outcome{Run: r, Verdict: Retry})
	}
	require.Equal(t, []Outcome{{Run: runs[0], Verdict: Done}, {Run: runs[1], Verdict: Done}}, batch)
	tr.Written(len(batch))
	require.Equal(t, []Outcome{
		{Run: runs[2], Verdict: Done},
		{Run: runs[3], Verdict: Retry},
		{Run: runs[4], Verdict: Retry},
		{Run: runs[5], Verdict: Retry},
	}, tr.Unwritten(10))
	require.Equal(t, runs[2:], tr.Inflight())
	r := newRun(7)
	tr.Add([]*Run{r})
	_, _ = tr.Report(r, Outcome{Run: r, Verdict: Dead})
	tr.Written(4)
	require.Equal(t, []Outcome{{Run: r, Verdict: Dead}}, tr.Unwritten(10))
}

// Outcomes waiting past the bound shrink the claims, so that claiming
// never outruns recording.
func TestTrackerFreeCountsUnwritten(t *testing.T) {
	t.Parallel()
	tr := New(5, 2)
	runs := []*Run{newRun(1), newRun(2), newRun(3), newRun(4)}
	tr.Add(runs)
	for _, r := range runs {
		_, _ = tr.Report(r, Outcome{Run: r})
	}
	require.Equal(t, 3, tr.Free(), "5 slots free, less the 2 outcomes past the bound")
	tr.Written(4)
	require.Equal(t, 5, tr.Free())
}

// The watchdog's runs: past their deadline by the grace, or stopped the
// grace ago.
func TestTrackerOverdue(t *testing.T) {
	t.Parallel()
	tr := New(10, 10)
	now := time.Now()
	late, fresh, stopped, notStarted := newRun(1), newRun(2), newRun(3), newRun(4)
	tr.Add([]*Run{late, fresh, stopped, notStarted})
	late.Begin(now.Add(-time.Minute), now.Add(-3*time.Second))
	fresh.Begin(now.Add(-time.Minute), now.Add(-time.Second))
	stopped.Begin(now, now.Add(time.Hour))
	tr.Stop([]*Run{stopped})

	l, s := tr.Overdue(now, 2*time.Second)
	require.Equal(t, []*Run{late}, l)
	require.Empty(t, s, "stopped just now")
	l, s = tr.Overdue(now.Add(3*time.Second), 2*time.Second)
	require.ElementsMatch(t, []*Run{late, fresh}, l)
	require.Equal(t, []*Run{stopped}, s)
}
