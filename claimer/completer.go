package claimer

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch/internal/retry"
)

// finalFlushTimeout bounds the writes of the last outcomes at shutdown.
const finalFlushTimeout = 15 * time.Second

// runCompleter writes outcomes as they come, each wake-up's worth in one
// statement per maxCompletionBatch rows. When ctx ends it writes what is left
// and returns.
func (c *Claimer) runCompleter(ctx context.Context) {
	for {
		select {
		case <-c.flush:
			c.flushPending(ctx)
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalFlushTimeout)
			c.flushPending(final)
			cancel()
			if n := c.pendingCount(); n > 0 {
				c.logger.Error("outcomes not written at shutdown; the sweeper will rescue their jobs when their leases expire",
					zap.Int("num_outcomes", n))
			}
			return
		}
	}
}

func (c *Claimer) pendingCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending)
}

// flushPending writes every pending outcome, retrying with backoff while the
// database fails, until ctx ends. A write under way is not cut short by ctx:
// each is bounded by StatementTimeout.
func (c *Claimer) flushPending(ctx context.Context) {
	backoff := retry.New(c.poolSize)
	for {
		c.mu.Lock()
		batch := c.pending[:min(len(c.pending), maxCompletionBatch)]
		c.mu.Unlock()
		if len(batch) == 0 {
			return
		}
		err := c.complete(context.WithoutCancel(ctx), batch)
		if err == nil {
			backoff = retry.New(c.poolSize)
			c.mu.Lock()
			c.pending = c.pending[len(batch):]
			for _, o := range batch {
				delete(c.inflight, o.run)
			}
			c.mu.Unlock()
			c.completed.Add(int64(len(batch)))
			signal(c.slotFreed) // a claimer held back by unwritten outcomes may go on
			continue
		}
		delay := backoff.Next(err)
		c.logger.Warn("writing outcomes failed", zap.Error(err), zap.Int("num_outcomes", len(batch)),
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

// complete writes one batch of outcomes in one statement.
func (c *Claimer) complete(ctx context.Context, batch []outcome) error {
	a := newOutcomeArrays(batch)
	ctx, cancel := context.WithTimeout(ctx, c.cfg.StatementTimeout)
	defer cancel()
	tag, err := c.execPinned(ctx, c.completeSQL, a.ids, a.attempts, a.statuses, a.delays, a.errs, a.releases,
		c.cfg.DeleteDone, c.cfg.WorkerID)
	if err != nil {
		return fmt.Errorf("record outcomes: %w", err)
	}
	if written := tag.RowsAffected(); !c.cfg.DeleteDone && written < int64(len(batch)) {
		c.logger.Info("some outcomes were not written: their leases had been lost",
			zap.Int("num_outcomes", len(batch)), zap.Int64("num_written", written))
	}
	return nil
}

// outcomeArrays are a batch of outcomes as the columns the outcome
// statements unnest.
type outcomeArrays struct {
	ids      []int64
	attempts []int32
	statuses []string
	delays   []float64
	errs     []*string
	releases []bool
}

func newOutcomeArrays(batch []outcome) outcomeArrays {
	n := len(batch)
	a := outcomeArrays{
		ids: make([]int64, n), attempts: make([]int32, n), statuses: make([]string, n),
		delays: make([]float64, n), errs: make([]*string, n), releases: make([]bool, n),
	}
	for i, o := range batch {
		a.ids[i], a.attempts[i], a.statuses[i] = o.run.job.ID, int32(o.run.job.Attempt), o.status //nolint:gosec // attempts stop at 1,000,000
		a.delays[i], a.errs[i], a.releases[i] = o.delay.Seconds(), o.err, o.release
	}
	return a
}
