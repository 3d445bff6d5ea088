package claimer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
)

// warmHold bounds how long a warmed connection waits for the others before
// it goes back to the pool.
const warmHold = 100 * time.Millisecond

// warm readies, as the claimer starts, as many of the pool's connections as
// a busy claimer uses at once (one per held batch unless Hold is off, the
// claim's and the completer's), leaving at least one free for the claims it runs beside.
// On each it runs every statement of the claimer once, in a
// transaction it rolls back, with arguments that match no row: a claim of
// zero jobs, outcomes and leases of none.
//
// A statement's first run on a connection costs a round trip to prepare it
// and the planning of its generic plan (planSQL), and opening a connection
// costs a server process. Under load each was a stall of the whole claim
// loop: on a loaded machine, 8-15 ms to parse and 6-9 ms to plan a claim
// (log_min_duration_statement), and up to 50 ms for a new connection; a
// sustained run's slowest jobs were nearly all in its first half second
// (its p99 read 10.2 ms over the whole run, 4.8 ms after the first 0.5 s).
// Warmed, the first burst after a start runs on ready connections. It runs
// beside the first claims rather than before them: a worker started with
// jobs waiting (or the bench's first jobs) would otherwise wait for it, 26 ms
// for the six connections on the loaded machine.
//
// It is best effort: a failure (the database down, the pool in use by
// others) is logged at debug level and the claimer starts as it would have.
// The statements stay prepared while the pool keeps the connections, and
// the pool replaces them: pgxpool closes connections idle for
// MaxConnIdleTime (30 min by default; an idle worker's fallback ticks keep
// one or two in use) and those older than MaxConnLifetime (an hour), and a
// restarted server's connections die. Each comes back unprepared. So when
// a claim finds jobs and the pool has opened connections since the last
// warm-up ended (its NewConnsCount, read every poolReadEvery at most), the
// claimer warms the pool again, beside the burst, as at start. That
// warm-up (again) takes only the connections it can have without waiting:
// the idle ones and the room to open new ones. A busy pool's connections
// in use stay with the held batches and claims that use them.
func (c *Claimer) warm(ctx context.Context, again bool) {
	defer func() { c.warmedThrough.Store(c.cfg.Pool.Stat().NewConnsCount()) }()
	held := c.maxHeld
	if c.cfg.Hold < 0 {
		held = 0 // every claim leases: no held batch takes a connection
	}
	n := min(held+2, c.poolSize-1)
	if again {
		n = min(n, freeConns(c.cfg.Pool.Stat()))
	}
	if n <= 0 {
		return
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, c.cfg.StatementTimeout)
	defer cancel()
	// Each connection is held until all n are warmed, so that n acquires
	// take n connections and not the same one n times; but for warmHold at
	// most, so that claimers warming one pool at once (a worker of several
	// queues), or a pool busy elsewhere, never wait on each other for long.
	var (
		done sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	all := make(chan struct{}) // closed when every acquire has ended
	var left atomic.Int32
	left.Store(int32(n))
	for range n {
		done.Add(1)
		go func() {
			defer done.Done()
			conn, err := c.cfg.Pool.Acquire(ctx)
			if err == nil {
				err = c.warmConn(ctx, conn)
			}
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
			if left.Add(-1) == 0 {
				close(all)
			}
			if conn != nil {
				t := time.NewTimer(warmHold)
				select {
				case <-all:
				case <-t.C:
				}
				t.Stop()
				conn.Release()
			}
		}()
	}
	done.Wait()
	if err := errors.Join(errs...); err != nil {
		c.logger.Debug("warming connections failed; the first claims ready them instead", zap.Error(err))
		return
	}
	c.logger.Debug("connections warmed", zap.Int("num_conns", n), zap.Duration("took", time.Since(start)))
}

// freeConns is how many connections a pool hands out without waiting:
// its idle ones and the room to open more.
func freeConns(st *pgxpool.Stat) int {
	return int(st.IdleConns()) + max(int(st.MaxConns()-st.TotalConns()), 0)
}

// warmBeside runs warm in a goroutine of its own, which Run waits for,
// unless a warm-up is under way.
func (c *Claimer) warmBeside(ctx context.Context, again bool) {
	if !c.warming.CompareAndSwap(false, true) {
		return
	}
	c.warmWG.Add(1)
	go func() {
		defer c.warmWG.Done()
		defer c.warming.Store(false)
		c.warm(ctx, again)
	}()
}

// warmConn runs each statement of the claimer once on conn, in one round
// trip after pgx's own to prepare them, and rolls back.
func (c *Claimer) warmConn(ctx context.Context, conn *pgxpool.Conn) error {
	none := newOutcomeArrays(nil)
	batch := &pgx.Batch{}
	batch.Queue("BEGIN")
	batch.Queue(planSQL) // first: the statements after it get their generic plans
	batch.Queue(claimPlanSQL)
	batch.Queue(c.claimSQL, c.claimArgs(0)...)
	batch.Queue(c.heldClaimSQL, c.heldClaimArgs(0)...)
	batch.Queue(c.heldClaimPastSQL, c.heldClaimPastArgs(0, claimKey{})...)
	batch.Queue(c.heldCompleteSQL, c.heldCompleteArgs(none)...)
	batch.Queue(c.leaseHeldSQL, c.leaseHeldArgs(none.ids, none.attempts)...)
	batch.Queue(c.completeSQL, c.completeArgs(none)...)
	batch.Queue(c.heartbeatSQL, c.heartbeatArgs(none.ids)...)
	batch.Queue("ROLLBACK")
	if err := conn.SendBatch(ctx, batch).Close(); err != nil {
		return fmt.Errorf("warm a connection: %w", err)
	}
	return nil
}
