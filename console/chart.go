package console

import (
	"fmt"
	"time"

	"github.com/pgdispatch/pgdispatch/admin"
)

// The last hour's chart: one bar a minute, done jobs stacked under dead
// ones, scaled to the queue's busiest minute.
const (
	chartMinutes = 60
	barWidth     = 2
	chartHeight  = 28
)

// chart is a queue's last hour, drawn as SVG rectangles by the template.
type chart struct {
	Width, Height, Axis int
	Bars                []bar
	Done, Dead          int64
}

type bar struct {
	X, DoneY, DoneH, DeadY, DeadH int
	Title                         string
}

// charts draws each queue's minutes, the last of which is now's.
func charts(minutes []admin.Minute, now time.Time) map[string]*chart {
	end := now.UTC().Truncate(time.Minute)
	start := end.Add(-(chartMinutes - 1) * time.Minute)
	byQueue := map[string][]admin.Minute{}
	for _, m := range minutes {
		byQueue[m.Queue] = append(byQueue[m.Queue], m)
	}
	out := map[string]*chart{}
	for q, ms := range byQueue {
		c := &chart{Width: chartMinutes * barWidth, Height: chartHeight, Axis: chartHeight - 1}
		var most int64
		for _, m := range ms {
			most = max(most, m.Done+m.Dead)
		}
		for _, m := range ms {
			i := int(m.Minute.UTC().Sub(start) / time.Minute)
			if i < 0 || i >= chartMinutes || most == 0 {
				continue
			}
			c.Done += m.Done
			c.Dead += m.Dead
			doneH := int((m.Done*chartHeight + most - 1) / most)
			deadH := int((m.Dead*chartHeight + most - 1) / most)
			if doneH+deadH > chartHeight {
				doneH = chartHeight - deadH
			}
			c.Bars = append(c.Bars, bar{
				X:     i * barWidth,
				DoneY: chartHeight - doneH, DoneH: doneH,
				DeadY: chartHeight - doneH - deadH, DeadH: deadH,
				Title: fmt.Sprintf("%s UTC: %d done, %d dead", m.Minute.UTC().Format("15:04"), m.Done, m.Dead),
			})
		}
		out[q] = c
	}
	return out
}
