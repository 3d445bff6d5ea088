// Package schedule fires the durable schedules of a pgdispatch schema: rows
// of its schedules table, each of which creates a job at every slot of its
// cron expression or interval (see Timing).
//
// Every worker runs a Scheduler; none leads. A pass is one transaction: it
// locks the due schedules with FOR UPDATE SKIP LOCKED in id order, inserts
// each one's job with the dedup_key 'schedule:<name>:<slot>' (ON CONFLICT DO
// NOTHING), and moves its next_run_at on. A schedule is thus fired by one
// worker, once per slot, and the job and the move commit together.
//
// Between passes the scheduler sleeps until the earliest next_run_at it
// knows, or the fallback (5 minutes by default). A change to the table
// wakes it (a trigger notifies on the control channel; Wake), and so does
// the listener's reconnect. A due schedule another worker holds is looked
// at again within HeldRetry: that worker may be committing, or it may have
// died or frozen mid-pass. A pass bounds itself on the server, with
// statement_timeout and idle_in_transaction_session_timeout set for its
// transaction (which PgBouncer's transaction mode keeps too): the session
// of a worker that freezes mid-pass ends HoldIdleTimeout after its last
// statement, one that dies ends when the server sees its socket close, and
// either way its transaction rolls back and another worker fires the slot,
// late rather than never.
//
// After downtime, a schedule whose catch_up is skip creates one job, for
// its latest slot, and counts the others as missed; one whose catch_up is
// all creates a job for each missed slot, up to catch_up_limit (the latest
// ones), counting the rest as missed and those created late as caught up.
// A schedule whose timing the scheduler cannot compute, or whose job the
// jobs table refuses, gets the reason in its error column and is left alone
// until it is changed.
package schedule

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch/internal/retry"
	"github.com/pgdispatch/pgdispatch/internal/stmttimeout"
)

// DefaultFallback is the longest a scheduler sleeps without a wake-up.
const DefaultFallback = 5 * time.Minute

const (
	// batchSize bounds the schedules one transaction fires.
	batchSize = 100
	// HoldIdleTimeout is the longest a pass's transaction may wait for its
	// worker between statements: the server ends the session of a worker
	// that froze mid-pass after it (idle_in_transaction_session_timeout,
	// set for the transaction), and the schedules it held are free again.
	HoldIdleTimeout = 2 * time.Second
	// HoldStatementTimeout bounds each statement of a pass on the server
	// (statement_timeout, set for the transaction), or the pass's
	// StatementTimeout when that is shorter.
	HoldStatementTimeout = 5 * time.Second
	// HeldRetry is how soon a scheduler looks again at a due schedule it
	// found locked by another worker, which may have died or frozen.
	HeldRetry = time.Second
	// planBudget bounds the time a pass spends computing slots between
	// two statements, well within HoldIdleTimeout.
	planBudget = HoldIdleTimeout / 4
	// maxTimings bounds the parsed timings kept.
	maxTimings = 1000
)

// Config configures a Scheduler.
type Config struct {
	// Pool runs every statement. Required.
	Pool *pgxpool.Pool
	// Schema holds the schedules and jobs tables. Required.
	Schema string
	// Fallback is the longest sleep without a wake-up. Default: 5 minutes.
	Fallback time.Duration
	// StatementTimeout bounds each pass's transaction. Default:
	// pgdispatch.DefaultStatementTimeout (10s).
	StatementTimeout time.Duration
	// Now, when set, is the clock of Pass instead of the database's now(),
	// for tests.
	Now func() time.Time
	// Logger receives the scheduler's logs. Default: no logging.
	Logger *zap.Logger
}

// Stats are what the scheduler's passes did so far, in total.
type Stats struct {
	Passes   int64 // transactions run
	Created  int64 // jobs created
	Missed   int64 // slots that passed without a job (downtime under skip, or past catch_up_limit)
	CaughtUp int64 // jobs created late, for slots missed under catch_up all
	Failed   int64 // schedules given an error
	Taken    int64 // slots that created no job: a job held their dedup_key already
}

// Result is what one pass did.
type Result struct {
	Stats
	// Wait is how long until the earliest slot the pass knows of; 0 when
	// there is more to fire now, and Config.Fallback when no schedule is
	// enabled.
	Wait time.Duration
}

// Scheduler fires due schedules. Create it with New.
type Scheduler struct {
	cfg      Config
	logger   *zap.Logger
	sql      map[string]string
	begin    string
	wake     chan struct{}
	poolSize int

	mu      sync.Mutex
	timings map[timingKey]*timingResult

	passes, created, missed, caughtUp, failed, taken atomic.Int64

	// afterLock, when set (tests), runs in a pass that locked schedules,
	// before it fires them.
	afterLock func(ctx context.Context, tx pgx.Tx)
}

type timingKey struct {
	cron  string
	every int64
	tz    string
}

type timingResult struct {
	t   *Timing
	err error
}

// New checks cfg and returns a Scheduler.
func New(cfg Config) (*Scheduler, error) {
	switch {
	case cfg.Pool == nil:
		return nil, errors.New("schedule: Pool is required")
	case cfg.Schema == "":
		return nil, errors.New("schedule: Schema is required")
	case cfg.Fallback < 0, cfg.StatementTimeout < 0:
		return nil, errors.New("schedule: durations and counts must not be negative")
	}
	cfg.Fallback = cmp.Or(cfg.Fallback, DefaultFallback)
	cfg.StatementTimeout = cmp.Or(cfg.StatementTimeout, stmttimeout.Default)
	r := strings.NewReplacer("{schedules}", pgx.Identifier{cfg.Schema, "schedules"}.Sanitize(),
		"{fire}", pgx.Identifier{cfg.Schema, "fire_schedule_slots"}.Sanitize())
	queries := map[string]string{}
	for name, q := range map[string]string{
		"now": nowSQL, "quiet": quietSQL, "lock": lockSQL, "fire": fireSQL, "update": updateSQL, "wake": wakeSQL,
	} {
		queries[name] = r.Replace(q)
	}
	return &Scheduler{
		cfg:    cfg,
		logger: cmp.Or(cfg.Logger, zap.NewNop()).Named("scheduler"),
		sql:    queries,
		begin: fmt.Sprintf("BEGIN; SET LOCAL statement_timeout = %d; SET LOCAL idle_in_transaction_session_timeout = %d",
			min(cfg.StatementTimeout, HoldStatementTimeout).Milliseconds(), HoldIdleTimeout.Milliseconds()),
		wake:     make(chan struct{}, 1),
		poolSize: int(cfg.Pool.Config().MaxConns),
		timings:  map[timingKey]*timingResult{},
	}, nil
}

// Wake makes the scheduler read the schedules again now. It never blocks.
func (s *Scheduler) Wake() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Stats returns what the passes so far did.
func (s *Scheduler) Stats() Stats {
	return Stats{
		Passes: s.passes.Load(), Created: s.created.Load(), Missed: s.missed.Load(),
		CaughtUp: s.caughtUp.Load(), Failed: s.failed.Load(), Taken: s.taken.Load(),
	}
}

const (
	nowSQL = `SELECT coalesce($1::timestamptz, now())`

	// lockSQL takes the due schedules, and those whose next_run_at no
	// worker has computed yet.
	lockSQL = `
SELECT id, name, cron, extract(epoch FROM every)::int8, time_zone, catch_up, catch_up_limit, next_run_at, updated_at
FROM {schedules}
WHERE enabled AND error IS NULL AND (next_run_at IS NULL OR next_run_at <= coalesce($1::timestamptz, now()))
ORDER BY id
LIMIT $2
FOR UPDATE SKIP LOCKED`

	// fireSQL creates the jobs of the slots fired, in schedule and slot
	// order, and says for each schedule how many it created and how many
	// slots it could not, their dedup_key held by a job already
	// (migration 012).
	fireSQL = `SELECT schedule_id, created, taken, taken_key, taken_by FROM {fire}($1::bigint[], $2::timestamptz[])`

	// updateSQL moves the schedules on; they are locked already. It runs
	// after quietSQL, which keeps the table's triggers from checking the
	// rows again and from waking every worker.
	updateSQL = `
UPDATE {schedules} s
SET next_run_at = u.next, last_run_at = coalesce(u.last, s.last_run_at), runs = s.runs + u.runs,
    missed = s.missed + u.missed, caught_up = s.caught_up + u.caught_up, error = u.error,
    taken = s.taken + u.taken, warning = coalesce(u.warning, s.warning)
FROM unnest($1::bigint[], $2::timestamptz[], $3::timestamptz[], $4::int8[], $5::int8[], $6::int8[], $7::text[], $8::int8[], $9::text[])
     AS u(id, next, last, runs, missed, caught_up, error, taken, warning)
WHERE s.id = u.id`

	// quietSQL marks the transaction's changes as the scheduler's own, for
	// the table's triggers.
	quietSQL = `SELECT set_config('pgdispatch.scheduling', 'on', true)`

	// wakeSQL reads the earliest next slot and whether a schedule is due.
	// After a pass has fired those it could lock, another worker holds the
	// rest. One statement, so one snapshot: read by two, a peer's commit
	// between them could show no future slot and no due schedule, and the
	// scheduler slept for the whole fallback.
	wakeSQL = `
SELECT (SELECT min(next_run_at) FROM {schedules}
        WHERE enabled AND error IS NULL AND next_run_at > coalesce($1::timestamptz, now())),
       EXISTS (SELECT FROM {schedules}
               WHERE enabled AND error IS NULL AND (next_run_at IS NULL OR next_run_at <= coalesce($1::timestamptz, now())))`
)

// Run fires due schedules until ctx ends, starting at once, sleeping
// between passes until the next slot, a Wake or the fallback. It returns
// nil when ctx is cancelled.
func (s *Scheduler) Run(ctx context.Context) error {
	s.logger.Info("scheduler started", zap.Duration("fallback", s.cfg.Fallback))
	t := time.NewTimer(0)
	defer t.Stop()
	backoff := retry.New(s.poolSize)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-s.wake:
		}
		res, err := s.Pass(ctx)
		if ctx.Err() != nil {
			return nil
		}
		next := min(res.Wait, s.cfg.Fallback)
		if err != nil {
			next = min(backoff.Next(err), s.cfg.Fallback)
			s.logger.Warn("schedules: pass failed", zap.Error(err), zap.Int("failures", backoff.Failures()), zap.Duration("retry_in", next))
		} else {
			backoff = retry.New(s.poolSize)
		}
		t.Reset(next)
	}
}

// due is a locked schedule as the pass reads it.
type due struct {
	id                   int64
	name, catchUp, tz    string
	cron                 *string
	every                *int64
	limit                int32
	nextRunAt, updatedAt *time.Time
}

// plan is what a pass does to one schedule.
type plan struct {
	id                            int64
	slots                         []time.Time
	next, last                    *time.Time
	runs, missed, caughtUp, taken int64
	err, warning                  *string
}

// Pass fires the due schedules in one transaction and reports what it did
// and how long until the next slot it knows of. When none is due it only
// reads, in one statement batch.
func (s *Scheduler) Pass(ctx context.Context) (Result, error) {
	var clock *time.Time
	if s.cfg.Now != nil {
		now := s.cfg.Now()
		clock = &now
	}
	if res, due, err := s.peek(ctx, clock); err != nil || !due {
		return res, err
	}
	res, err := s.pass(ctx, clock, false)
	var pgErr *pgconn.PgError
	if err != nil && errors.As(err, &pgErr) && (strings.HasPrefix(pgErr.Code, "22") || strings.HasPrefix(pgErr.Code, "23")) {
		// A job the table refuses: fire each schedule on its own, and
		// give the refused ones the reason.
		s.logger.Warn("schedules: a job was refused; firing each schedule on its own", zap.Error(err))
		res, err = s.pass(ctx, clock, true)
	}
	return res, err
}

// peek reads, outside a transaction of its own, whether a schedule is due,
// and otherwise how long until the next slot.
func (s *Scheduler) peek(ctx context.Context, clock *time.Time) (res Result, due bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.StatementTimeout)
	defer cancel()
	s.passes.Add(1)
	batch := &pgx.Batch{}
	var now time.Time
	batch.Queue(s.sql["now"], clock).QueryRow(func(row pgx.Row) error { return row.Scan(&now) })
	earliest, held := s.queueWake(batch, clock)
	if err := s.cfg.Pool.SendBatch(ctx, batch).Close(); err != nil {
		return res, false, fmt.Errorf("schedules: read next slot: %w", err)
	}
	if *held {
		return res, true, nil
	}
	res.Wait = s.wait(now, *earliest, false)
	return res, false, nil
}

// queueWake queues the reads of the earliest next slot and of whether a
// schedule is due.
func (s *Scheduler) queueWake(batch *pgx.Batch, clock *time.Time) (earliest **time.Time, held *bool) {
	earliest, held = new(*time.Time), new(bool)
	batch.Queue(s.sql["wake"], clock).QueryRow(func(row pgx.Row) error { return row.Scan(earliest, held) })
	return earliest, held
}

// wait is how long from now until earliest, at most the fallback; or,
// when another worker holds a due schedule, HeldRetry at most. That worker
// may be committing, or may have died or frozen mid-pass: the server ends
// its transaction within HoldIdleTimeout of its last statement, and the
// slot is then this scheduler's to fire.
func (s *Scheduler) wait(now time.Time, earliest *time.Time, held bool) time.Duration {
	limit := s.cfg.Fallback
	if held {
		limit = min(limit, HeldRetry)
	}
	if earliest == nil {
		return limit
	}
	return min(max(earliest.Sub(now), 0), limit)
}

func (s *Scheduler) pass(ctx context.Context, clock *time.Time, oneByOne bool) (res Result, err error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.StatementTimeout)
	defer cancel()
	// The timeouts come with BEGIN, in one round trip: the transaction
	// never waits for the worker without them.
	tx, err := s.cfg.Pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: s.begin})
	if err != nil {
		return res, fmt.Errorf("schedules: begin: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit this is a no-op
	s.passes.Add(1)

	batch := &pgx.Batch{}
	var now time.Time
	batch.Queue(s.sql["now"], clock).QueryRow(func(row pgx.Row) error { return row.Scan(&now) })
	var rows []due
	batch.Queue(s.sql["lock"], clock, batchSize).Query(func(r pgx.Rows) error {
		var err error
		rows, err = pgx.CollectRows(r, func(r pgx.CollectableRow) (due, error) {
			var d due
			err := r.Scan(&d.id, &d.name, &d.cron, &d.every, &d.tz, &d.catchUp, &d.limit, &d.nextRunAt, &d.updatedAt)
			return d, err
		})
		return err
	})
	if err := tx.SendBatch(ctx, batch).Close(); err != nil {
		return res, fmt.Errorf("schedules: find due ones: %w", err)
	}

	if s.afterLock != nil && len(rows) > 0 {
		s.afterLock(ctx, tx)
	}

	// Planning runs between statements, while the server's idle timeout
	// counts: a pass plans for planBudget at most, and leaves the rest
	// due for the next pass, at once.
	plans := make([]plan, 0, len(rows))
	began := time.Now()
	for _, d := range rows {
		if len(plans) > 0 && time.Since(began) > planBudget {
			break
		}
		plans = append(plans, s.plan(d, now))
	}
	got := map[int64]fired{}
	if oneByOne {
		if err := s.fireOneByOne(ctx, tx, plans, rows, got); err != nil {
			return res, err
		}
	} else if err := s.fire(ctx, tx, plans, got); err != nil {
		return res, err
	}

	var (
		ids, runs, missed, caughtUp, taken []int64
		nexts, lasts                       []*time.Time
		errs, warnings                     []*string
	)
	for i := range plans {
		p := &plans[i]
		s.settle(p, got[p.id])
		ids = append(ids, p.id)
		nexts = append(nexts, p.next)
		lasts = append(lasts, p.last)
		runs = append(runs, p.runs)
		missed = append(missed, p.missed)
		caughtUp = append(caughtUp, p.caughtUp)
		taken = append(taken, p.taken)
		errs = append(errs, p.err)
		warnings = append(warnings, p.warning)
		res.Created += p.runs
		res.Missed += p.missed
		res.CaughtUp += p.caughtUp
		res.Taken += p.taken
		if p.err != nil {
			res.Failed++
		}
	}
	batch = &pgx.Batch{}
	batch.Queue(s.sql["quiet"])
	if len(ids) > 0 {
		batch.Queue(s.sql["update"], ids, nexts, lasts, runs, missed, caughtUp, errs, taken, warnings)
	}
	earliest, held := s.queueWake(batch, &now)
	if err := tx.SendBatch(ctx, batch).Close(); err != nil {
		return res, fmt.Errorf("schedules: move on: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return res, fmt.Errorf("schedules: commit: %w", err)
	}
	s.created.Add(res.Created)
	s.missed.Add(res.Missed)
	s.caughtUp.Add(res.CaughtUp)
	s.failed.Add(res.Failed)
	s.taken.Add(res.Taken)
	if res.Created > 0 || res.Failed > 0 || res.Taken > 0 {
		s.logger.Debug("schedules fired", zap.Int64("jobs", res.Created), zap.Int64("missed", res.Missed),
			zap.Int64("caught_up", res.CaughtUp), zap.Int64("failed", res.Failed), zap.Int64("taken", res.Taken))
	}

	if len(rows) == batchSize || len(plans) < len(rows) {
		return res, nil // more are due: at once
	}
	res.Wait = s.wait(now, *earliest, *held)
	return res, nil
}

// plan decides what to do with the due schedule d at now.
func (s *Scheduler) plan(d due, now time.Time) plan {
	p := plan{id: d.id, next: d.nextRunAt}
	fail := func(err error) plan {
		msg := err.Error()
		s.logger.Warn("schedules: a schedule cannot be computed; it waits for a change", zap.Int64("schedule_id", d.id), zap.Error(err))
		return plan{id: d.id, err: &msg}
	}
	t, err := s.timing(d)
	if err != nil {
		return fail(err)
	}
	first := d.nextRunAt
	if first == nil {
		base := now
		if d.updatedAt != nil && d.updatedAt.Before(now) {
			base = *d.updatedAt
		}
		n := t.Next(base)
		if n.IsZero() {
			return fail(errors.New("its timing names no time in the next five years"))
		}
		first = &n
	}
	keep := 1
	if d.catchUp == "all" {
		keep = int(d.limit)
	}
	kept, total, next := t.Due(*first, now, keep)
	if next.IsZero() {
		return fail(errors.New("its timing names no time in the next five years"))
	}
	p.next = &next
	if total == 0 {
		return p
	}
	last := kept[len(kept)-1]
	p.slots, p.last = kept, &last
	p.runs = int64(len(kept))
	p.missed = total - int64(len(kept))
	p.caughtUp = int64(len(kept)) - 1
	return p
}

func (s *Scheduler) timing(d due) (*Timing, error) {
	k := timingKey{tz: d.tz}
	if d.cron != nil {
		k.cron = *d.cron
	}
	if d.every != nil {
		k.every = *d.every
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if r, ok := s.timings[k]; ok {
		return r.t, r.err
	}
	if len(s.timings) >= maxTimings {
		clear(s.timings)
	}
	t, err := Parse(k.cron, time.Duration(k.every)*time.Second, k.tz)
	s.timings[k] = &timingResult{t, err}
	return t, err
}
