package claimer

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/retry"
)

// claim takes up to limit due jobs, leases them, and starts them on jobs.
func (c *Claimer) claim(ctx context.Context, limit int, jobs *runners) claimResult {
	r := claimResult{limit: limit}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.StatementTimeout)
	defer cancel()
	c.claims.Add(1)
	c.mu.Lock()
	c.claiming = true
	c.mu.Unlock()
	results := c.sendPinned(ctx, claimPlanSQL, c.claimSQL,
		c.cfg.Queue, limit, c.cfg.WorkerID, c.cfg.Lease.Seconds(), c.cfg.MaxAttempts, c.cfg.ClaimBytes)
	runs, err := c.readClaim(results, &r)
	// Close reads the end of the transaction: only a committed claim runs.
	if closeErr := results.Close(); err == nil && closeErr != nil {
		err = fmt.Errorf("claim jobs: %w", closeErr)
	}
	if err != nil {
		runs = nil
	}
	c.mu.Lock()
	c.executing += len(runs)
	for _, run := range runs {
		c.inflight[run] = struct{}{}
	}
	check := c.claimEnded(runs)
	c.mu.Unlock()
	if check {
		signal(c.checkCancels)
	}
	if err != nil {
		return claimResult{limit: limit, err: err}
	}
	r.claimed = len(runs)
	if r.claimed == 0 {
		return r
	}
	c.claimed.Add(int64(r.claimed))
	c.logger.Debug("claimed jobs", zap.Int("num_claimed", r.claimed))
	for _, run := range runs {
		jobs.start(run)
	}
	return r
}

// sendPinned sends settings (planSQL or claimPlanSQL) and then sql, in one
// round trip and one transaction. Read the settings' result first.
func (c *Claimer) sendPinned(ctx context.Context, settings, sql string, args ...any) pgx.BatchResults {
	batch := &pgx.Batch{}
	batch.Queue(settings)
	batch.Queue(sql, args...)
	return c.cfg.Pool.SendBatch(ctx, batch)
}

// execPinned runs sql after planSQL, as sendPinned, and returns its tag once
// the transaction has committed.
func (c *Claimer) execPinned(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	results := c.sendPinned(ctx, planSQL, sql, args...)
	_, err := results.Exec()
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = results.Exec()
	}
	if closeErr := results.Close(); err == nil {
		err = closeErr
	}
	return tag, err
}

// readClaim reads a claim's results: the settings', then the claimed jobs,
// and into r the wait until the next run_at, whether due rows were skipped
// and whether the queue is paused.
func (c *Claimer) readClaim(results pgx.BatchResults, r *claimResult) ([]*run, error) {
	if _, err := results.Exec(); err != nil {
		return nil, fmt.Errorf("claim jobs: %w", err)
	}
	rows, err := results.Query()
	if err != nil {
		return nil, fmt.Errorf("claim jobs: %w", err)
	}
	defer rows.Close()
	var claimed []*run
	// Value types, not pointers: a pointer per column and row was a tenth
	// of the worker's CPU in a drain (pprof). Only the row of a claim that
	// found nothing has NULLs.
	var (
		id                   pgtype.Int8
		kind                 pgtype.Text
		priority             pgtype.Int2
		attempt, maxAttempts pgtype.Int4
		runAt, createdAt     pgtype.Timestamptz
		claimedAt            pgtype.Timestamptz
		nextIn               pgtype.Float8
		stranded, paused     pgtype.Bool
		payload              []byte
	)
	for rows.Next() {
		payload = nil // a new slice per row: the scan would reuse the last one
		if err := rows.Scan(&id, &kind, &payload, &priority, &attempt, &maxAttempts, &runAt, &createdAt,
			&claimedAt, &nextIn, &stranded, &paused); err != nil {
			return nil, fmt.Errorf("claim jobs: scan: %w", err)
		}
		if nextIn.Valid {
			d := scheduleWait(nextIn.Float64)
			r.next = &d
		}
		r.stranded = stranded.Valid && stranded.Bool
		r.paused = paused.Valid && paused.Bool
		if !id.Valid {
			continue // the one row of a claim that found nothing
		}
		claimed = append(claimed, &run{claimedAt: claimedAt.Time, job: &executors.Job{
			ID: id.Int64, Queue: c.cfg.Queue, Kind: kind.String, Payload: payload, Priority: priority.Int16,
			Attempt: int(attempt.Int32), MaxAttempts: int(maxAttempts.Int32), RunAt: runAt.Time, CreatedAt: createdAt.Time,
		}})
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claim jobs: %w", err)
	}
	return claimed, nil
}

// scheduleWait turns the seconds until the earliest future run_at into a
// wait, capped at maxScheduleWait: a job due in the year 9999 is further
// away than a time.Duration reaches, and the conversion would overflow to a
// negative wait, a claim every millisecond. The fallback tick comes sooner
// than the cap anyway.
func scheduleWait(seconds float64) time.Duration {
	if !(seconds < maxScheduleWait.Seconds()) { // also NaN
		return maxScheduleWait
	}
	return time.Duration(seconds * float64(time.Second))
}

// runHeartbeat renews the leases of this claimer's jobs every Lease/3.
// A run whose row it did not renew is no longer this worker's attempt (an
// operator cancelled it and the notice was missed, its lease was lost to
// the sweeper, or the job was claimed again since): its context is
// cancelled and its outcome dropped.
func (c *Claimer) runHeartbeat(ctx context.Context, onBeat func(renewed int64)) {
	t := time.NewTicker(max(c.cfg.Lease/3, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		runs := c.inflightRuns()
		if len(runs) == 0 {
			continue
		}
		renewed, ok := c.renewLeases(ctx, runs)
		if !ok {
			continue
		}
		if len(renewed) < len(runs) {
			lost := slices.DeleteFunc(slices.Clone(runs), func(r *run) bool { return renewed[r] })
			if n := c.cancelRuns(lost, errLeaseLost); n > 0 {
				c.logger.Warn("the heartbeat found jobs no longer this worker's: their runs are cancelled",
					zap.Int("num_runs", n))
			}
		}
		if onBeat != nil {
			onBeat(int64(len(renewed)))
		}
	}
}

// renewLeases runs one heartbeat for runs and returns those it renewed,
// and false when it failed. A heartbeat that meets a dead connection is
// tried again at once, as a claim is (retry.Backoff): while every slot is
// busy with long jobs, nothing else uses the pool, and after a restart or a
// mass termination each of its idle connections is dead. One dead
// connection per tick would let the leases lapse after three (Lease/3
// apart), and the sweeper would hand the running jobs to another worker.
// Any other failure waits for the next tick, within the lease.
func (c *Claimer) renewLeases(ctx context.Context, runs []*run) (map[*run]bool, bool) {
	backoff := retry.New(c.poolSize)
	ids, claims := runKeys(runs)
	for {
		callCtx, cancel := context.WithTimeout(ctx, c.cfg.StatementTimeout)
		renewed, err := c.heartbeat(callCtx, ids, claims)
		cancel()
		if err == nil {
			return pick(runs, renewed), true
		}
		if ctx.Err() != nil {
			return nil, false
		}
		again := backoff.Next(err) == 0
		c.logger.Warn("heartbeat failed", zap.Error(err), zap.Int("num_jobs", len(ids)),
			zap.Int("failures", backoff.Failures()), zap.Bool("retry_now", again))
		if !again {
			return nil, false
		}
	}
}

// heartbeat sends one heartbeat, after planSQL, and returns the positions
// (from 1) of the claims it renewed once the transaction has committed.
func (c *Claimer) heartbeat(ctx context.Context, ids []int64, claims []time.Time) ([]int64, error) {
	results := c.sendPinned(ctx, planSQL, c.heartbeatSQL, ids, claims, c.cfg.WorkerID, c.cfg.Lease.Seconds())
	var renewed []int64
	_, err := results.Exec()
	if err == nil {
		var rows pgx.Rows
		rows, err = results.Query()
		if err == nil {
			renewed, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		}
	}
	if closeErr := results.Close(); err == nil {
		err = closeErr
	}
	return renewed, err
}

// inflightRuns are the runs this claimer holds, in the order of their jobs'
// ids, then of their claims: the heartbeat locks their rows in id order. A
// job may run twice at once here, when its lease was lost and it was
// claimed again; only its row's claim is still its attempt.
func (c *Claimer) inflightRuns() []*run {
	c.mu.Lock()
	runs := make([]*run, 0, len(c.inflight))
	for r := range c.inflight {
		runs = append(runs, r)
	}
	c.mu.Unlock()
	sortRuns(runs)
	return runs
}

func sortRuns(runs []*run) {
	slices.SortFunc(runs, func(a, b *run) int {
		return cmp.Or(cmp.Compare(a.job.ID, b.job.ID), a.claimedAt.Compare(b.claimedAt))
	})
}

// runKeys are the jobs' ids and claims of runs, as the statements take them.
func runKeys(runs []*run) ([]int64, []time.Time) {
	ids := make([]int64, len(runs))
	claims := make([]time.Time, len(runs))
	for i, r := range runs {
		ids[i], claims[i] = r.job.ID, r.claimedAt
	}
	return ids, claims
}

// pick is the runs at positions (from 1), as a statement returns them.
func pick(runs []*run, positions []int64) map[*run]bool {
	out := make(map[*run]bool, len(positions))
	for _, n := range positions {
		if n >= 1 && n <= int64(len(runs)) {
			out[runs[n-1]] = true
		}
	}
	return out
}
