package claimer

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch/internal/retry"
)

// finalFlushTimeout bounds the writes of the last outcomes at shutdown.
const finalFlushTimeout = 15 * time.Second

// runCompleter writes outcomes as they come, in one statement per
// maxCompletionBatch rows: the outcomes that came in while a write was under
// way go in the next. When ctx ends it writes what is left and returns.
func (c *Claimer) runCompleter(ctx context.Context) {
	for {
		select {
		case <-c.flush:
			c.writeOutcomes(ctx)
		case <-ctx.Done():
			final, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalFlushTimeout)
			c.writeOutcomes(final)
			cancel()
			if n := c.unwrittenCount(); n > 0 {
				c.logger.Error("outcomes not written at shutdown; the sweeper will rescue their jobs when their leases expire",
					zap.Int("num_outcomes", n))
			}
			return
		}
	}
}

func (c *Claimer) unwrittenCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.unwritten)
}

// flushPending writes every pending outcome, retrying with backoff while the
// database fails, until ctx ends. A write under way is not cut short by ctx:
// each is bounded by StatementTimeout.
func (c *Claimer) writeOutcomes(ctx context.Context) {
	backoff := retry.New(c.poolSize)
	for {
		c.mu.Lock()
		batch := c.unwritten[:min(len(c.unwritten), maxCompletionBatch)]
		c.mu.Unlock()
		if len(batch) == 0 {
			return
		}
		err := c.complete(context.WithoutCancel(ctx), batch)
		if err == nil {
			backoff = retry.New(c.poolSize)
			c.mu.Lock()
			c.unwritten = c.unwritten[len(batch):]
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

// complete writes one batch of outcomes: in one statement, or, when done
// jobs are deleted, the done ones in one and the others in another, each a
// transaction of its own, so that each locks its rows in id order.
func (c *Claimer) complete(ctx context.Context, batch []outcome) error {
	batch = slices.Clone(batch)
	slices.SortFunc(batch, func(a, b outcome) int {
		return cmp.Or(cmp.Compare(a.run.job.ID, b.run.job.ID), a.run.claimedAt.Compare(b.run.claimedAt))
	})
	var done, rest outcomeArrays
	for _, o := range batch {
		if c.cfg.DeleteDone && o.status == statusDone {
			done.add(o)
		} else {
			rest.add(o)
		}
	}
	var written int64
	if len(done.ids) > 0 {
		n, err := c.write(ctx, c.deleteDoneSQL, done.ids, done.claims, c.cfg.WorkerID)
		if err != nil {
			return err
		}
		written += n
	}
	if len(rest.ids) > 0 {
		n, err := c.write(ctx, c.completeSQL, rest.ids, rest.claims, rest.statuses, rest.delays, rest.errs, rest.releases,
			rest.entries, rest.results, c.cfg.WorkerID)
		if err != nil {
			return err
		}
		written += n
	}
	if written < int64(len(batch)) {
		c.logger.Info("some outcomes were not written: their leases had been lost",
			zap.Int("num_outcomes", len(batch)), zap.Int64("num_written", written))
	}
	return nil
}

func (c *Claimer) write(ctx context.Context, sql string, args ...any) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.StatementTimeout)
	defer cancel()
	tag, err := c.execPinned(ctx, sql, args...)
	if err != nil {
		return 0, fmt.Errorf("record outcomes: %w", err)
	}
	return tag.RowsAffected(), nil
}

// outcomeArrays are outcomes as the columns completeSQL unnests.
type outcomeArrays struct {
	ids      []int64
	claims   []time.Time // claimedAt: the guard
	statuses []string
	delays   []float64
	errs     []*string
	releases []bool
	entries  []*string
	results  []*string
}

func (a *outcomeArrays) add(o outcome) {
	a.ids = append(a.ids, o.run.job.ID)
	a.claims = append(a.claims, o.run.claimedAt)
	a.statuses = append(a.statuses, o.status)
	a.delays = append(a.delays, o.delay.Seconds())
	a.errs = append(a.errs, o.err)
	a.releases = append(a.releases, o.release)
	a.entries = append(a.entries, o.entry)
	a.results = append(a.results, o.result)
}
