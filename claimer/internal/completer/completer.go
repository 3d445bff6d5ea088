// Package completer writes a claimer's outcomes in batches, in id order.
//
// The statements write a batch of rows found by id in the order of their
// arrays, which the completer sorts by id: under pinned.PlanSQL their one
// plan is a nested loop over the arrays, by primary key, so they lock their
// rows in id order, and lock each once, as they write it. The key is
// matched as id = ANY(ARRAY[v.id]), which the primary key serves for each
// row of the arrays but which, unlike id = v.id, gives the planner no
// reason to read the whole primary key in order: with statistics that said
// the table held no row (analyzed once a burst had drained), it read it for
// every row of the batch. A row is written
// only while it is still this worker's attempt: the guard, wrapped in IS
// TRUE, which no index can serve, so that the planner never drives the
// batch from a scan for running rows (with stale statistics it did,
// quadratic in the batch). A row whose guard fails is left alone: its lease
// was lost to the sweeper, or an operator cancelled it. The guard names the
// claim by the updated_at it wrote: a claim lost in a server crash (it
// commits without waiting for its WAL flush) can be made again by the same
// worker with the same attempt number, and the first run's outcome must not
// pass for the second's.
package completer

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch/claimer/internal/pinned"
	"github.com/pgdispatch/pgdispatch/claimer/internal/runstate"
	"github.com/pgdispatch/pgdispatch/internal/retry"
)

// CompleteSQL records a batch of outcomes: $3 is done, pending (a retry,
// or a release: an attempt given back at shutdown or snoozed, $6) or dead.
// A pending job is due $4 seconds from now, or at $9 when it is set (a
// snooze until an instant).
// A failed attempt's entry ($7, JSON) is appended to errors after the last
// 19 before it, so that errors holds the last 20 (as cancel() in migration
// 010 does), and a done job's result ($8, JSON, NULL for none) is stored.
const CompleteSQL = `
UPDATE {jobs} j
SET status = v.status,
    run_at = CASE WHEN v.status = 'pending' THEN coalesce(v.until, now() + make_interval(secs => v.delay)) ELSE j.run_at END,
    attempts = CASE WHEN v.release THEN j.attempts - 1 ELSE j.attempts END,
    last_error = coalesce(v.err, j.last_error),
    errors = CASE WHEN v.entry IS NULL THEN j.errors
                  ELSE jsonb_path_query_array(coalesce(j.errors, '[]'), '$[last - 18 to last]') || v.entry::jsonb END,
    result = CASE WHEN v.status = 'done' THEN v.result::jsonb ELSE j.result END,
    finished_at = CASE WHEN v.status IN ('done', 'dead') THEN now() END,
    locked_by = NULL,
    locked_until = NULL,
    updated_at = now()
FROM unnest($1::bigint[], $2::timestamptz[], $3::text[], $4::float8[], $5::text[], $6::bool[], $7::text[], $8::text[], $9::timestamptz[])
    AS v(id, claimed_at, status, delay, err, release, entry, result, until)
WHERE j.id = ANY(ARRAY[v.id]) AND (j.status = 'running' AND j.locked_by = $10 AND j.updated_at = v.claimed_at) IS TRUE`

// DeleteDoneSQL deletes done jobs $1 of claims $2, when done jobs are not
// kept (RETAIN_DONE=0).
const DeleteDoneSQL = `
DELETE FROM {jobs} j
USING unnest($1::bigint[], $2::timestamptz[]) AS v(id, claimed_at)
WHERE j.id = ANY(ARRAY[v.id]) AND (j.status = 'running' AND j.locked_by = $3 AND j.updated_at = v.claimed_at) IS TRUE`

const (
	// MaxBatch is the most outcomes one statement writes.
	MaxBatch = 1000
	// finalFlushTimeout bounds the writes of the last outcomes at shutdown.
	finalFlushTimeout = 15 * time.Second
)

// Config configures a Completer. Every field is required but DeleteDone
// and Written.
type Config struct {
	Pool             *pgxpool.Pool
	PoolSize         int // the pool's MaxConns
	Schema           string
	Runs             *runstate.Tracker
	WorkerID         string
	DeleteDone       bool // delete done jobs rather than keep them
	StatementTimeout time.Duration
	Logger           *zap.Logger
	// Written, when set, hears of each batch written, and when its write
	// began and ended (for tracing).
	Written func(batch []runstate.Outcome, start, end time.Time)
	// Queue is the queue of the outcomes, and Limited, when set, says
	// whether it has flow limits: then each batch written tells the
	// workers that sleep on it (flow_ended, migration 017), since a job
	// that ended may let its key's next one start on another worker.
	Queue   string
	Limited func() bool
}

// Completer writes the outcomes the Tracker holds.
type Completer struct {
	cfg                        Config
	completeSQL, deleteDoneSQL string
	flowEndedSQL               string
	completed                  atomic.Int64
	sorted                     []runstate.Outcome // write's; see there
}

// New returns a Completer; run it with Run.
func New(cfg Config) *Completer {
	return &Completer{
		cfg: cfg, completeSQL: pinned.WithSchema(CompleteSQL, cfg.Schema),
		deleteDoneSQL: pinned.WithSchema(DeleteDoneSQL, cfg.Schema),
		flowEndedSQL:  "SELECT " + pgx.Identifier{cfg.Schema, "flow_ended"}.Sanitize() + "($1)",
	}
}

// Completed is how many outcomes were written.
func (c *Completer) Completed() int64 { return c.completed.Load() }

// Run writes outcomes as they come, in one statement per MaxBatch rows:
// the outcomes that came in while a write was under way go in the next.
// When ctx ends it writes what is left and returns.
func (c *Completer) Run(ctx context.Context) {
	for {
		select {
		case <-c.cfg.Runs.ToWrite():
			c.writeAll(ctx)
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalFlushTimeout)
			c.writeAll(final)
			cancel()
			if n := c.cfg.Runs.UnwrittenCount(); n > 0 {
				c.cfg.Logger.Error("outcomes not written at shutdown; the sweeper will rescue their jobs when their leases expire",
					zap.Int("num_outcomes", n))
			}
			return
		}
	}
}

// writeAll writes every unwritten outcome, retrying with backoff while the
// database fails, until ctx ends. A write under way is not cut short by
// ctx: each is bounded by StatementTimeout.
func (c *Completer) writeAll(ctx context.Context) {
	backoff := retry.New(c.cfg.PoolSize)
	for {
		batch := c.cfg.Runs.Unwritten(MaxBatch)
		if len(batch) == 0 {
			return
		}
		start := time.Now()
		err := c.write(context.WithoutCancel(ctx), batch)
		if err == nil {
			if c.cfg.Written != nil {
				c.cfg.Written(batch, start, time.Now())
			}
			backoff = retry.New(c.cfg.PoolSize)
			c.cfg.Runs.Written(len(batch))
			c.completed.Add(int64(len(batch)))
			continue
		}
		delay := backoff.Next(err)
		c.cfg.Logger.Warn("writing outcomes failed", zap.Error(err), zap.Int("num_outcomes", len(batch)),
			zap.Int("failures", backoff.Failures()), zap.Duration("retry_in", delay))
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// write writes one batch of outcomes: in one statement, or, when done jobs
// are deleted, the done ones in one and the others in another, each a
// transaction of its own, so that each locks its rows in id order.
func (c *Completer) write(ctx context.Context, batch []runstate.Outcome) error {
	// Sorted in a copy: batch is the Tracker's. The copy's array serves
	// every write (one goroutine writes).
	c.sorted = append(c.sorted[:0], batch...)
	defer clear(c.sorted) // its runs are the Tracker's to let go of
	batch = c.sorted
	slices.SortFunc(batch, func(a, b runstate.Outcome) int {
		return cmp.Or(cmp.Compare(a.Run.Job.ID, b.Run.Job.ID), a.Run.ClaimedAt.Compare(b.Run.ClaimedAt))
	})
	nDone := 0
	if c.cfg.DeleteDone {
		for _, o := range batch {
			if o.Verdict == runstate.Done {
				nDone++
			}
		}
	}
	done, rest := newColumns(nDone), newColumns(len(batch)-nDone)
	for _, o := range batch {
		if c.cfg.DeleteDone && o.Verdict == runstate.Done {
			done.add(o)
		} else {
			rest.add(o)
		}
	}
	var written int64
	if len(done.ids) > 0 {
		n, err := c.exec(ctx, c.deleteDoneSQL, done.ids, done.claims, c.cfg.WorkerID)
		if err != nil {
			return err
		}
		written += n
	}
	if len(rest.ids) > 0 {
		n, err := c.execWith(ctx, pinned.OutcomePlanSQL, c.completeSQL, rest.ids, rest.claims, rest.statuses, rest.delays, rest.errs, rest.releases,
			rest.entries, rest.results, rest.untils, c.cfg.WorkerID)
		if err != nil {
			return err
		}
		written += n
	}
	if written < int64(len(batch)) {
		c.cfg.Logger.Info("some outcomes were not written: their leases had been lost",
			zap.Int("num_outcomes", len(batch)), zap.Int64("num_written", written))
	}
	if written > 0 && c.cfg.Limited != nil && c.cfg.Limited() {
		// The outcomes are written: a failure here leaves the sleeping
		// workers to their own timers, and is not the write's.
		if _, err := c.exec(ctx, c.flowEndedSQL, []string{c.cfg.Queue}); err != nil {
			c.cfg.Logger.Warn("telling the queue's sleeping workers that its jobs ended failed", zap.Error(err))
		}
	}
	return nil
}

func (c *Completer) exec(ctx context.Context, sql string, args ...any) (int64, error) {
	return c.execWith(ctx, pinned.PlanSQL, sql, args...)
}

// execWith is exec after settings.
func (c *Completer) execWith(ctx context.Context, settings, sql string, args ...any) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.StatementTimeout)
	defer cancel()
	tag, err := pinned.ExecWith(ctx, c.cfg.Pool, settings, sql, args...)
	if err != nil {
		return 0, fmt.Errorf("record outcomes: %w", err)
	}
	return tag.RowsAffected(), nil
}

// columns are outcomes as the columns CompleteSQL unnests.
type columns struct {
	ids      []int64
	claims   []time.Time // ClaimedAt: the guard
	statuses []string
	delays   []float64
	errs     []*string
	releases []bool
	entries  []*string
	results  []*string
	untils   []*time.Time // nil: Delay from now
}

// newColumns makes room for n outcomes: the columns grown one outcome at a
// time were a seventh of the bytes a drain allocated (pprof).
func newColumns(n int) columns {
	if n == 0 {
		return columns{}
	}
	return columns{
		ids: make([]int64, 0, n), claims: make([]time.Time, 0, n), statuses: make([]string, 0, n),
		delays: make([]float64, 0, n), errs: make([]*string, 0, n), releases: make([]bool, 0, n),
		entries: make([]*string, 0, n), results: make([]*string, 0, n), untils: make([]*time.Time, 0, n),
	}
}

func (a *columns) add(o runstate.Outcome) {
	a.ids = append(a.ids, o.Run.Job.ID)
	a.claims = append(a.claims, o.Run.ClaimedAt)
	a.statuses = append(a.statuses, o.Status())
	a.delays = append(a.delays, o.Delay.Seconds())
	a.errs = append(a.errs, o.Err)
	a.releases = append(a.releases, o.GivesBack())
	a.entries = append(a.entries, o.Entry)
	a.results = append(a.results, o.Result)
	var until *time.Time
	if !o.Until.IsZero() {
		u := o.Until // not &o.Until, which moved every o to the heap
		until = &u
	}
	a.untils = append(a.untils, until)
}
