package schedule

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func utc(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

// slots steps a controlled clock from from to to, a minute at a time, and
// returns the slots it passes, as a scheduler that looks every minute would
// fire them.
func slots(t *testing.T, tm *Timing, from, to time.Time) []time.Time {
	t.Helper()
	var out []time.Time
	next := tm.Next(from)
	for now := from; now.Before(to); now = now.Add(time.Minute) {
		kept, total, n := tm.Due(next, now, 1)
		if total > 0 {
			require.EqualValues(t, 1, total, "at %s: a slot was missed", now)
			out = append(out, kept...)
			next = n
		}
	}
	return out
}

func TestDaylightSavingRule(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, cron string
		from, to   string
		want       []string
	}{
		{
			// 2026-03-29 02:00 CET the clock jumps to 03:00 CEST: 02:30 is a
			// slot at the jump, once.
			name: "a daily time the clock skips", cron: "30 2 * * *",
			from: "2026-03-28T00:00:00Z", to: "2026-03-31T00:00:00Z",
			want: []string{"2026-03-28T01:30:00Z", "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"},
		},
		{
			// 2026-10-25 03:00 CEST the clock goes back to 02:00 CET: 02:30
			// is a slot the first time only.
			name: "a daily time the clock shows twice", cron: "30 2 * * *",
			from: "2026-10-24T00:00:00Z", to: "2026-10-27T00:00:00Z",
			want: []string{"2026-10-24T00:30:00Z", "2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"},
		},
		{
			name: "every half hour across the skipped hour", cron: "*/30 * * * *",
			from: "2026-03-28T23:59:00Z", to: "2026-03-29T03:00:00Z",
			want: []string{
				"2026-03-29T00:00:00Z", "2026-03-29T00:30:00Z", // 01:00, 01:30 CET
				"2026-03-29T01:00:00Z", // 02:00 skipped: at the jump, 03:00 CEST
				"2026-03-29T01:30:00Z", "2026-03-29T02:00:00Z", "2026-03-29T02:30:00Z",
			},
		},
		{
			name: "every half hour across the repeated hour", cron: "*/30 * * * *",
			from: "2026-10-24T23:59:00Z", to: "2026-10-25T03:00:00Z",
			want: []string{
				"2026-10-25T00:00:00Z", "2026-10-25T00:30:00Z", // 02:00, 02:30 CEST
				// 02:00 and 02:30 CET: shown before, no slot
				"2026-10-25T02:00:00Z", "2026-10-25T02:30:00Z", // 03:00, 03:30 CET
			},
		},
		{
			name: "hourly across the repeated hour", cron: "@hourly",
			from: "2026-10-24T22:30:00Z", to: "2026-10-25T03:30:00Z",
			want: []string{"2026-10-24T23:00:00Z", "2026-10-25T00:00:00Z", "2026-10-25T02:00:00Z", "2026-10-25T03:00:00Z"},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			tm, err := Parse(c.cron, 0, "Europe/Berlin")
			require.NoError(t, err)
			var got []string
			for _, s := range slots(t, tm, utc(c.from), utc(c.to)) {
				got = append(got, s.UTC().Format(time.RFC3339))
			}
			require.Equal(t, c.want, got)
		})
	}
}

func TestNextAfterTheRepeatedHour(t *testing.T) {
	t.Parallel()
	tm, err := Parse("*/15 * * * *", 0, "Europe/Berlin")
	require.NoError(t, err)
	// 02:10 CET, the second time the clock shows 02:10: 02:15 was a slot
	// at 02:15 CEST already; the next is 03:00 CET.
	require.Equal(t, utc("2026-10-25T02:00:00Z"), tm.Next(utc("2026-10-25T01:10:00Z")))
}

func TestInterval(t *testing.T) {
	t.Parallel()
	tm, err := Parse("", 10*time.Second, "")
	require.NoError(t, err)
	require.Equal(t, utc("2026-01-01T00:00:10Z"), tm.Next(utc("2026-01-01T00:00:00Z")))
	require.Equal(t, utc("2026-01-01T00:00:10Z"), tm.Next(utc("2026-01-01T00:00:09.9Z")))

	kept, total, next := tm.Due(utc("2026-01-01T00:00:00Z"), utc("2026-01-01T00:01:35Z"), 3)
	require.EqualValues(t, 10, total)
	require.Equal(t, []time.Time{utc("2026-01-01T00:01:10Z"), utc("2026-01-01T00:01:20Z"), utc("2026-01-01T00:01:30Z")}, kept)
	require.Equal(t, utc("2026-01-01T00:01:40Z"), next)

	// A first run set by hand, off the slots.
	kept, total, next = tm.Due(utc("2026-01-01T00:00:03Z"), utc("2026-01-01T00:00:25Z"), 5)
	require.EqualValues(t, 3, total)
	require.Equal(t, []time.Time{utc("2026-01-01T00:00:03Z"), utc("2026-01-01T00:00:10Z"), utc("2026-01-01T00:00:20Z")}, kept)
	require.Equal(t, utc("2026-01-01T00:00:30Z"), next)

	kept, total, next = tm.Due(utc("2026-01-01T00:00:30Z"), utc("2026-01-01T00:00:25Z"), 5)
	require.Zero(t, total)
	require.Empty(t, kept)
	require.Equal(t, utc("2026-01-01T00:00:30Z"), next)
}

func TestCronDue(t *testing.T) {
	t.Parallel()
	tm, err := Parse("0 * * * *", 0, "UTC")
	require.NoError(t, err)
	kept, total, next := tm.Due(utc("2026-01-01T00:00:00Z"), utc("2026-01-01T09:30:00Z"), 2)
	require.EqualValues(t, 10, total)
	require.Equal(t, []time.Time{utc("2026-01-01T08:00:00Z"), utc("2026-01-01T09:00:00Z")}, kept)
	require.Equal(t, utc("2026-01-01T10:00:00Z"), next)

	// Years of minutes: counted up to maxDue, then estimated; the last
	// keep are kept.
	tm, err = Parse("* * * * *", 0, "UTC")
	require.NoError(t, err)
	kept, total, next = tm.Due(utc("2020-01-01T00:00:00Z"), utc("2024-01-01T00:00:30Z"), 5)
	require.InDelta(t, 2103841, total, 5000)
	require.Equal(t, []time.Time{
		utc("2023-12-31T23:56:00Z"), utc("2023-12-31T23:57:00Z"), utc("2023-12-31T23:58:00Z"),
		utc("2023-12-31T23:59:00Z"), utc("2024-01-01T00:00:00Z"),
	}, kept)
	require.Equal(t, utc("2024-01-01T00:01:00Z"), next)

	// A monthly schedule set back to the year 1 keeps its latest 1000.
	tm, err = Parse("@monthly", 0, "UTC")
	require.NoError(t, err)
	kept, total, next = tm.Due(utc("0001-01-01T00:00:00Z"), utc("2024-01-15T00:00:00Z"), 1000)
	require.InDelta(t, 2023*12+1, total, 300)
	require.Len(t, kept, 1000)
	require.Equal(t, utc("2024-01-01T00:00:00Z"), kept[999])
	require.Equal(t, utc("2024-02-01T00:00:00Z"), next)
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		cron  string
		every time.Duration
		tz    string
		want  string
	}{
		{"", 0, "UTC", "not neither"},
		{"* * * * *", time.Second, "UTC", "not both"},
		{"* * * *", 0, "UTC", "has 4 fields; it needs 5"},
		{"61 * * * *", 0, "UTC", "end of range (61) above maximum (59)"},
		{"@often", 0, "UTC", "no shortcut"},
		{"@every 1h", 0, "UTC", "give it as every"},
		{"CRON_TZ=UTC * * * * *", 0, "UTC", "names a time zone"},
		{"0 0 30 2 *", 0, "UTC", "names no time in the next five years"},
		{"* * * * *", 0, "Mars/Olympus", `time zone "Mars/Olympus" is unknown`},
		{"* * * * *", 0, "Local", `time zone "Local" is unknown`},
		{"", 1500 * time.Millisecond, "UTC", "whole number of seconds"},
	} {
		_, err := Parse(c.cron, c.every, c.tz)
		require.ErrorContains(t, err, c.want, "cron %q every %s tz %q", c.cron, c.every, c.tz)
	}
}
