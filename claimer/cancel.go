package claimer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// errJobCancelled is the cause of a running job's context when an
// operator cancelled the job.
var errJobCancelled = errors.New("the job was cancelled")

// errLeaseLost is the cause of a running job's context when the heartbeat
// found its row no longer running under this worker's claim: the sweeper
// gave it back (and it may have been claimed again since), or it was
// cancelled and the notice missed.
var errLeaseLost = errors.New("the job's row is no longer this worker's running attempt (its lease was lost, or it was cancelled)")

// Cancel is told that the jobs ids were cancelled (by cancel(), in
// SQL). Anyone may NOTIFY, so the claimer checks the rows of its runs of
// those jobs first, on a goroutine of its own (runCancelChecks): the runs
// whose rows no longer carry their claims under this worker have their
// contexts cancelled and their outcomes dropped. It returns how many of its runs
// the ids name; it does not block.
func (c *Claimer) Cancel(ids []int64) int {
	want := make(map[int64]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	n := 0
	c.mu.Lock()
	for r := range c.inflight {
		if !r.reported && r.cancelled == nil && want[r.job.ID] {
			c.toCheck[r] = true
			n++
		}
	}
	if c.claiming {
		for id := range want {
			if len(c.heard) >= maxHeard {
				c.heardMany = true
				break
			}
			c.heard[id] = true
		}
	}
	c.mu.Unlock()
	if n > 0 {
		signal(c.checkCancels)
	}
	return n
}

// CheckRuns has the rows of all the claimer's runs checked, as Cancel has
// those of the jobs it is told of: the worker calls it when its listener
// has connected again, since a cancel notice sent while it was away is
// lost. It does not block.
func (c *Claimer) CheckRuns() {
	n := 0
	c.mu.Lock()
	for r := range c.inflight {
		if !r.reported && r.cancelled == nil {
			c.toCheck[r] = true
			n++
		}
	}
	c.mu.Unlock()
	if n > 0 {
		signal(c.checkCancels)
	}
}

// maxHeard bounds the ids Cancel keeps while a claim is in flight: past it,
// a flood of notices (anyone may NOTIFY) has every run of the claim checked.
const maxHeard = 10000

// claimEnded is called, with mu held, as a claim ends, with its runs (none
// when it failed): those of jobs Cancel was told of while it was in flight
// are checked.
func (c *Claimer) claimEnded(runs []*run) (check bool) {
	for _, r := range runs {
		if c.heardMany || c.heard[r.job.ID] {
			c.toCheck[r] = true
			check = true
		}
	}
	c.claiming, c.heardMany = false, false
	clear(c.heard)
	return check
}

// runCancelChecks checks the jobs Cancel was told of, one batch at a time,
// until ctx ends: a burst of notices, or a flood of forged ones, costs one
// query at a time.
func (c *Claimer) runCancelChecks(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.checkCancels:
		}
		c.mu.Lock()
		runs := slices.Collect(maps.Keys(c.toCheck))
		clear(c.toCheck)
		c.mu.Unlock()
		if len(runs) == 0 {
			continue
		}
		sortRuns(runs)
		gone, err := c.notOwned(ctx, runs)
		if err != nil {
			// The heartbeat finds them within Lease/3.
			c.logger.Warn("checking cancelled jobs failed", zap.Error(err), zap.Int("num_jobs", len(runs)))
			continue
		}
		if n := c.cancelRuns(gone, errJobCancelled); n > 0 {
			c.logger.Info("running jobs cancelled", zap.Int("num_runs", n))
		}
	}
}

// notOwned returns those of runs whose rows no longer carry their claims
// under this worker.
func (c *Claimer) notOwned(ctx context.Context, runs []*run) ([]*run, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.StatementTimeout)
	defer cancel()
	ids, claims := runKeys(runs)
	rows, _ := c.cfg.Pool.Query(ctx, c.notOwnedSQL, ids, claims, c.cfg.WorkerID)
	gone, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("check cancelled jobs: %w", err)
	}
	return slices.Collect(maps.Keys(pick(runs, gone))), nil
}

// cancelRuns cancels those of runs that are not reported yet, with cause.
func (c *Claimer) cancelRuns(runs []*run, cause error) int {
	n := 0
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range runs {
		if r.reported || r.cancelled != nil {
			continue
		}
		r.cancelled, r.cancelledAt = cause, time.Now()
		if r.stop != nil {
			r.stop()
		}
		n++
	}
	return n
}
