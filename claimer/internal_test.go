package claimer

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/executors"
)

func TestExponentialBackoff(t *testing.T) {
	t.Parallel()
	b := ExponentialBackoff(30 * time.Second)
	for attempt, want := range map[int]time.Duration{1: 30 * time.Second, 2: 2 * time.Minute, 3: 8 * time.Minute, 30: 24 * time.Hour} {
		got := b(attempt)
		require.GreaterOrEqual(t, got, want, "attempt %d", attempt)
		require.LessOrEqual(t, got, want+want/10, "attempt %d", attempt)
	}
}

func TestErrText(t *testing.T) {
	t.Parallel()
	s := *errText(errors.New("bad\x00byte \xff here"))
	require.True(t, utf8.ValidString(s))
	require.NotContains(t, s, "\x00")
	long := *errText(errors.New(strings.Repeat("é", maxErrorLen)))
	require.True(t, utf8.ValidString(long))
	require.LessOrEqual(t, len(long), maxErrorLen+len("…"))
}

func TestScheduleWait(t *testing.T) {
	t.Parallel()
	require.Equal(t, 1500*time.Millisecond, scheduleWait(1.5))
	// The year 9999 is about 2.5e11 s away: past what a Duration holds.
	require.Equal(t, maxScheduleWait, scheduleWait(2.5e11))
	require.Equal(t, maxScheduleWait, scheduleWait(math.Inf(1)))
	require.Equal(t, maxScheduleWait, scheduleWait(math.NaN()))
}

func TestHoldIsBounded(t *testing.T) {
	t.Parallel()
	cfg := Config{
		Pool: &pgxpool.Pool{}, Schema: "s", SleepConnConfig: &pgx.ConnConfig{}, Queue: "q", WorkerID: "w",
		Registry: executors.NewRegistry(), Hold: time.Minute,
	}
	require.ErrorContains(t, cfg.validate(), "Hold must not exceed 10s")
	cfg.Hold = maxHold
	require.NoError(t, cfg.validate())
}

// A held claim starts past the last full claim's last row only while a held
// batch is open, and only for resumeFront after the last claim from the
// front; a short claim, a failed one or a closed batch sends the next one
// back to the front.
func TestResumeStartsPastOnlyInABacklog(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	runs := func(keys ...claimKey) []*running {
		out := make([]*running, len(keys))
		for i, k := range keys {
			out[i] = &running{job: &executors.Job{ID: k.id, Priority: k.priority, RunAt: k.runAt}}
		}
		return out
	}
	a := claimKey{priority: 0, runAt: t0, id: 7}
	b := claimKey{priority: 0, runAt: t0.Add(time.Millisecond), id: 3} // after a: a later run_at
	c := claimKey{priority: 1, runAt: t0, id: 1}                       // after both: a lower priority

	var r resume
	require.Nil(t, r.next(true, t0), "nothing claimed yet: the front")
	r.claimed(nil, t0, runs(b, c, a), 3, nil)
	require.Equal(t, &c, r.next(true, t0.Add(time.Millisecond)), "the greatest key of a full claim")
	require.Nil(t, r.next(false, t0.Add(time.Millisecond)), "no batch open: the front")
	require.Nil(t, r.next(true, t0.Add(resumeFront)), "resumeFront after the last front claim: the front")

	r.claimed(&c, t0.Add(time.Millisecond), runs(a, b), 3, nil)
	require.Nil(t, r.next(true, t0.Add(2*time.Millisecond)), "a short claim: the front")

	r.claimed(nil, t0.Add(20*time.Millisecond), runs(a, b), 2, nil)
	require.Equal(t, &b, r.next(true, t0.Add(29*time.Millisecond)), "a front claim starts the resumeFront anew")
	r.claimed(&b, t0.Add(29*time.Millisecond), runs(c), 1, nil)
	require.Equal(t, &c, r.next(true, t0.Add(29*time.Millisecond)), "a past claim does not")
	require.Nil(t, r.next(true, t0.Add(30*time.Millisecond)))

	r.claimed(nil, t0.Add(40*time.Millisecond), nil, 2, errors.New("claim jobs: connection lost"))
	require.Nil(t, r.next(true, t0.Add(41*time.Millisecond)), "a failed claim: the front")
}

// A worker's held batches leave each queue a connection for its leased
// claims and one for its completer, and one for the heartbeats and the
// sweeper; never fewer than one batch.
func TestHeldLimitFor(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ pool, queues, want int }{{10, 1, 7}, {10, 2, 5}, {10, 5, 1}, {2, 1, 1}, {40, 3, 33}} {
		require.Equal(t, c.want, HeldLimitFor(c.pool, c.queues).n, "pool %d, %d queues", c.pool, c.queues)
	}
}
