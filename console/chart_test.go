package console

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/admin"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

// hourOfFinishedJobs is the statement that selects the status and
// finished_at of 400 done and dead jobs spread over the hour before
// anchor (an SQL expression): the job with i % 60 = k finished k minutes
// and i / 60 seconds before anchor, so that each of the 60 minutes holds
// one job finished at a whole number of minutes before anchor, whatever
// second of its minute anchor falls on.
func hourOfFinishedJobs(anchor string) string {
	return strings.ReplaceAll(`SELECT CASE WHEN i % 7 = 0 THEN 'dead' ELSE 'done' END AS status,
	       {anchor} - (i % 60) * interval '1 minute' - (i / 60) * interval '1 second' AS finished_at
	FROM generate_series(0, 399) i`, "{anchor}", anchor)
}

type finishedJob struct {
	status string
	at     time.Time
}

// minutesOf counts finished jobs per minute as admin.LastHour does at now:
// those finished after the minute 59 minutes before now's.
func minutesOf(queue string, finished []finishedJob, now time.Time) []admin.Minute {
	from := now.UTC().Truncate(time.Minute).Add(-59 * time.Minute)
	byMinute := map[time.Time]*admin.Minute{}
	var out []admin.Minute
	for _, j := range finished {
		if !j.at.After(from) {
			continue
		}
		m := j.at.UTC().Truncate(time.Minute)
		if byMinute[m] == nil {
			byMinute[m] = &admin.Minute{Queue: queue, Minute: m}
		}
		if j.status == "done" {
			byMinute[m].Done++
		} else {
			byMinute[m].Dead++
		}
	}
	for _, m := range byMinute {
		out = append(out, *m)
	}
	return out
}

// The browser test's hour of finished jobs fills the chart whatever second
// of the minute it is inserted on: a bar for each of the 60 minutes but
// the one a turn of the minute before the page moves out of it (or two,
// inserted on the minute's first microsecond).
func TestHourOfFinishedJobsFillsTheChart(t *testing.T) {
	pool := pgtest.Pool(t)
	minute := time.Date(2026, 11, 27, 16, 0, 0, 0, time.UTC)
	seconds := []time.Duration{
		0, time.Microsecond, 500 * time.Millisecond, time.Second, 2 * time.Second,
		3*time.Second + 900*time.Millisecond, 4 * time.Second, 4*time.Second + 500*time.Millisecond,
		30 * time.Second, time.Minute - time.Microsecond,
	}
	for _, sec := range seconds {
		anchor := minute.Add(sec)
		t.Run(fmt.Sprint(sec), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			rows, err := pool.Query(ctx, hourOfFinishedJobs("$1::timestamptz"), anchor)
			require.NoError(t, err)
			var finished []finishedJob
			for rows.Next() {
				var j finishedJob
				require.NoError(t, rows.Scan(&j.status, &j.at))
				finished = append(finished, j)
			}
			require.NoError(t, rows.Err())
			require.Len(t, finished, 400)

			same := charts(minutesOf("hooks", finished, anchor), anchor)["hooks"]
			require.NotNil(t, same)
			require.GreaterOrEqual(t, len(same.Bars), 59, "the page in the minute of the insert")
			next := anchor.Truncate(time.Minute).Add(time.Minute + 10*time.Second)
			turned := charts(minutesOf("hooks", finished, next), next)["hooks"]
			require.NotNil(t, turned)
			require.GreaterOrEqual(t, len(turned.Bars), 58, "the page in the next minute")
		})
	}
}
