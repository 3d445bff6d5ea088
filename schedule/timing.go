package schedule

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"

	// The zones are built in, so that a worker in an image without
	// /usr/share/zoneinfo (distroless) knows them too.
	_ "time/tzdata"
)

// Timing is a schedule's slots: the times its cron expression names in its
// time zone, or the multiples of its interval since the Unix epoch.
//
// A cron expression is read on the local clock of its zone, and each time
// of that clock is a slot once:
//   - a time the clock skips (when daylight-saving time begins) is a slot
//     at the instant the clock jumps: 02:30 in Europe/Berlin on the last
//     Sunday of March is a slot at 03:00 CEST;
//   - a time the clock shows twice (when it ends) is a slot the first
//     time only: 02:30 on the last Sunday of October is a slot at 02:30
//     CEST, not again at 02:30 CET.
//
// An interval counts real time and knows no zone.
type Timing struct {
	spec  *cron.SpecSchedule // on the wall clock, read as UTC; nil for an interval
	every time.Duration
	loc   *time.Location
}

var parser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// maxSearch bounds the wall-clock times Next tries: a clock shows a time
// twice for an hour at most.
const maxSearch = 100_000

// Parse reads a schedule's timing: a cron expression of five fields or a
// shortcut such as @daily, in the IANA time zone tz, or an interval of
// whole seconds (cronExpr empty). Its errors say what is wrong.
func Parse(cronExpr string, every time.Duration, tz string) (*Timing, error) {
	cronExpr = strings.Join(strings.Fields(cronExpr), " ")
	switch {
	case cronExpr == "" && every == 0:
		return nil, errors.New("give a cron expression or an interval (every), not neither")
	case cronExpr != "" && every != 0:
		return nil, errors.New("give a cron expression or an interval (every), not both")
	}
	if every != 0 {
		if every < time.Second || every%time.Second != 0 {
			return nil, fmt.Errorf("every %s must be a whole number of seconds, at least 1", every)
		}
		return &Timing{every: every, loc: time.UTC}, nil
	}
	loc, err := LoadZone(tz)
	if err != nil {
		return nil, err
	}
	upper := strings.ToUpper(cronExpr)
	switch {
	case strings.HasPrefix(upper, "TZ=") || strings.HasPrefix(upper, "CRON_TZ="):
		return nil, fmt.Errorf("cron %q names a time zone: give it as the time zone instead", cronExpr)
	case strings.HasPrefix(cronExpr, "@every"):
		return nil, fmt.Errorf("cron %q is an interval: give it as every", cronExpr)
	case strings.HasPrefix(cronExpr, "@"):
		switch cronExpr {
		case "@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly":
		default:
			return nil, fmt.Errorf("cron %q is no shortcut pgdispatch knows: use @yearly, @annually, @monthly, @weekly, @daily, @midnight or @hourly, or five fields", cronExpr)
		}
	default:
		if n := len(strings.Fields(cronExpr)); n != 5 {
			return nil, fmt.Errorf("cron %q has %d fields; it needs 5: minute hour day-of-month month day-of-week, or a shortcut such as @daily", cronExpr, n)
		}
	}
	s, err := parser.Parse(cronExpr)
	if err != nil {
		return nil, fmt.Errorf("cron %q: %w", cronExpr, err)
	}
	spec, ok := s.(*cron.SpecSchedule)
	if !ok {
		return nil, fmt.Errorf("cron %q is not a calendar expression", cronExpr)
	}
	spec.Location = time.UTC
	t := &Timing{spec: spec, loc: loc}
	if t.Next(time.Now()).IsZero() {
		return nil, fmt.Errorf("cron %q names no time in the next five years", cronExpr)
	}
	return t, nil
}

// LoadZone loads the IANA time zone name, refusing the names that mean the
// machine's own zone.
func LoadZone(name string) (*time.Location, error) {
	switch name {
	case "", "Local", "localtime":
		return nil, fmt.Errorf("time zone %q is unknown: give an IANA name such as Europe/Berlin, or UTC", name)
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("time zone %q is unknown: give an IANA name such as Europe/Berlin, or UTC", name)
	}
	return loc, nil
}

// Next returns the first slot after t, or the zero time when there is none
// in the next five years.
func (s *Timing) Next(t time.Time) time.Time {
	if s.every > 0 {
		e := int64(s.every / time.Second)
		u := t.Unix() // floor for any time after 1970; slots before it do not matter
		n := u / e
		if u < 0 && u%e != 0 {
			n--
		}
		return time.Unix((n+1)*e, 0).UTC()
	}
	local := t.In(s.loc)
	wall := time.Date(local.Year(), local.Month(), local.Day(), local.Hour(), local.Minute(), local.Second(), local.Nanosecond(), time.UTC)
	for range maxSearch {
		wall = s.spec.Next(wall)
		if wall.IsZero() {
			return time.Time{}
		}
		if at, ok := s.instant(wall, t); ok {
			return at
		}
	}
	return time.Time{}
}

// instant is the first instant after t at which the zone's clock shows
// wall (given in UTC): the earlier of two when the clock shows it twice,
// and the instant the clock jumps past it when it never does. ok is false
// when the clock showed it at or before t only.
func (s *Timing) instant(wall, after time.Time) (time.Time, bool) {
	var (
		shown   []time.Time
		skipped time.Time
	)
	// The offsets in effect a day either side: zones change them at most
	// once a day.
	for _, probe := range []time.Duration{-26 * time.Hour, 0, 26 * time.Hour} {
		_, off := wall.Add(probe).In(s.loc).Zone()
		c := wall.Add(-time.Duration(off) * time.Second)
		l := c.In(s.loc)
		lw := time.Date(l.Year(), l.Month(), l.Day(), l.Hour(), l.Minute(), l.Second(), l.Nanosecond(), time.UTC)
		if lw.Equal(wall) {
			shown = append(shown, c)
		} else if lw.After(wall) && skipped.IsZero() {
			// The clock read wall's offset before it jumped: c is past
			// the jump, which began the zone's period that holds c.
			start, _ := l.ZoneBounds()
			if !start.IsZero() {
				skipped = start
			}
		}
	}
	if len(shown) > 0 {
		first := shown[0]
		for _, c := range shown[1:] {
			if c.Before(first) {
				first = c
			}
		}
		return first, first.After(after)
	}
	if !skipped.IsZero() && skipped.After(after) {
		return skipped, true
	}
	return time.Time{}, false
}

// maxDue bounds the slots counted one by one from first in Due: a pass
// computes a hundred schedules within its timeout, however far behind
// their next_run_at is.
const maxDue = 2_000

// Due returns the slots from first (a slot, or a time set by hand) through
// now: the last keep of them, oldest first, and how many there were in all;
// and the first slot after now. Past maxDue slots of a cron expression,
// those before the last keep are estimated from the spacing of the first
// ones.
func (s *Timing) Due(first, now time.Time, keep int) (kept []time.Time, total int64, next time.Time) {
	if first.After(now) {
		return nil, 0, first
	}
	keep = max(keep, 1)
	if s.every > 0 {
		s1 := s.Next(first)
		total = 1
		var last time.Time
		if s1.After(now) {
			last = first
		} else {
			last = s.Next(now.Add(-s.every)) // the one slot in (now-every, now]
			total += int64(last.Sub(s1)/s.every) + 1
		}
		n := int(min(total, int64(keep)))
		kept = make([]time.Time, n)
		for i := range n {
			kept[n-1-i] = last.Add(-time.Duration(i) * s.every)
		}
		if total <= int64(keep) {
			kept[0] = first
		}
		return kept, total, s.Next(last)
	}
	ring := make([]time.Time, 0, keep)
	add := func(t time.Time) {
		if len(ring) == keep {
			copy(ring, ring[1:])
			ring = ring[:keep-1]
		}
		ring = append(ring, t)
	}
	at := first
	jumped := false
	for !at.After(now) {
		if total == maxDue && !jumped {
			jumped = true
			spacing := float64(at.Unix()-first.Unix()) / float64(total)
			if from := s.window(at, now, keep, spacing); from.After(at) {
				// The slots in [at, from] are counted by their spacing
				// so far, and none of them is kept.
				total += int64(float64(from.Unix()-at.Unix())/max(spacing, 1)) + 1
				ring = ring[:0]
				at = s.Next(from)
				continue
			}
		}
		add(at)
		total++
		at = s.Next(at)
		if at.IsZero() {
			break
		}
	}
	return ring, total, at
}

// window returns a time after at such that (from, now] holds at least
// keep slots, or at when there is none. spacing is the mean seconds
// between slots so far.
func (s *Timing) window(at, now time.Time, keep int, spacing float64) time.Time {
	for w := int64(max(spacing, 60) * float64(2*keep)); w > 0; w *= 2 {
		from := time.Unix(now.Unix()-w, 0)
		if !from.After(at) {
			return at
		}
		n := 0
		for t := s.Next(from); !t.IsZero() && !t.After(now) && n < keep; t = s.Next(t) {
			n++
		}
		if n >= keep {
			return from
		}
	}
	return at
}
