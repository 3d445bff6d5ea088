// Package lease keeps a claimer's claims: a heartbeat renews the leases of
// its runs every Lease/3, and at once when asked (a cancel notice, a
// listener's reconnect). A run whose row it did not renew is no longer
// this worker's attempt, and is stopped.
package lease

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch/claimer/internal/pinned"
	"github.com/pgdispatch/pgdispatch/claimer/internal/runstate"
	"github.com/pgdispatch/pgdispatch/internal/retry"
)

// SQL extends the leases of this worker's running jobs $1 of claims $2,
// and returns the positions (from 1) in $1 of those it renewed. Its rows
// are found and guarded as the completer's are (see the completer's
// package doc), so it locks them in id order. A job claimed twice here
// (its first lease lost, then claimed again) is renewed for the claim its
// row carries, and only for that one.
const SQL = `
UPDATE {jobs} j SET locked_until = now() + make_interval(secs => $4::float8)
FROM unnest($1::bigint[], $2::timestamptz[]) WITH ORDINALITY AS v(id, claimed_at, n)
WHERE j.id = ANY(ARRAY[v.id]) AND (j.status = 'running' AND j.locked_by = $3 AND j.updated_at = v.claimed_at) IS TRUE
RETURNING v.n`

// Config configures a Heartbeat. Every field is required.
type Config struct {
	Pool             *pgxpool.Pool
	PoolSize         int // the pool's MaxConns
	Schema           string
	Runs             *runstate.Tracker
	WorkerID         string
	Lease            time.Duration
	StatementTimeout time.Duration
	Logger           *zap.Logger
}

// Heartbeat renews the leases of a claimer's runs.
type Heartbeat struct {
	cfg Config
	sql string
	now chan struct{} // capacity 1: Beat
}

// New returns a Heartbeat; run it with Run.
func New(cfg Config) *Heartbeat {
	return &Heartbeat{cfg: cfg, sql: pinned.WithSchema(SQL, cfg.Schema), now: make(chan struct{}, 1)}
}

// Beat asks for a heartbeat now, to find at once the runs whose rows are
// no longer theirs. It never blocks; asks that come while one is pending
// fold into it, and one that comes during a heartbeat makes another.
func (h *Heartbeat) Beat() { runstate.Signal(h.now) }

// Run renews the leases every Lease/3, and when Beat asks, until ctx ends.
// A run whose row it did not renew is no longer this worker's attempt (an
// operator cancelled it, its lease was lost to the sweeper, or the job was
// claimed again since): it is stopped, and its outcome will be dropped.
// onBeat, when set, hears how many leases each heartbeat renewed.
func (h *Heartbeat) Run(ctx context.Context, onBeat func(renewed int64)) {
	t := time.NewTicker(max(h.cfg.Lease/3, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-h.now:
		}
		runs := h.cfg.Runs.Inflight()
		if len(runs) == 0 {
			continue
		}
		if renewed, ok := h.renew(ctx, runs); ok && onBeat != nil {
			onBeat(int64(renewed))
		}
	}
}

// renew runs one heartbeat for runs, stops those it did not renew, and
// returns how many it renewed, and false when it failed. A heartbeat that
// meets a dead connection is tried again at once, as a claim is
// (retry.Backoff): while every slot is busy with long jobs, nothing else
// uses the pool, and after a restart or a mass termination each of its
// idle connections is dead. One dead connection per tick would let the
// leases lapse after three (Lease/3 apart), and the sweeper would hand the
// running jobs to another worker. Any other failure waits for the next
// tick, within the lease.
func (h *Heartbeat) renew(ctx context.Context, runs []*runstate.Run) (int, bool) {
	backoff := retry.New(h.cfg.PoolSize)
	ids := make([]int64, len(runs))
	claims := make([]time.Time, len(runs))
	for i, r := range runs {
		ids[i], claims[i] = r.Job.ID, r.ClaimedAt
	}
	for {
		callCtx, cancel := context.WithTimeout(ctx, h.cfg.StatementTimeout)
		results := pinned.Send(callCtx, h.cfg.Pool, pinned.PlanSQL, h.sql, ids, claims, h.cfg.WorkerID, h.cfg.Lease.Seconds())
		positions, err := readPositions(results)
		if err == nil {
			// The rows say which runs are no longer theirs whether or not
			// the renewal commits: they stop now, not after its WAL flush.
			h.stop(runs, positions)
		}
		if closeErr := results.Close(); err == nil {
			err = closeErr
		}
		cancel()
		if err == nil {
			return len(positions), true
		}
		if ctx.Err() != nil {
			return 0, false
		}
		again := backoff.Next(err) == 0
		h.cfg.Logger.Warn("heartbeat failed", zap.Error(err), zap.Int("num_jobs", len(ids)),
			zap.Int("failures", backoff.Failures()), zap.Bool("retry_now", again))
		if !again {
			return 0, false
		}
	}
}

// readPositions reads the settings' result, then the positions (from 1)
// of the leases the heartbeat renewed.
func readPositions(results pgx.BatchResults) ([]int64, error) {
	if _, err := results.Exec(); err != nil {
		return nil, err
	}
	rows, err := results.Query()
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[int64])
}

// stop stops those of runs that are not at positions, the renewed ones.
func (h *Heartbeat) stop(runs []*runstate.Run, positions []int64) {
	if len(positions) == len(runs) {
		return
	}
	renewed := make([]bool, len(runs))
	for _, n := range positions {
		if n >= 1 && n <= int64(len(runs)) {
			renewed[n-1] = true
		}
	}
	gone := make([]*runstate.Run, 0, len(runs)-len(positions))
	for i, r := range runs {
		if !renewed[i] {
			gone = append(gone, r)
		}
	}
	cancelled, lost := h.cfg.Runs.Stop(gone)
	if cancelled > 0 {
		h.cfg.Logger.Info("running jobs cancelled", zap.Int("num_runs", cancelled))
	}
	if lost > 0 {
		h.cfg.Logger.Warn("the heartbeat found jobs no longer this worker's: their runs are cancelled",
			zap.Int("num_runs", lost))
	}
}
