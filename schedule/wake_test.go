package schedule_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/schedule"
)

// A pass reads the earliest next slot and whether a schedule is due from
// one snapshot. Read by two statements, a peer's commit that moved a due
// schedule on between them made the first see no future slot and the
// second no due schedule: the scheduler slept for the whole fallback (5
// minutes), and fired nothing meanwhile, should the peer then die. Here a
// peer moves the schedule between due and a second away as fast as it can
// while the scheduler passes: no pass may sleep past the next slot.
func TestPassSleepsNoLongerThanTheNextSlot(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e.exec(t, "SELECT "+pgx.Identifier{e.schema, "schedule"}.Sanitize()+"('flip', NULL, 'noop', every => '1 second')")
	s := newScheduler(t, e, nil)

	peer := pgtest.Conn(t)
	flipped := make(chan error, 1)
	flipCtx, stopFlipping := context.WithCancel(ctx)
	go func() {
		var err error
		for due := true; flipCtx.Err() == nil && err == nil; due = !due {
			_, err = peer.Exec(flipCtx, "UPDATE "+e.schedules+
				" SET next_run_at = CASE WHEN $1 THEN now() - interval '1 second' ELSE now() + interval '1 second' END", due)
		}
		if flipCtx.Err() != nil {
			err = nil
		}
		flipped <- err
	}()
	defer func() { // before the peer's connection closes, should the test fail
		stopFlipping()
		if err := <-flipped; err != nil {
			t.Errorf("the peer's passes: %v", err)
		}
	}()
	passes := 0
	for start := time.Now(); time.Since(start) < 3*time.Second; passes++ {
		res, err := s.Pass(ctx)
		require.NoError(t, err)
		require.Less(t, res.Wait, 2*time.Second, "pass %d would sleep %s, with the schedule due or a second away", passes+1, res.Wait)
		require.NotEqual(t, schedule.DefaultFallback, res.Wait)
	}
	stopFlipping()
	require.NoError(t, <-flipped)
	flipped <- nil // for the deferred wait
	t.Logf("%d passes, each sleeping no longer than the next slot", passes)
}
