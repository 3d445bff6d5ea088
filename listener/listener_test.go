package listener

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func TestBackoffGrowsWithJitterAndCap(t *testing.T) {
	t.Parallel()
	l, err := New(Config{
		ConnConfig: &pgx.ConnConfig{}, Channel: "c", Wake: func(string) {}, WakeAll: func() {},
		ReconnectMin: 100 * time.Millisecond, ReconnectMax: time.Second,
	})
	require.NoError(t, err)
	for n, full := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 4: 800 * time.Millisecond, 5: time.Second, 60: time.Second} {
		d := l.backoff(n)
		require.GreaterOrEqual(t, d, full/2, "attempt %d", n)
		require.LessOrEqual(t, d, full, "attempt %d", n)
	}
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	_, err := New(Config{Channel: "c", Wake: func(string) {}, WakeAll: func() {}})
	require.ErrorContains(t, err, "ConnConfig is required")
	_, err = New(Config{ConnConfig: &pgx.ConnConfig{}, Wake: func(string) {}, WakeAll: func() {}})
	require.ErrorContains(t, err, "Channel is required")
	// A schema named as the control channel: one channel would carry both,
	// and its one LISTEN would never complete the pair.
	_, err = New(Config{
		ConnConfig: &pgx.ConnConfig{}, Channel: "pgdispatch.control", Wake: func(string) {}, WakeAll: func() {},
		ControlChannel: "pgdispatch.control", Control: func(string) {},
	})
	require.ErrorContains(t, err, "must differ")
}
