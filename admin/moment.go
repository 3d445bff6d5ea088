package admin

import (
	"context"
	"errors"
	"time"
)

// Moment is a time given either as it is or as a duration before the
// database's clock (Now), as a person gives a DeadFilter's bounds: "since
// 2026-05-01T10:00:00Z" or "since 2h ago". The zero Moment is unset.
//
// Its text form, read by UnmarshalText and so usable as a flag
// (flag.TextVar), is an RFC 3339 time or a duration that is not negative.
type Moment struct {
	set bool
	ago bool          // d is the time before now
	t   time.Time     // when !ago
	d   time.Duration // when ago
}

// MomentAt is the Moment t.
func MomentAt(t time.Time) Moment { return Moment{set: true, t: t} }

// MomentAgo is the Moment d before the database's clock.
func MomentAgo(d time.Duration) Moment { return Moment{set: true, ago: true, d: d} }

var errMomentForm = errors.New("want an RFC 3339 time (2026-05-01T10:00:00Z) or a duration ago (2h, 90m)")

// UnmarshalText reads an RFC 3339 time, or a duration ago that is not
// negative.
func (m *Moment) UnmarshalText(b []byte) error {
	s := string(b)
	if t, err := time.Parse(time.RFC3339, s); err == nil {
		*m = MomentAt(t)
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return errMomentForm
	}
	if d < 0 {
		return errors.New("a duration ago must not be negative")
	}
	*m = MomentAgo(d)
	return nil
}

// MarshalText writes m as UnmarshalText reads it; the zero Moment as "".
func (m Moment) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

func (m Moment) String() string {
	switch {
	case !m.set:
		return ""
	case m.ago:
		return m.d.String()
	}
	return m.t.UTC().Format(time.RFC3339Nano)
}

// IsZero reports whether m is unset.
func (m Moment) IsZero() bool { return !m.set }

// At is the time m means when the clock reads now; zero when m is unset.
func (m Moment) At(now time.Time) time.Time {
	switch {
	case !m.set:
		return time.Time{}
	case m.ago:
		return now.Add(-m.d)
	}
	return m.t
}

// Resolve is the time each of ms means now, by the database's clock, which
// it reads only when one of them is a duration ago. An unset Moment is the
// zero time, as a DeadFilter takes an open side.
func (a *Admin) Resolve(ctx context.Context, ms ...Moment) ([]time.Time, error) {
	var now time.Time
	out := make([]time.Time, len(ms))
	for i, m := range ms {
		if m.ago && now.IsZero() {
			var err error
			if now, err = a.Now(ctx); err != nil {
				return nil, err
			}
		}
		out[i] = m.At(now)
	}
	return out, nil
}
