package claimer

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"golang.org/x/sync/semaphore"

	"github.com/pgdispatch/pgdispatch/executors"
)

// maxHeld is how many held batches a claimer keeps open at once, each on a
// connection of its own; its HeldLimit may allow fewer. Past it, claims
// lease their jobs. In 100,000-job drains (100 slots) a cap of 2 left a
// fifth of the claims leased, and drained 60,000 jobs/s against 66,000–68,000
// with 4, which held all but the first. 5 against 4, in 17 alternated
// pairs of drains over two sessions: 3–9 % more jobs/s on average with
// done jobs deleted, 4–14 % with them kept; 7 against 5, in 14 pairs: 8 %
// and 3 %, 9 pairs of 14 won each way. All within the machine's noise
// (docs/performance.md).
const maxHeld = 7

// HeldLimit bounds how many held batches the claimers that share it keep
// open at once. Each holds a pool connection for up to Hold, and the rest
// of the worker needs connections of the same pool: each queue one for its
// leased claims and one for its completer, and one more for the heartbeats
// and the sweeper (HeldLimitFor). So one busy queue on the default pool of
// 10 may hold 7 batches, and two busy queues 5 between them. Safe for
// concurrent use.
type HeldLimit struct {
	sem *semaphore.Weighted
	n   int
}

// NewHeldLimit returns a limit of n held batches, at least one.
func NewHeldLimit(n int) *HeldLimit {
	n = max(n, 1)
	return &HeldLimit{sem: semaphore.NewWeighted(int64(n)), n: n}
}

// HeldLimitFor is the limit for a worker of queues queues on a pool of
// poolSize connections: the pool less one connection for the heartbeats and
// the sweeper and two per queue, one for its leased claims and one for its
// completer. At least one.
func HeldLimitFor(poolSize, queues int) *HeldLimit {
	return NewHeldLimit(poolSize - 1 - 2*queues)
}

func (l *HeldLimit) tryAcquire() bool { return l.sem.TryAcquire(1) }
func (l *HeldLimit) release()         { l.sem.Release(1) }

// A held batch is a claim whose transaction stays open while its jobs run.
//
// The leased claim writes every job twice: once to mark it running under a
// lease, once for its outcome. Each write is a new row version with its
// index entries, and that was most of a drain's database time (about 20 µs a
// job of the server's CPU; docs/performance.md). A held claim only locks its
// rows (FOR UPDATE SKIP LOCKED, which other claimers step over) and writes
// each outcome in the same transaction, which then commits once: the
// database does less than half the work per job.
//
// The lock is the lease. A worker that dies loses its connection, the server
// rolls the transaction back, and the jobs are due again at once; the next
// claim finds the lost lock's mark on them and counts the attempt that was
// not written (lostSQL). Jobs still running when Hold ends are leased in that
// transaction (status running, a lease, the attempt counted, as the leased
// claim would have done), the outcomes in so far are written, and it
// commits; from then on the heartbeat and the completer take over. So a
// transaction stays open for Hold at most, and a long job holds no
// transaction back.
//
// Que holds a job for its whole run in the same way, with an advisory lock;
// here the hold is bounded by Hold, and a lease takes over.
type heldBatch struct {
	conn *pgxpool.Conn
	runs []*running

	// Guarded by the claimer's mu. A batch is held, then ending (its commit
	// is under way), then leased.
	//
	// The outcomes of a batch that is committing wait for its end. Sent to
	// the completer at once, they would find their rows still pending
	// (completeSQL writes, and locks, only this worker's running rows) and
	// be dropped, and their jobs, leased a moment later, would wait for the
	// sweeper. After the commit they go to the completer whether it
	// committed or not: when the transaction is gone, the rows are pending
	// again and not this worker's, so the completer and the heartbeat leave
	// them, and the lost claim's mark, alone; when the server committed and
	// only its answer was lost, the jobs are leased, and their outcomes are
	// written as any others.
	outcomes []outcome     // reported while held, one per run at most
	done     chan struct{} // closed when every run has reported while held
	ending   bool          // Hold ended: outcomes wait in late for the commit
	late     []outcome     // reported while the batch commits
	leased   bool          // committed, or failed to: outcomes go to the completer
}

// resumeFront bounds how long held claims may start past the front of the
// queue (resume): at least this often a claim looks at it from the front.
const resumeFront = 10 * time.Millisecond

// claimKey is a job's place in the claim order: priority, run_at, id.
type claimKey struct {
	priority int16
	runAt    time.Time
	id       int64
}

func (k claimKey) less(o claimKey) bool {
	if k.priority != o.priority {
		return k.priority < o.priority
	}
	if !k.runAt.Equal(o.runAt) {
		return k.runAt.Before(o.runAt)
	}
	return k.id < o.id
}

// resume is where a held claim in a backlog starts. Every claim scans the
// queue in claim order from its front, and each row it meets that another
// transaction holds costs a lock tried and skipped. In a backlog the first
// rows are this claimer's own: its held batches are still open, committing
// (two or three batches of 100 at each claim of a drain). So a held claim that
// follows a full claim (the queue had more jobs than free slots) while a
// held batch is still open starts past the last row that claim took.
//
// The rows it passes over are those of its open batches, and any that a
// claim from the front would have taken first: a job of a higher priority
// enqueued meanwhile, a job given back by a worker whose claim was lost,
// one whose transaction committed after the claim but began before it (its
// run_at is its transaction's start). Those wait for the next claim from
// the front, which comes at least every resumeFront, or as soon as a claim
// comes back short of its limit or no batch is open: a backlog delays
// them by resumeFront at most, and outside a backlog nothing changes.
type resume struct {
	from    claimKey  // the last row the last full claim took
	full    bool      // the last claim came back full: from is set
	frontAt time.Time // when the last claim from the front started
}

// next returns where the next held claim starts at now, or nil for the
// front of the queue. open reports whether a held batch is still open.
func (r *resume) next(open bool, now time.Time) *claimKey {
	if !r.full || !open || now.Sub(r.frontAt) >= resumeFront {
		return nil
	}
	return &r.from
}

// claimed records a claim, started at started from from (nil: the front),
// that took runs of up to limit jobs; err is its error.
func (r *resume) claimed(from *claimKey, started time.Time, runs []*running, limit int, err error) {
	if from == nil {
		r.frontAt = started
	}
	r.full = err == nil && limit > 0 && len(runs) == limit
	if !r.full {
		return
	}
	for i, run := range runs {
		k := claimKey{priority: run.job.Priority, runAt: run.job.RunAt, id: run.job.ID}
		if i == 0 || r.from.less(k) {
			r.from = k
		}
	}
}

// claimHeld claims up to limit due jobs in a held batch, from the front of
// the queue, or past from when it is not nil (resume). A batch that claims
// nothing ends its transaction before it returns. It is called with a place
// in the HeldLimit taken (mayHold): the batch keeps it until it ends, and
// a claim that opens none gives it back.
func (c *Claimer) claimHeld(ctx context.Context, limit int, from *claimKey) ([]*running, *time.Duration, error) {
	opened := false
	defer func() {
		if !opened {
			c.cfg.HeldLimit.release()
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, c.cfg.StatementTimeout)
	defer cancel()
	conn, err := c.cfg.Pool.Acquire(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("claim jobs: %w", err)
	}
	c.claims.Add(1)
	batch := &pgx.Batch{}
	batch.Queue("BEGIN")
	batch.Queue(planSQL)
	if from == nil {
		batch.Queue(c.heldClaimSQL, c.heldClaimArgs(limit)...)
	} else {
		c.pastClaims.Add(1)
		batch.Queue(c.heldClaimPastSQL, c.heldClaimPastArgs(limit, *from)...)
	}
	results := conn.SendBatch(ctx, batch)
	_, err = results.Exec()
	var (
		jobs []*executors.Job
		lost []bool
		next *time.Duration
	)
	if err == nil {
		jobs, next, err = c.readClaim(results, &lost)
	} else {
		err = fmt.Errorf("claim jobs: %w", err)
	}
	if closeErr := results.Close(); err == nil && closeErr != nil {
		err = fmt.Errorf("claim jobs: %w", closeErr)
	}
	switch {
	case err == nil && len(jobs) == 0:
		_, err = conn.Exec(ctx, "ROLLBACK")
	case err == nil && slices.Contains(lost, true):
		// A lost row: lease the batch before any of it runs (heldClaimSQL).
		if err = c.commitHeld(ctx, conn, nil, jobs); err == nil {
			conn.Release()
			c.logger.Info("a claim found jobs whose earlier held claim was lost: leased, the lost attempt counted",
				zap.Int("num_claimed", len(jobs)))
			return c.track(jobs, nil), next, nil
		}
	}
	if err != nil || len(jobs) == 0 {
		conn.Release() // a connection left in a transaction is closed, not reused
		if err != nil {
			return nil, nil, err
		}
		return nil, next, nil
	}

	b := &heldBatch{conn: conn, done: make(chan struct{})}
	b.runs = c.track(jobs, b)
	opened = true
	c.heldClaims.Add(1)
	c.heldWG.Add(1)
	go c.hold(b)
	c.logger.Debug("claimed jobs, held", zap.Int("num_claimed", len(jobs)))
	return b.runs, next, nil
}

// hold waits for every job of b to report, or for Hold, then writes what
// came in, leases the rest and commits.
func (c *Claimer) hold(b *heldBatch) {
	defer c.heldWG.Done()
	t := time.NewTimer(c.cfg.Hold)
	select {
	case <-b.done:
	case <-t.C:
	}
	t.Stop()

	c.mu.Lock()
	b.ending = true
	outcomes := b.outcomes
	var lease []*executors.Job
	for _, r := range b.runs {
		if !r.reported {
			lease = append(lease, r.job)
		}
	}
	c.mu.Unlock()

	ctx, cancel := context.WithTimeout(c.baseCtx, c.cfg.StatementTimeout)
	err := c.commitHeld(ctx, b.conn, outcomes, lease)
	cancel()
	b.conn.Release()

	c.mu.Lock()
	for _, o := range outcomes {
		if r := c.inflight[o.id]; r != nil && r.held == b {
			delete(c.inflight, o.id)
		}
	}
	late := b.late
	b.late, b.leased = nil, true
	c.pending = append(c.pending, late...)
	c.held--
	c.cfg.HeldLimit.release()
	c.mu.Unlock()
	if len(late) > 0 {
		signal(c.flush)
	}
	if err != nil {
		// The transaction is gone, and with it the claim: every job of the
		// batch is pending again and runs again, and the claim that takes it
		// counts this attempt (lostSQL).
		c.logger.Warn("a held batch could not commit: its jobs will run again", zap.Error(err),
			zap.Int("num_outcomes", len(outcomes)), zap.Int("num_running", len(lease)))
		return
	}
	c.completed.Add(int64(len(outcomes)))
	if len(lease) > 0 {
		c.leasedLate.Add(int64(len(lease)))
		c.logger.Debug("held jobs outlived the hold: leased", zap.Int("num_leased", len(lease)))
	}
}

// commitHeld writes a held batch's outcomes, leases its jobs in lease and
// commits, in one round trip.
func (c *Claimer) commitHeld(ctx context.Context, conn *pgxpool.Conn, outcomes []outcome, lease []*executors.Job) error {
	batch := &pgx.Batch{}
	if len(outcomes) > 0 {
		a := newOutcomeArrays(outcomes)
		batch.Queue(c.heldCompleteSQL, c.heldCompleteArgs(a)...)
	}
	if n := len(lease); n > 0 {
		ids, attempts := make([]int64, n), make([]int32, n)
		for i, j := range lease {
			ids[i], attempts[i] = j.ID, int32(j.Attempt)
		}
		batch.Queue(c.leaseHeldSQL, c.leaseHeldArgs(ids, attempts)...)
	}
	batch.Queue("COMMIT")
	if err := conn.SendBatch(ctx, batch).Close(); err != nil {
		return fmt.Errorf("commit held jobs: %w", err)
	}
	if st := conn.Conn().PgConn().TxStatus(); st != 'I' {
		return fmt.Errorf("commit held jobs: the transaction did not commit (status %q)", st)
	}
	return nil
}
