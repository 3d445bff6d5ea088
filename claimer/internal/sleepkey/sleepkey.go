// Package sleepkey holds a queue's sleep key for its claimer, on a
// connection of its own.
//
// The sleep key is the handshake that lets writers skip NOTIFY while no
// worker sleeps (migrations 003, 007 and 009 have the writer's side). A claimer that has
// found its queue empty asks for the key exclusively; the request waits for
// every writer that holds it shared, so once it is granted their rows are
// visible, and the claimer looks once more before it sleeps. It keeps the key
// while it sleeps, so writers notify, and gives it back as soon as a claim
// finds work. Peers that want to sleep while one holds the key wait in the
// lock's queue and take over when it wakes, exits or dies.
package sleepkey

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch/internal/retry"
	"github.com/pgdispatch/pgdispatch/migrations"
)

const (
	// The key of queue $2: $1 is the schema's half, migrations.SleepKey,
	// which migration 007 writes into the triggers as a literal.
	lockKeySQL   = `$1::int4, hashtext($2)`
	sleepLockSQL = `SELECT pg_advisory_lock(` + lockKeySQL + `)`
	sleepFreeSQL = `SELECT pg_advisory_unlock(` + lockKeySQL + `)`

	// sleepLockWait bounds one wait for the key. A wait that times out (a
	// writer kept its transaction open that long, or a peer slept that long)
	// makes the claimer look at the queue and ask again.
	sleepLockWait = 5 * time.Minute
	// maxSleepRetry bounds the pause between tries to take the key while
	// the database cannot be reached.
	maxSleepRetry = time.Second
)

// Lock holds a queue's sleep key while its claimer sleeps, on a
// connection of its own. Create it with New and run it with Run.
type Lock struct {
	connConfig *pgx.ConnConfig
	schemaKey  int32 // migrations.SleepKey of the schema
	queue      string
	timeout    time.Duration // bounds connecting and giving the key back
	logger     *zap.Logger
	recheck    chan struct{} // capacity 1: see Recheck

	poke chan struct{} // capacity 1: want changed

	mu       sync.Mutex
	want     bool
	stopHold context.CancelFunc // ends holding; nil while not holding
	holding  atomic.Bool
}

// New returns a Lock of queue of schema, on connections of cfg.
func New(cfg *pgx.ConnConfig, schema, queue string, timeout time.Duration, logger *zap.Logger) *Lock {
	cc := cfg.Copy()
	// The wait for the key is bounded by the server, so that the connection
	// survives a timeout. The statement timeout is only a backstop.
	cc.RuntimeParams["lock_timeout"] = strconv.FormatInt(sleepLockWait.Milliseconds(), 10)
	cc.RuntimeParams["statement_timeout"] = strconv.FormatInt((sleepLockWait + timeout).Milliseconds(), 10)
	if app := cc.RuntimeParams["application_name"]; app != "" {
		cc.RuntimeParams["application_name"] = app + "-sleep"
	}
	return &Lock{
		connConfig: cc, schemaKey: migrations.SleepKey(schema), queue: queue, timeout: timeout, logger: logger,
		recheck: make(chan struct{}, 1), poke: make(chan struct{}, 1),
	}
}

// Request asks for the key. It never blocks: the claimer hears on Recheck
// when the key is granted.
func (s *Lock) Request() { s.set(true) }

// Release gives the key back, or gives up on taking it. It never blocks.
func (s *Lock) Release() { s.set(false) }

// Recheck is signalled when the claimer must look at the queue again: the
// key was granted (Holding then reports true), or lost, or a wait for it
// ended without it.
func (s *Lock) Recheck() <-chan struct{} { return s.recheck }

// Holding reports whether the key is held.
func (s *Lock) Holding() bool { return s.holding.Load() }

func (s *Lock) set(want bool) {
	s.mu.Lock()
	changed := s.want != want
	s.want = want
	if !want && s.stopHold != nil {
		s.stopHold()
	}
	s.mu.Unlock()
	if changed {
		notify(s.poke)
	}
}

func (s *Lock) wanted() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.want
}

// Run takes and gives back the key as the claimer asks until ctx ends, then
// closes its connection, which gives the key back to the server.
func (s *Lock) Run(ctx context.Context) {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			s.drop(ctx, conn)
		}
	}()
	// Connected at once, not at the first sleep: a new connection is a new
	// server process, and a job committed while the claimer goes to sleep
	// waits for the key's grant (tens of milliseconds on a loaded machine,
	// the bench's latency scenario). A failure here is retried when the key
	// is wanted.
	conn, _ = s.connect(ctx)
	failures := 0
	for ctx.Err() == nil {
		if !s.wanted() {
			select {
			case <-ctx.Done():
			case <-s.poke:
			}
			continue
		}
		if conn == nil {
			var err error
			conn, err = s.connect(ctx)
			if err != nil {
				failures++
				s.fail(ctx, "connect for the sleep lock failed", err, failures)
				continue
			}
		}
		if _, err := conn.Exec(ctx, sleepLockSQL, s.schemaKey, s.queue); err != nil {
			if ctx.Err() != nil {
				return
			}
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_not_available: the wait timed out
				notify(s.recheck)
				continue
			}
			conn = s.drop(ctx, conn)
			failures++
			s.fail(ctx, "taking the sleep lock failed", err, failures)
			continue
		}
		failures = 0
		if !s.hold(ctx, conn) {
			conn = s.drop(ctx, conn)
			if ctx.Err() == nil {
				s.logger.Warn("sleep lock connection lost; looking at the queue and taking it again")
				notify(s.recheck)
			}
		}
	}
}

// hold keeps the key until the claimer wakes or ctx ends, then gives it
// back. It reports false when the connection, and with it the key, was lost.
func (s *Lock) hold(ctx context.Context, conn *pgx.Conn) bool {
	holdCtx, stop := context.WithCancel(ctx)
	defer stop()
	s.mu.Lock()
	if s.want {
		s.stopHold = stop
	} else {
		stop() // woken while the request waited
	}
	s.mu.Unlock()
	if holdCtx.Err() == nil {
		// Granted while the claimer still sleeps: it looks once more.
		s.holding.Store(true)
		notify(s.recheck)
		// Nothing is sent on this connection: the wait returns when the
		// claimer wakes, or when the connection dies.
		_ = conn.PgConn().WaitForNotification(holdCtx)
		s.holding.Store(false)
		s.mu.Lock()
		s.stopHold = nil
		s.mu.Unlock()
		if holdCtx.Err() == nil || conn.IsClosed() {
			return false
		}
	}
	if ctx.Err() != nil {
		return true // closing the connection gives the key back
	}
	freeCtx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if _, err := conn.Exec(freeCtx, sleepFreeSQL, s.schemaKey, s.queue); err != nil {
		if ctx.Err() == nil { // when stopping, dropping the connection gives the key back
			s.logger.Warn("giving back the sleep lock failed; reconnecting", zap.Error(err))
		}
		return false
	}
	return true
}

func (s *Lock) connect(ctx context.Context) (*pgx.Conn, error) {
	connectCtx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	return pgx.ConnectConfig(connectCtx, s.connConfig)
}

func (s *Lock) drop(ctx context.Context, conn *pgx.Conn) *pgx.Conn {
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	_ = conn.Close(closeCtx)
	cancel()
	return nil
}

// fail logs a failure, tells the claimer to look at the queue (writers skip
// NOTIFY while nobody holds the key), and backs off before the next try, by
// at most maxSleepRetry: until the key is held again, these looks are how
// the claimer finds new jobs.
func (s *Lock) fail(ctx context.Context, msg string, err error, failures int) {
	if ctx.Err() != nil {
		return
	}
	delay := min(retry.Delay(failures), maxSleepRetry)
	s.logger.Warn(msg, zap.Error(err), zap.Int("failures", failures), zap.Duration("retry_in", delay))
	notify(s.recheck)
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func notify(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
