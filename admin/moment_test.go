package admin_test

import (
	"context"
	"flag"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/admin"
)

// A Moment reads an RFC 3339 time or a duration ago, writes them back, and
// means the time itself or the duration before the clock it is given.
func TestMomentText(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 5, 2, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		text, written string
		at            time.Time
	}{
		{"2026-05-01T10:00:00Z", "2026-05-01T10:00:00Z", time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)},
		{"2026-05-01T12:00:00+02:00", "2026-05-01T10:00:00Z", time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)},
		{"2h", "2h0m0s", now.Add(-2 * time.Hour)},
		{"90m", "1h30m0s", now.Add(-90 * time.Minute)},
		{"0s", "0s", now},
	} {
		var m admin.Moment
		require.NoError(t, m.UnmarshalText([]byte(c.text)), c.text)
		require.False(t, m.IsZero(), c.text)
		require.Equal(t, c.written, m.String(), c.text)
		require.True(t, c.at.Equal(m.At(now)), "%s: %s", c.text, m.At(now))
	}
	for text, want := range map[string]string{
		"yesterday":  "want an RFC 3339 time (2026-05-01T10:00:00Z) or a duration ago (2h, 90m)",
		"2026-05-01": "want an RFC 3339 time (2026-05-01T10:00:00Z) or a duration ago (2h, 90m)",
		"-2h":        "a duration ago must not be negative",
	} {
		m := admin.MomentAgo(time.Minute)
		require.EqualError(t, m.UnmarshalText([]byte(text)), want, text)
		require.Equal(t, admin.MomentAgo(time.Minute), m, "a refused text leaves the Moment as it was")
	}
	var unset admin.Moment
	require.True(t, unset.At(now).IsZero())
	require.Empty(t, unset.String())

	// As a flag: unset shows no default.
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var since admin.Moment
	fs.TextVar(&since, "since", admin.Moment{}, "a `time`")
	require.Empty(t, fs.Lookup("since").DefValue)
	require.NoError(t, fs.Parse([]string{"--since", "2h"}))
	require.Equal(t, admin.MomentAgo(2*time.Hour), since)
	require.Error(t, fs.Parse([]string{"--since", "soon"}))
}

// Resolve takes a duration ago from the database's clock, and leaves a
// time as it is and an unset Moment zero.
func TestResolve(t *testing.T) {
	t.Parallel()
	a, _, _ := setup(t)
	ctx := context.Background()
	at := time.Date(2026, 5, 1, 10, 0, 0, 0, time.UTC)

	before, err := a.Now(ctx)
	require.NoError(t, err)
	got, err := a.Resolve(ctx, admin.MomentAt(at), admin.MomentAgo(time.Hour), admin.Moment{})
	require.NoError(t, err)
	after, err := a.Now(ctx)
	require.NoError(t, err)

	require.Len(t, got, 3)
	require.True(t, at.Equal(got[0]))
	require.False(t, got[1].Before(before.Add(-time.Hour)), "an hour before the database's clock at the call")
	require.False(t, got[1].After(after.Add(-time.Hour)))
	require.True(t, got[2].IsZero())
}
