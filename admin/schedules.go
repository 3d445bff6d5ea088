package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgdispatch/pgdispatch/migrations"
	"github.com/pgdispatch/pgdispatch/schedule"
)

// ErrNoSchedule means no schedule has the name.
var ErrNoSchedule = errors.New("no such schedule")

// ScheduleSpec declares a schedule. The zero value of an optional field
// leaves it as it is on an existing schedule, and takes its default on a
// new one.
type ScheduleSpec struct {
	// Name names the schedule: 1 to 200 characters. Required.
	Name string
	// Cron is five fields (minute hour day-of-month month day-of-week) or a
	// shortcut such as @daily; Every is an interval of whole seconds. One of
	// them is required.
	Cron  string
	Every time.Duration
	// TimeZone is the IANA zone Cron is read in. Default: UTC.
	TimeZone string
	// Kind is the jobs' kind. Required.
	Kind string
	// Payload is the jobs' payload. Default: {}.
	Payload json.RawMessage
	// Queue is the jobs' queue. Default: "default".
	Queue string
	// Priority is the jobs' priority; nil for the default, 0.
	Priority *int16
	// MaxAttempts is the jobs' max_attempts. Default: the worker's.
	MaxAttempts int
	// CatchUp is skip (one job after downtime) or all (one per missed
	// slot, up to CatchUpLimit). Defaults: skip, 100.
	CatchUp      string
	CatchUpLimit int
}

// Check refuses what the workers could not run, with the message the
// declaration would get: the timing (parsed as the workers parse it), the
// names, the catch-up policy and the numbers.
func (s ScheduleSpec) Check() error {
	var errs []error
	if n := utf8.RuneCountInString(s.Name); n < 1 || n > 200 {
		errs = append(errs, errors.New("a schedule's name has 1 to 200 characters"))
	}
	tz := s.TimeZone
	if tz == "" {
		tz = "UTC"
	}
	if _, err := schedule.Parse(s.Cron, s.Every, tz); err != nil {
		errs = append(errs, err)
	}
	if n := utf8.RuneCountInString(s.Kind); n < 1 || n > migrations.NameLimit {
		errs = append(errs, fmt.Errorf("a kind has 1 to %d characters", migrations.NameLimit))
	}
	if utf8.RuneCountInString(s.Queue) > migrations.NameLimit {
		errs = append(errs, fmt.Errorf("a queue's name has at most %d characters", migrations.NameLimit))
	}
	if len(s.Payload) > 0 && !json.Valid(s.Payload) {
		errs = append(errs, errors.New("the payload is not valid JSON"))
	}
	if len(s.Payload) > migrations.PayloadLimit {
		errs = append(errs, fmt.Errorf("the payload is over %d bytes", migrations.PayloadLimit))
	}
	switch s.CatchUp {
	case "", "skip", "all":
	default:
		errs = append(errs, fmt.Errorf("catch-up is skip (one job after downtime) or all (one job per missed slot), not %q", s.CatchUp))
	}
	if s.CatchUpLimit < 0 || s.CatchUpLimit > 1000 {
		errs = append(errs, errors.New("the catch-up limit is 1 to 1000"))
	}
	if s.MaxAttempts < 0 || s.MaxAttempts > migrations.AttemptsLimit {
		errs = append(errs, fmt.Errorf("max attempts are 1 to %d", migrations.AttemptsLimit))
	}
	return errors.Join(errs...)
}

// Declare checks s and declares it (schedule() in SQL): a new schedule, or
// a change to the one of that name. It reports whether it was created.
func (a *Admin) Declare(ctx context.Context, s ScheduleSpec) (created bool, err error) {
	if err := s.Check(); err != nil {
		return false, fmt.Errorf("schedule %q: %w", s.Name, err)
	}
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	var every *time.Duration
	if s.Every > 0 {
		every = &s.Every
	}
	var payload any
	if len(s.Payload) > 0 {
		payload = s.Payload
	}
	err = a.pool.QueryRow(ctx, a.sql(`SELECT created FROM {schema}.schedule(
		name => $1, cron => $2, kind => $3, payload => $4, queue => $5, time_zone => $6, priority => $7,
		max_attempts => $8, catch_up => $9, catch_up_limit => $10, every => $11)`),
		s.Name, nullIf(s.Cron), s.Kind, payload, nullIf(s.Queue), nullIf(s.TimeZone), s.Priority,
		nullIfZero(s.MaxAttempts), nullIf(s.CatchUp), nullIfZero(s.CatchUpLimit), every).Scan(&created)
	if err != nil {
		return false, fmt.Errorf("schedule %q: %w", s.Name, err)
	}
	return created, nil
}

func nullIf(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func nullIfZero(n int) *int {
	if n == 0 {
		return nil
	}
	return &n
}

// Unschedule deletes the schedule called name (unschedule() in SQL); the
// jobs it created stay. It reports whether there was one.
func (a *Admin) Unschedule(ctx context.Context, name string) (bool, error) {
	return a.scheduleCall(ctx, "remove", `SELECT {schema}.unschedule($1)`, name)
}

// PauseSchedule stops the schedule called name from creating jobs
// (pause_schedule() in SQL). It reports whether it was enabled.
func (a *Admin) PauseSchedule(ctx context.Context, name string) (bool, error) {
	return a.scheduleCall(ctx, "pause", `SELECT {schema}.pause_schedule($1)`, name)
}

// ResumeSchedule starts the schedule called name again from its next slot
// (resume_schedule() in SQL). It reports whether it was paused.
func (a *Admin) ResumeSchedule(ctx context.Context, name string) (bool, error) {
	return a.scheduleCall(ctx, "resume", `SELECT {schema}.resume_schedule($1)`, name)
}

func (a *Admin) scheduleCall(ctx context.Context, what, sql, name string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	var changed bool
	if err := a.pool.QueryRow(ctx, a.sql(sql), name).Scan(&changed); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42704" { // undefined_object
			return false, fmt.Errorf("%s schedule %q: %w", what, name, ErrNoSchedule)
		}
		return false, fmt.Errorf("%s schedule %q: %w", what, name, err)
	}
	return changed, nil
}

// Schedule is a row of the schedules table.
type Schedule struct {
	Name         string          `json:"name"`
	Cron         *string         `json:"cron"`
	EverySeconds *int64          `json:"every_seconds"`
	TimeZone     string          `json:"time_zone"`
	Kind         string          `json:"kind"`
	Payload      json.RawMessage `json:"payload"`
	Queue        string          `json:"queue"`
	Priority     int16           `json:"priority"`
	MaxAttempts  *int32          `json:"max_attempts"`
	CatchUp      string          `json:"catch_up"`
	CatchUpLimit int32           `json:"catch_up_limit"`
	Enabled      bool            `json:"enabled"`
	// NextRunAt is the next slot; nil until a worker has computed it.
	NextRunAt *time.Time `json:"next_run_at"`
	// LastRunAt is the last slot that created a job.
	LastRunAt *time.Time `json:"last_run_at"`
	// Runs counts the jobs created, Missed the slots that passed without
	// one, CaughtUp the jobs created late for missed slots, and Taken the
	// slots whose key another job held already, so that none was created.
	Runs     int64 `json:"runs"`
	Missed   int64 `json:"missed"`
	CaughtUp int64 `json:"caught_up"`
	Taken    int64 `json:"taken"`
	// Error says why the workers leave the schedule alone.
	Error *string `json:"error"`
	// Warning names the last slot found taken, and the job holding its key.
	Warning   *string   `json:"warning"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Timing is how the schedule's slots are written: its cron expression,
// or "every" and its interval.
func (s Schedule) Timing() string {
	switch {
	case s.Cron != nil:
		return *s.Cron
	case s.EverySeconds != nil:
		return "every " + (time.Duration(*s.EverySeconds) * time.Second).String()
	}
	return ""
}

// Schedules lists the schedules by name.
func (a *Admin) Schedules(ctx context.Context) ([]Schedule, error) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	rows, _ := a.pool.Query(ctx, a.sql(`
SELECT name, cron, extract(epoch FROM every)::int8, time_zone, kind, payload, queue, priority, max_attempts,
       catch_up, catch_up_limit, enabled, next_run_at, last_run_at, runs, missed, caught_up, taken, error, warning,
       created_at, updated_at
FROM {schema}.schedules ORDER BY name`))
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Schedule])
	if err != nil {
		return nil, fmt.Errorf("list schedules: %w", err)
	}
	return out, nil
}
