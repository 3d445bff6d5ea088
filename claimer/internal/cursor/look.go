package cursor

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch/claimer/internal/pinned"
	"github.com/pgdispatch/pgdispatch/internal/retry"
	"github.com/pgdispatch/pgdispatch/internal/testhook"
)

// LookEvery is the shortest time between the end of one look from the
// front and the start of the next: while a claimer claims from its cursor,
// a job that becomes due behind it is found within about this long.
const LookEvery = time.Second

// LookShare is how many times as long as the last look took the next waits
// at least, when that is longer than LookEvery: a look that walks millions
// of dead entries under a long hold takes a second or more, and the looks
// then keep to a fifth of one connection's time.
const LookShare = 4

// LookSQL is the first due job of queue $1 in (priority, run_at, id) order,
// locked or not: the scans a claim from the front makes (claimSQL), without
// its locks; a row of NULLs when there is none. Its last
// column is the seconds the server took, read after the scan: the look is
// timed on the server, so that neither the network's round trip nor a
// loaded client makes the front look slow.
var LookSQL = `
WITH RECURSIVE ` + Walk("") + `
SELECT j.priority, j.run_at, j.id, extract(epoch FROM clock_timestamp() - statement_timestamp())::float8
FROM (SELECT 1) one LEFT JOIN LATERAL (
    SELECT w.* FROM pr CROSS JOIN LATERAL (
        SELECT priority, run_at, id FROM {jobs}
        WHERE status = 'pending' AND queue = $1 AND ` + OnePriority + `
        ORDER BY run_at, id
        LIMIT 1) w
    LIMIT 1) j ON true`

// Look is what a look from the front found: the first due job of the
// queue, if any, and how long the look took: on the server, or, for a look
// that failed, on the client, from its start to its failure, so that the
// next look waits LookShare times as long after a look that ran into its
// timeout too.
type Look struct {
	Found    bool
	Priority int16
	RunAt    time.Time
	ID       int64
	Took     time.Duration
	Err      error
}

// Looker looks from the front of a queue beside its claims, on a
// connection of the pool's, one look at a time: after a claim from the
// cursor asks (Want), at LookEvery (or LookShare times the last look's
// time) after the last look at the soonest, so that a claimer that keeps
// claiming has a look about every second, and one that has gone to sleep
// has one more, which sees every job committed before it slept. A look
// that fails is tried again, no sooner than retry.Delay after it (100 ms
// doubling to 10 s), until one succeeds: the claim that asked may have
// been the last. Create it with NewLooker and run it with Run.
type Looker struct {
	pool    *pgxpool.Pool
	sql     string
	queue   string
	timeout time.Duration
	logger  *zap.Logger
	Every   time.Duration // LookEvery, but in tests; 0: LookEvery

	want   chan struct{} // capacity 1
	looked chan Look     // capacity 1: the last look, until the claim loop takes it
}

// NewLooker returns a Looker of queue in schema, on pool, each look bounded
// by timeout.
func NewLooker(pool *pgxpool.Pool, schema, queue string, timeout time.Duration, logger *zap.Logger) *Looker {
	return &Looker{
		pool: pool, sql: pinned.WithSchema(LookSQL, schema), queue: queue, timeout: timeout, logger: logger,
		want: make(chan struct{}, 1), looked: make(chan Look, 1),
	}
}

// Want asks for a look. It never blocks; asks fold into one.
func (l *Looker) Want() {
	select {
	case l.want <- struct{}{}:
	default:
	}
}

// Wanted reports whether a look is asked for and not begun.
func (l *Looker) Wanted() bool { return len(l.want) > 0 }

// Deliver hands the claim loop look, in place of one it has not taken
// yet. Only Run delivers, but in tests.
func (l *Looker) Deliver(look Look) {
	for {
		select {
		case l.looked <- look:
			return
		default:
		}
		select {
		case <-l.looked:
		default:
		}
	}
}

// Looked returns the last look the claim loop has not taken yet, if any.
func (l *Looker) Looked() (Look, bool) {
	select {
	case look := <-l.looked:
		return look, true
	default:
		return Look{}, false
	}
}

// Run looks when asked, until ctx ends. It calls found after a look that
// found a due job, so that the claim loop claims and takes the look in.
func (l *Looker) Run(ctx context.Context, found func()) {
	var ended time.Time
	var took time.Duration
	failures := 0 // in a row
	every := l.Every
	if every == 0 {
		every = LookEvery
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.want:
		}
		next := nextLook(ended, took, every)
		if failures > 0 {
			next = later(next, ended.Add(retry.Delay(failures)))
		}
		if wait := time.Until(next); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		look := l.Look(ctx)
		ended, took = time.Now(), look.Took
		if look.Err != nil {
			if ctx.Err() != nil {
				return
			}
			failures++
			l.logger.Warn("look from the front of the queue failed", zap.Error(look.Err), zap.Int("failures", failures))
			// The claim that asked may have been the claimer's last before
			// it went to sleep: no other would ask again.
			l.Want()
			continue
		}
		failures = 0
		l.Deliver(look)
		if hook := testhook.From(ctx).Looked; hook != nil {
			hook(l.queue, look.ID)
		}
		if look.Found {
			found()
		}
	}
}

// later is the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// nextLook is the soonest time for the next look, after a look that
// ended at ended and took took.
func nextLook(ended time.Time, took, every time.Duration) time.Time {
	return ended.Add(max(every, LookShare*took))
}

// Look looks from the front once.
func (l *Looker) Look(ctx context.Context) Look {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	var (
		look     Look
		priority pgtype.Int2
		runAt    pgtype.Timestamptz
		id       pgtype.Int8
		took     float64
	)
	results := pinned.Send(ctx, l.pool, pinned.ScanPlanSQL, l.sql, l.queue)
	_, err := results.Exec()
	if err == nil {
		err = results.QueryRow().Scan(&priority, &runAt, &id, &took)
	}
	if closeErr := results.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		look.Err, look.Took = fmt.Errorf("look from the front: %w", err), time.Since(start)
		return look
	}
	look.Found, look.Priority, look.RunAt, look.ID = id.Valid, priority.Int16, runAt.Time, id.Int64
	look.Took = time.Duration(took * float64(time.Second))
	return look
}
