package claimer

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/claimer/internal/machine"
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

func TestScheduleWait(t *testing.T) {
	t.Parallel()
	require.Equal(t, 1500*time.Millisecond, scheduleWait(1.5))
	// The year 9999 is about 2.5e11 s away: past what a Duration holds.
	require.Equal(t, machine.MaxScheduleWait, scheduleWait(2.5e11))
	require.Equal(t, machine.MaxScheduleWait, scheduleWait(math.Inf(1)))
	require.Equal(t, machine.MaxScheduleWait, scheduleWait(math.NaN()))
	// A lean claim tells a due first run_at as seconds at or below 0; the
	// year 1 is about 6.4e10 s back, past what a Duration holds too.
	require.Equal(t, time.Duration(0), scheduleWait(-6.4e10))
	require.Equal(t, time.Duration(0), scheduleWait(-0.5))
	require.Equal(t, time.Duration(0), scheduleWait(math.Inf(-1)))
}
