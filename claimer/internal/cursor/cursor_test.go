package cursor

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/claimer/internal/machine"
	"github.com/pgdispatch/pgdispatch/claimer/internal/runstate"
	"github.com/pgdispatch/pgdispatch/executors"
)

// The cursor is the last job in (priority, run_at, id) order, whatever
// order the claim returned its rows in.
func TestCursorIsTheLastInClaimOrder(t *testing.T) {
	t.Parallel()
	now := time.Now()
	run := func(p int16, at time.Time, id int64) *runstate.Run {
		return &runstate.Run{Job: &executors.Job{Priority: p, RunAt: at, ID: id}}
	}
	var k Cursor
	k.Claimed(3, []*runstate.Run{run(1, now, 5), run(0, now.Add(time.Hour), 9), run(1, now, 4)})
	require.True(t, k.Set)
	require.Equal(t, int16(1), k.Priority)
	require.Equal(t, int64(5), k.ID)
	k.Claimed(3, []*runstate.Run{run(0, now, 1), run(0, now.Add(-time.Second), 2), run(0, now, 3)})
	require.Equal(t, int64(3), k.ID)
	require.True(t, k.RunAt.Equal(now))
	k.Claimed(3, []*runstate.Run{run(0, now, 1)})
	require.False(t, k.Set, "a claim that came up short leaves no cursor")
	require.True(t, k.FromFront(machine.EventTimer, now))
}

// The second between claims from the front is counted from the end of the
// last one, however long it took.
func TestCursorSecondCountsFromTheEndOfTheClaimFromTheFront(t *testing.T) {
	t.Parallel()
	sent := time.Now()
	k := Cursor{Set: true}
	require.True(t, k.FromFront(machine.EventTimer, sent), "never from the front yet")
	ended := sent.Add(FrontEvery / FrontShare) // a walk over hundreds of thousands of dead entries
	k.FrontEnded(sent, ended)
	require.False(t, k.FromFront(machine.EventTimer, ended.Add(FrontEvery-time.Millisecond)))
	require.True(t, k.FromFront(machine.EventTimer, ended.Add(FrontEvery)))
	require.True(t, k.FromFront(machine.EventTick, ended), "the fallback tick's claim is from the front")
}

// A claim from the front that took longer than FrontEvery/FrontShare is
// followed by FrontShare times as long from the cursor: claims from the
// front take at most a fifth of a saturated claimer's time.
func TestCursorSlowClaimFromTheFrontIsFollowedByItsShareFromTheCursor(t *testing.T) {
	t.Parallel()
	sent := time.Now()
	k := Cursor{Set: true}
	ended := sent.Add(3 * FrontEvery) // a walk over millions of dead entries
	k.FrontEnded(sent, ended)
	require.False(t, k.FromFront(machine.EventTimer, ended.Add(FrontShare*3*FrontEvery-time.Millisecond)))
	require.True(t, k.FromFront(machine.EventTimer, ended.Add(FrontShare*3*FrontEvery)))
}

// A set cursor is claimed from only while the last claim from the front
// took SlowFront or longer.
func TestCursorOnlyWhileClaimsFromTheFrontAreSlow(t *testing.T) {
	t.Parallel()
	now := time.Now()
	k := Cursor{Set: true}
	k.FrontEnded(now.Add(-SlowFront/2), now)
	require.True(t, k.FromFront(machine.EventSlotFreed, now), "a quick claim from the front: the next is from the front too")
	k.FrontEnded(now.Add(-SlowFront), now)
	require.False(t, k.FromFront(machine.EventSlotFreed, now), "a slow claim from the front: the next is from the cursor")
	require.True(t, k.FromFront(machine.EventTick, now), "the tick's claim is from the front")
	require.True(t, k.FromFront(machine.EventSlotFreed, now.Add(FrontEvery)), "a second on, from the front")
}
