package claimer

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
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
	s := *errText(errors.New("bad\x00byte \xff here, \x1b[31mred\x1b[0m\r\u202eevil, line\nnext"))
	require.True(t, utf8.ValidString(s))
	require.NotContains(t, s, "\x00")
	require.NotContains(t, s, "\x1b")
	require.NotContains(t, s, "\r")
	require.NotContains(t, s, "\u202e")
	require.Contains(t, s, `\x1b[31mred`)
	require.Contains(t, s, "line\nnext", "line feeds stay: a panic's stack reads better")
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
