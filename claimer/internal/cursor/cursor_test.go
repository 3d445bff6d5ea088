package cursor

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/claimer/internal/runstate"
	"github.com/pgdispatch/pgdispatch/executors"
)

func run(p int16, at time.Time, id int64) *runstate.Run {
	return &runstate.Run{Job: &executors.Job{Priority: p, RunAt: at, ID: id}}
}

// The cursor is the last job of each claim that took any in (priority,
// run_at, id) order, whatever order the claim returned its rows in; a
// claim from the front that took none puts it at the claim's time, at the
// priority of its last place; one from the cursor that took none leaves it.
func TestCursorIsTheLastInClaimOrder(t *testing.T) {
	t.Parallel()
	now := time.Now()
	var k Cursor
	k.Claimed(true, time.Millisecond, now, []*runstate.Run{run(1, now, 5), run(0, now.Add(time.Hour), 9), run(1, now, 4)}, true)
	require.True(t, k.Set)
	require.Equal(t, int16(1), k.Priority)
	require.Equal(t, int64(5), k.ID)
	k.Claimed(false, 0, now, []*runstate.Run{run(0, now, 1), run(0, now.Add(-time.Second), 2), run(0, now, 3)}, true)
	require.Equal(t, int64(3), k.ID)
	require.True(t, k.RunAt.Equal(now))
	k.Claimed(false, 0, now, []*runstate.Run{run(0, now, 7)}, false)
	require.Equal(t, int64(7), k.ID, "a claim that came up short moves it too")
	k.Claimed(false, 0, now.Add(time.Minute), nil, false)
	require.Equal(t, int64(7), k.ID, "a claim from the cursor that found nothing leaves it")
	k.Priority = 3
	k.Claimed(true, time.Millisecond, now.Add(time.Minute), nil, false)
	require.True(t, k.Set)
	require.Equal(t, int16(3), k.Priority)
	require.True(t, k.RunAt.Equal(now.Add(time.Minute)))
	require.Zero(t, k.ID, "a claim from the front that found nothing: every due job before its time was taken")
}

// While the front is held (a claim from the front that took HeldClaim,
// or a look that took SlowFront), every claim is from the cursor; while it
// is busy (a claim from the front that took BusyClaim), only the claims
// after a full one. A quick look sends the claims back to the front. A
// claim from the front that took BusyClaim or longer asks for a look, as
// every claim from the cursor does.
func TestCursorWhileTheFrontIsHeldOrBusy(t *testing.T) {
	t.Parallel()
	now := time.Now()
	var k Cursor
	require.True(t, k.FromFront(), "no cursor yet")
	require.False(t, k.Claimed(true, BusyClaim/2, now, []*runstate.Run{run(0, now, 1)}, true), "a quick claim from the front asks for no look")
	require.True(t, k.FromFront())
	require.True(t, k.Claimed(true, BusyClaim, now, []*runstate.Run{run(0, now, 2)}, true), "a busy claim from the front asks for a look")
	require.False(t, k.FromFront(), "after a full claim, from the cursor")
	require.True(t, k.Claimed(false, 0, now, []*runstate.Run{run(0, now, 3)}, false), "a claim from the cursor asks for a look")
	require.True(t, k.FromFront(), "after a short one, from the front, while the front is only busy")
	k.Claimed(true, 0, now, []*runstate.Run{run(0, now, 4)}, true)
	require.False(t, k.FromFront())
	k.Looked(Look{Took: SlowFront / 2})
	require.True(t, k.FromFront(), "a quick look: from the front")
	require.True(t, k.Claimed(true, HeldClaim, now, []*runstate.Run{run(0, now, 5)}, true), "a slow full claim from the front asks for a look")
	require.False(t, k.Held, "a full claim's time is its writes' too: the front is only busy")
	k.Looked(Look{Took: SlowFront / 2})
	require.True(t, k.Claimed(true, HeldClaim, now, []*runstate.Run{run(0, now, 5)}, false), "a slow short claim from the front asks for a look")
	require.False(t, k.FromFront(), "the front is held: every claim from the cursor")
	k.Looked(Look{Took: time.Hour, Err: errTest})
	require.False(t, k.FromFront(), "a failed look changes nothing")
	k.Looked(Look{Took: SlowFront / 2})
	require.True(t, k.FromFront(), "a quick look: from the front")
	k.Looked(Look{Took: SlowFront})
	require.False(t, k.FromFront(), "a slow look: the front is held")
	k.Reset()
	require.True(t, k.FromFront())
}

var errTest = errors.New("test")

// A look that found a due job behind the cursor puts the cursor just
// before it; one ahead of it, or none, leaves the cursor.
func TestLookedMovesTheCursorBackToAJobBehindIt(t *testing.T) {
	t.Parallel()
	now := time.Now()
	k := Cursor{Slow: -1}
	k.Claimed(true, time.Second, now, []*runstate.Run{run(0, now, 10)}, true)
	k.Looked(Look{Found: true, Priority: 0, RunAt: now, ID: 11, Took: time.Second})
	require.Equal(t, int64(10), k.ID, "ahead: the claims reach it anyway")
	k.Looked(Look{Took: time.Second})
	require.Equal(t, int64(10), k.ID)
	k.Looked(Look{Found: true, Priority: 0, RunAt: now.Add(-time.Hour), ID: 12, Took: time.Second})
	require.Equal(t, Cursor{Set: true, Priority: 0, RunAt: now.Add(-time.Hour), ID: 11, Held: true, Busy: true, Full: true, Slow: -1}, k)
	k.Looked(Look{Found: true, Priority: -1, RunAt: now, ID: 20, Took: time.Second})
	require.Equal(t, int16(-1), k.Priority)
	require.Equal(t, int64(19), k.ID)
	require.False(t, k.FromFront())
}

// Looks keep to LookEvery apart, or LookShare times the last look's time
// when that is longer: a look that walks millions of dead entries takes
// at most a fifth of its connection's time.
func TestLooksKeepTheirShare(t *testing.T) {
	t.Parallel()
	ended := time.Now()
	require.Equal(t, ended.Add(LookEvery), nextLook(ended, 10*time.Millisecond, LookEvery))
	require.Equal(t, ended.Add(LookShare*3*LookEvery), nextLook(ended, 3*LookEvery, LookEvery))
	require.Equal(t, ended.Add(time.Millisecond), nextLook(ended, 0, time.Millisecond))
}
