package pgdispatch_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

// gate is an executor whose attempts run until the test opens them, one by
// one: each start is sent on started, and the attempt returns nil once its
// gate is opened (or its context ends).
type gate struct {
	started chan gateRun
	mu      sync.Mutex
	open    map[gateRun]chan struct{}
}

type gateRun struct {
	id      int64
	attempt int
}

func newGate() *gate {
	return &gate{started: make(chan gateRun, 16), open: map[gateRun]chan struct{}{}}
}

func (g *gate) ch(r gateRun) chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	ch, ok := g.open[r]
	if !ok {
		ch = make(chan struct{})
		g.open[r] = ch
	}
	return ch
}

func (g *gate) Execute(ctx context.Context, job *executors.Job) error {
	r := gateRun{job.ID, job.Attempt}
	ch := g.ch(r)
	g.started <- r
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *gate) release(r gateRun) { close(g.ch(r)) }

func (g *gate) waitStart(t *testing.T, want gateRun) {
	t.Helper()
	select {
	case got := <-g.started:
		require.Equal(t, want, got)
	case <-time.After(waitFor):
		t.Fatalf("attempt %d of job %d did not start", want.attempt, want.id)
	}
}

// A job taken from a stalled run (here: given back by hand, as the sweeper
// does) and claimed again by the same worker runs twice at once. When the
// first run ends, the second must keep its heartbeat: runs are tracked by
// run, not by job id.
func TestSecondRunKeepsItsHeartbeat(t *testing.T) {
	t.Parallel()
	b := setup(t)
	g := newGate()
	b.registry.Register("gate", g)
	cfg := b.config(t, "w")
	cfg.Lease = 900 * time.Millisecond // a heartbeat every 300 ms
	cfg.SweepInterval = hour
	start(t, cfg)

	id := b.insert(t, "INSERT INTO "+b.jobs+" (kind) VALUES ('gate') RETURNING id")
	g.waitStart(t, gateRun{id, 1})
	b.insert(t, `UPDATE `+b.jobs+` SET status = 'pending', run_at = now(), locked_by = NULL, locked_until = NULL
		WHERE id = $1 RETURNING id`, id)
	g.waitStart(t, gateRun{id, 2})

	g.release(gateRun{id, 1})
	// The heartbeat keeps renewing the second run's lease: three renewals
	// after the first run ended (its outcome is written within milliseconds).
	// The watcher may see the UPDATE that made the job pending again only
	// now: the second run's states start at its claim, and every one from
	// there on is running, its attempt the second.
	from := len(b.watch.History(id))
	b.watch.UntilHistory(t, id, 5*time.Second, "three lease renewals of the second run", func(h []pgtest.JobState) bool {
		claimed := slices.IndexFunc(h, func(s pgtest.JobState) bool { return s.Status == "running" && s.Attempts == 2 })
		if claimed < 0 {
			return false
		}
		for _, s := range h[claimed:] {
			require.Equal(t, "running", s.Status)
			require.Equal(t, 2, s.Attempts)
		}
		return len(h)-max(from, claimed+1) >= 3
	})
	g.release(gateRun{id, 2})
	s := b.watch.Status(t, id, "done", waitFor)
	require.Equal(t, 2, s.Attempts)
}

// A due job that a claim skipped because another transaction held its row
// lock is claimed soon after that transaction ends, even when it changed
// neither status nor run_at (so no trigger notified) and the fallback tick is
// an hour away.
func TestLockStrandedJobIsClaimed(t *testing.T) {
	t.Parallel()
	b := setup(t)
	g := newGate()
	b.registry.Register("gate", g)
	cfg := b.config(t, "w")
	cfg.Concurrency = 1
	w, _, _ := start(t, cfg)
	b.waitAsleep(t, w)

	// The only slot is busy, so the due job waits, unclaimed, and another
	// transaction locks it meanwhile.
	busy := b.insert(t, "INSERT INTO "+b.jobs+" (kind) VALUES ('gate') RETURNING id")
	g.waitStart(t, gateRun{busy, 1})
	id := b.insert(t, "INSERT INTO "+b.jobs+" (kind) VALUES ('record') RETURNING id")
	ctx, cancel := context.WithTimeout(context.Background(), waitFor)
	defer cancel()
	tx, err := pgtest.Conn(t).Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	_, err = tx.Exec(ctx, "UPDATE "+b.jobs+" SET payload = '{\"edited\": true}' WHERE id = $1", id)
	require.NoError(t, err)

	// The slot frees; the claim skips the locked job and the claimer sleeps.
	g.release(gateRun{busy, 1})
	b.waitAsleep(t, w)
	require.NoError(t, tx.Commit(ctx))
	b.rec.waitStart(t, id, 5*time.Second)
	b.watch.Status(t, id, "done", waitFor)
}

// A job moved into a sleeping worker's queue wakes it.
func TestMovedJobWakesItsNewQueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w, _, _ := start(t, b.config(t, "w"))
	id := b.insert(t, "INSERT INTO "+b.jobs+" (kind, queue) VALUES ('record', 'elsewhere') RETURNING id")
	b.waitAsleep(t, w)
	b.insert(t, "UPDATE "+b.jobs+" SET queue = 'default' WHERE id = $1 RETURNING id", id)
	b.rec.waitStart(t, id, 5*time.Second)
	b.watch.Status(t, id, "done", waitFor)
}
