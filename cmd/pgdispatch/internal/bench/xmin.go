package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/claimer"
	"github.com/pgdispatch/pgdispatch/executors/httpcallback"
)

// loneSpacing is the pause between the xmin scenario's lone jobs.
const loneSpacing = 20 * time.Millisecond

// hold is a transaction held open on a connection of its own, with a
// transaction id, as a long report or an idle-in-transaction session holds
// one: while it is open, no row version deleted or updated after it began
// can be removed, nor its index entries.
type hold struct {
	conn *pgx.Conn
}

// holdSnapshot opens the held transaction.
func (b *bench) holdSnapshot(ctx context.Context) (*hold, error) {
	conn, err := b.connect(ctx)
	if err != nil {
		return nil, err
	}
	for _, sql := range []string{"SET idle_in_transaction_session_timeout = 0", "BEGIN", "SELECT txid_current()"} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			_ = conn.Close(context.WithoutCancel(ctx))
			return nil, err
		}
	}
	return &hold{conn: conn}, nil
}

// release rolls the held transaction back and closes its connection.
func (h *hold) release(ctx context.Context) {
	if h == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_, _ = h.conn.Exec(ctx, "ROLLBACK")
	_ = h.conn.Close(ctx)
}

// xmin: what a transaction held open in the same database costs the
// worker. Pairs of drains of XminJobs jobs, one with a transaction held open
// for its whole length and one without, in alternating order, each followed
// by lone jobs 20 ms apart on the same table with the transaction still
// held; then the claim's round trip against the number of dead claim-index
// entries in front of the due jobs (XminDead), the jobs that left them run
// by set-based updates in the server while the transaction is held.
func (b *bench) xmin(ctx context.Context) ([]*Result, error) {
	var out []*Result
	for _, deleteDone := range []bool{true, false} {
		drains := map[bool][]float64{}
		lone := map[bool][]time.Duration{}
		loneHTTP := map[bool][]time.Duration{}
		for pair := range b.opts.XminPairs {
			for i := range 2 {
				held := (pair+i)%2 == 1
				rate, lat, httpLat, err := b.xminDrain(ctx, held, deleteDone)
				if err != nil {
					return nil, err
				}
				fmt.Fprintf(b.log, "bench: xmin: pair %d, held %v, %s: %.0f jobs/s, lone p50 %.2f ms, http_callback %.2f ms\n",
					pair+1, held, retainName(deleteDone), rate, float64(median(lat).Microseconds())/1000,
					float64(median(httpLat).Microseconds())/1000)
				drains[held] = append(drains[held], rate)
				lone[held] = append(lone[held], lat...)
				loneHTTP[held] = append(loneHTTP[held], httpLat...)
			}
		}
		r := &Result{Scenario: "xmin_drain", Conditions: fmt.Sprintf("%d jobs, one worker, CONCURRENCY=%d, %s, %d pairs alternated, held: a transaction with an xid open in the same database for the drain's whole length",
			b.opts.XminJobs, b.base.Concurrency, retainName(deleteDone), b.opts.XminPairs)}
		free, held := mean(drains[false]), mean(drains[true])
		r.set("jobs_per_s_free", free)
		r.set("jobs_per_s_held", held)
		r.set("ratio", held/free)
		out = append(out, r)
		l := &Result{Scenario: "xmin_lone", Conditions: fmt.Sprintf("%d lone jobs %s apart after each drain of %d jobs (%s), the transaction still held or not, %d pairs",
			b.opts.XminLone, loneSpacing, b.opts.XminJobs, retainName(deleteDone), b.opts.XminPairs)}
		addPercentiles(l, "free_ms", lone[false])
		addPercentiles(l, "held_ms", lone[true])
		out = append(out, l)
		lh := &Result{Scenario: "xmin_lone_http", Conditions: fmt.Sprintf("%d lone http_callback jobs %s apart to a Go receiver on loopback, commit to request, after the lone no-op jobs of each drain of %d jobs (%s), the transaction still held or not, %d pairs",
			b.opts.XminLone, loneSpacing, b.opts.XminJobs, retainName(deleteDone), b.opts.XminPairs)}
		addPercentiles(lh, "free_ms", loneHTTP[false])
		addPercentiles(lh, "held_ms", loneHTTP[true])
		out = append(out, lh)
	}
	curve, err := b.xminCurve(ctx)
	if err != nil {
		return nil, err
	}
	return append(out, curve), nil
}

func retainName(deleteDone bool) string {
	if deleteDone {
		return "RETAIN_DONE=0 (done jobs deleted)"
	}
	return "RETAIN_DONE=24h (done jobs kept)"
}

// xminDrain drains XminJobs jobs with or without a held transaction, then
// inserts XminLone no-op jobs one at a time, loneSpacing apart, then as
// many http_callback jobs to a receiver on loopback, and returns the
// drain's jobs/s, the no-op jobs' commit-to-start latencies and the
// http_callback jobs' commit-to-request latencies.
func (b *bench) xminDrain(ctx context.Context, held, deleteDone bool) (float64, []time.Duration, []time.Duration, error) {
	schema, drop, err := b.schema(ctx)
	if err != nil {
		return 0, nil, nil, err
	}
	defer drop()
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	if _, err := b.pool.Exec(ctx, "INSERT INTO "+jobs+" (kind) SELECT 'noop' FROM generate_series(1, $1)", b.opts.XminJobs); err != nil {
		return 0, nil, nil, err
	}
	if _, err := b.pool.Exec(ctx, "VACUUM ANALYZE "+jobs); err != nil {
		return 0, nil, nil, err
	}
	var h *hold
	if held {
		if h, err = b.holdSnapshot(ctx); err != nil {
			return 0, nil, nil, err
		}
		defer h.release(ctx)
	}
	tune := func(c *pgdispatch.Config) { setDeleteDone(c, deleteDone) }
	counter := newCounter(int64(b.opts.XminJobs))
	start := time.Now()
	stop, err := b.runWorker(ctx, schema, counter, tune)
	if err != nil {
		return 0, nil, nil, err
	}
	select {
	case <-counter.done:
	case <-ctx.Done():
		stop()
		return 0, nil, nil, ctx.Err()
	}
	rate := float64(b.opts.XminJobs) / time.Since(start).Seconds()
	stop()
	// Analyzed as autovacuum would soon after such a drain: a worker's
	// plans made then see a table of pages with no live row. Left to
	// autovacuum's timing, some runs' lone jobs met such plans and others
	// did not.
	if _, err := b.pool.Exec(ctx, "ANALYZE "+jobs); err != nil {
		return 0, nil, nil, err
	}
	// The lone jobs' worker records start times, which the drain's only
	// counts: a worker started afresh, on the same table.
	rcv, err := startReceiver(0)
	if err != nil {
		return 0, nil, nil, err
	}
	defer rcv.close()
	exec, err := httpcallback.New(httpcallback.Config{AllowNetworks: []string{httpcallback.NetworksLoopback}})
	if err != nil {
		return 0, nil, nil, err
	}
	p := newProbe(0)
	stop, err = b.runWorker(ctx, schema, p, func(c *pgdispatch.Config) {
		tune(c)
		c.Registry.Register(httpcallback.Kind, exec)
	})
	if err != nil {
		return 0, nil, nil, err
	}
	defer stop()
	// The lone jobs come to a worker that has started and gone to sleep:
	// its first claim is from the front, over every job run under the hold
	// (tens of milliseconds), and is its start's, not a lone job's.
	if err := waitAsleep(ctx, p.worker.Claimer("default")); err != nil {
		return 0, nil, nil, err
	}
	conn, err := b.connect(ctx)
	if err != nil {
		return 0, nil, nil, err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	payload, _ := json.Marshal(map[string]string{"url": rcv.url})
	insertLone := func(kind string, payload []byte) (map[int64]time.Time, error) {
		committed := make(map[int64]time.Time, b.opts.XminLone)
		for range b.opts.XminLone {
			var id int64
			if err := conn.QueryRow(ctx, "INSERT INTO "+jobs+" (kind, payload) VALUES ($1, $2) RETURNING id", kind, payload).Scan(&id); err != nil {
				return nil, err
			}
			committed[id] = time.Now()
			time.Sleep(loneSpacing) // the scenario's pacing, not synchronisation
		}
		return committed, nil
	}
	committed, err := insertLone("noop", []byte("{}"))
	if err != nil {
		return 0, nil, nil, err
	}
	lat, err := waitLatencies(ctx, p, committed, 60*time.Second)
	if err != nil {
		return 0, nil, nil, err
	}
	if committed, err = insertLone(httpcallback.Kind, payload); err != nil {
		return 0, nil, nil, err
	}
	httpLat, err := waitArrivals(ctx, rcv, committed, 60*time.Second)
	return rate, lat, httpLat, err
}

// waitAsleep waits until c has gone to sleep once.
func waitAsleep(ctx context.Context, c *claimer.Claimer) error {
	_, err := sleptMore(ctx, c, 0)
	return err
}

// xminCurve holds a transaction open on a fresh table and, at each count
// of XminDead, first leaves that many dead entries in the claim index (jobs
// inserted, claimed and done by set-based updates in the server, in front
// of the jobs to come in (priority, run_at, id) order), then drains
// 100 × CONCURRENCY jobs inserted behind them and times each claim's round
// trip.
func (b *bench) xminCurve(ctx context.Context) (*Result, error) {
	schema, drop, err := b.schema(ctx)
	if err != nil {
		return nil, err
	}
	defer drop()
	timer := &claimTimer{}
	cb, closePool, err := b.tracedBench(ctx, timer)
	if err != nil {
		return nil, err
	}
	defer closePool()
	h, err := b.holdSnapshot(ctx)
	if err != nil {
		return nil, err
	}
	defer h.release(ctx)
	conn, err := b.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if _, err := conn.Exec(ctx, "SET statement_timeout = 0"); err != nil {
		return nil, err
	}
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	batch := 100 * b.base.Concurrency
	r := &Result{Scenario: "xmin_claim", Conditions: fmt.Sprintf("claim round trips draining %d jobs behind N dead claim-index entries, a transaction held open, CONCURRENCY=%d",
		batch, b.base.Concurrency)}
	dead := 0
	var first, last float64
	for i, target := range b.opts.XminDead {
		if target > dead {
			if err := runInServer(ctx, conn, jobs, target-dead); err != nil {
				return nil, err
			}
			dead = target
		}
		if _, err := conn.Exec(ctx, "INSERT INTO "+jobs+" (kind) SELECT 'noop' FROM generate_series(1, $1)", batch); err != nil {
			return nil, err
		}
		p := newCounter(int64(batch))
		timer.reset()
		stop, err := cb.runWorker(ctx, schema, p, nil)
		if err != nil {
			return nil, err
		}
		select {
		case <-p.done:
		case <-ctx.Done():
			stop()
			return nil, ctx.Err()
		}
		stop()
		took := timer.took()
		name := fmt.Sprintf("dead_%d_claim_ms", target)
		addPercentiles(r, name, took)
		p50 := float64(median(took).Microseconds()) / 1000
		fmt.Fprintf(b.log, "bench: xmin: %d dead entries: %d claims, p50 %.3f ms\n", target, len(took), p50)
		if i == 0 {
			first = p50
		}
		last = p50
	}
	r.set("p50_last_to_first", last/first)
	return r, nil
}

// runInServer inserts n jobs and runs them as the claim and the outcome
// do, pending to running to done, in set-based updates of at most 50,000
// rows: each leaves the job's pending version, and its claim-index entry,
// dead behind the held transaction.
func runInServer(ctx context.Context, conn *pgx.Conn, jobs string, n int) error {
	for n > 0 {
		k := min(n, 50000)
		n -= k
		sql := `WITH i AS (INSERT INTO ` + jobs + ` (kind) SELECT 'noop' FROM generate_series(1, $1) RETURNING id),
		r AS (SELECT min(id) AS lo, max(id) AS hi FROM i) SELECT lo, hi FROM r`
		var lo, hi int64
		if err := conn.QueryRow(ctx, sql, k).Scan(&lo, &hi); err != nil {
			return err
		}
		for _, set := range []string{
			"status = 'running', attempts = 1, max_attempts = 5, locked_by = 'bench-xmin', locked_until = now() + interval '30 seconds', updated_at = now()",
			"status = 'done', finished_at = now(), locked_by = NULL, locked_until = NULL, updated_at = now()",
		} {
			if _, err := conn.Exec(ctx, "UPDATE "+jobs+" SET "+set+" WHERE id BETWEEN $1 AND $2", lo, hi); err != nil {
				return err
			}
		}
	}
	return nil
}

// tracedBench returns a bench whose workers' pool times the claims with
// timer, and a func that closes that pool.
func (b *bench) tracedBench(ctx context.Context, timer *claimTimer) (*bench, func(), error) {
	cfg := b.pool.Config().Copy()
	cfg.ConnConfig.Tracer = timer
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	cb := *b
	cb.pool = pool
	cb.base.Pool = pool
	return &cb, pool.Close, nil
}

// claimTimer is a pgx tracer that times each claim's round trip: the
// batch the claimer sends behind its settings (pinned.ClaimPlanSQL, or
// FlowPlanSQL for a limited queue: the only ones that turn
// synchronous_commit off), from its start until its results are closed.
type claimTimer struct {
	mu    sync.Mutex
	times []time.Duration
}

type claimStartKey struct{}

func (t *claimTimer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (t *claimTimer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (t *claimTimer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	if data.Batch != nil && len(data.Batch.QueuedQueries) > 0 &&
		strings.Contains(data.Batch.QueuedQueries[0].SQL, "set_config('synchronous_commit', 'off', true)") {
		return context.WithValue(ctx, claimStartKey{}, time.Now())
	}
	return ctx
}

func (t *claimTimer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (t *claimTimer) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchEndData) {
	start, ok := ctx.Value(claimStartKey{}).(time.Time)
	if !ok || data.Err != nil {
		return
	}
	t.mu.Lock()
	t.times = append(t.times, time.Since(start))
	t.mu.Unlock()
}

func (t *claimTimer) reset() {
	t.mu.Lock()
	t.times = nil
	t.mu.Unlock()
}

func (t *claimTimer) took() []time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]time.Duration(nil), t.times...)
}

func mean(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := append([]time.Duration(nil), ds...)
	slices.Sort(s)
	return s[len(s)/2]
}
