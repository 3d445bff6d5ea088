package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdispatch/pgdispatch"
)

// hold is a transaction held open on a connection of its own, in the
// scenario's database, with an xid (BEGIN; SELECT txid_current()): as long
// as it lasts, vacuum removes no row version that its snapshot may see,
// in any table of the database.
type hold struct {
	conn *pgx.Conn
	tx   pgx.Tx
}

func (b *bench) hold(ctx context.Context) (*hold, error) {
	cfg := b.pool.Config().ConnConfig.Copy()
	// The pool's connections end a transaction left idle for a minute.
	cfg.RuntimeParams["idle_in_transaction_session_timeout"] = "0"
	cfg.RuntimeParams["application_name"] = "pgdispatch bench: held transaction"
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	tx, err := conn.Begin(ctx)
	if err == nil {
		_, err = tx.Exec(ctx, "SELECT txid_current()")
	}
	if err != nil {
		_ = conn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	return &hold{conn: conn, tx: tx}, nil
}

// release ends the held transaction; a nil hold is none.
func (h *hold) release(ctx context.Context) {
	if h == nil {
		return
	}
	ctx = context.WithoutCancel(ctx)
	_ = h.tx.Rollback(ctx)
	_ = h.conn.Close(ctx)
}

// xmin: what a transaction held open in the same database costs a worker.
// Drains of DrainJobs jobs, done jobs deleted and kept, each without and
// with a hold, alternated in two pairs whose order is swapped; after each
// kept drain, still under its hold if any, Jobs jobs inserted alone,
// Spacing apart (the lone job). Then the curve: one worker under one hold
// runs the jobs of each rung of XminLadder in turn, and after each rung
// the lone job and a burst of 5,000 jobs are timed: the claims' cost
// against the index entries the jobs run so far left in front of the queue.
func (b *bench) xmin(ctx context.Context) ([]*Result, error) {
	var out []*Result
	type key struct {
		deleteDone, held bool
		pair             int
	}
	rates := map[key]float64{}
	lone := map[key]float64{}
	for pair := range 2 {
		for _, deleteDone := range []bool{true, false} {
			order := []bool{false, true}
			if pair == 1 {
				order = []bool{true, false}
			}
			for _, held := range order {
				rs, err := b.xminDrain(ctx, deleteDone, held, pair+1)
				if err != nil {
					return nil, err
				}
				out = append(out, rs...)
				rates[key{deleteDone, held, pair}] = rs[0].Figures["jobs_per_s"]
				if len(rs) > 1 {
					lone[key{deleteDone, held, pair}] = rs[1].Figures["lone_p99_ms"]
				}
			}
		}
	}
	r := &Result{Scenario: "xmin_ratio", Conditions: fmt.Sprintf("%d jobs, held ÷ free drain jobs/s, per pair (the first pair free first, the second held first)", b.opts.DrainJobs)}
	for pair := range 2 {
		for _, deleteDone := range []bool{true, false} {
			name := "kept"
			if deleteDone {
				name = "deleted"
			}
			r.set(fmt.Sprintf("drain_%s_pair%d", name, pair+1), rates[key{deleteDone, true, pair}]/rates[key{deleteDone, false, pair}])
		}
	}
	out = append(out, r)

	curve, err := b.xminCurve(ctx)
	if err != nil {
		return nil, err
	}
	return append(out, curve), nil
}

// xminDrain is one drain of the xmin scenario, and after a kept one, the
// lone job's latency.
func (b *bench) xminDrain(ctx context.Context, deleteDone, held bool, pair int) ([]*Result, error) {
	schema, drop, err := b.schema(ctx)
	if err != nil {
		return nil, err
	}
	defer drop()
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	if _, err := b.pool.Exec(ctx, "INSERT INTO "+jobs+" (kind) SELECT 'noop' FROM generate_series(1, $1)", b.opts.DrainJobs); err != nil {
		return nil, err
	}
	if _, err := b.pool.Exec(ctx, "VACUUM ANALYZE "+jobs); err != nil {
		return nil, err
	}
	var h *hold
	if held {
		if h, err = b.hold(ctx); err != nil {
			return nil, err
		}
	}
	defer h.release(ctx)
	p := newCounter(int64(b.opts.DrainJobs))
	if !deleteDone {
		p = newProbe(int64(b.opts.DrainJobs))
		p.recordAfter = int64(b.opts.DrainJobs) // the drain's ids are 1 to DrainJobs
	}
	start := time.Now()
	stop, err := b.runWorker(ctx, schema, p, func(c *pgdispatch.Config) { setDeleteDone(c, deleteDone) })
	if err != nil {
		return nil, err
	}
	defer stop()
	select {
	case <-p.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	took := time.Since(start)
	stats := p.worker.Claimer(pgdispatch.DefaultQueue).Stats()
	state, retain := "free", "done jobs deleted"
	if held {
		state = "held"
	}
	if !deleteDone {
		retain = "done jobs kept"
	}
	d := &Result{Scenario: "xmin_drain", Conditions: fmt.Sprintf("pair %d, %s: %d jobs, one worker, CONCURRENCY=%d, %s",
		pair, state, b.opts.DrainJobs, b.base.Concurrency, retain)}
	d.set("jobs_per_s", float64(b.opts.DrainJobs)/took.Seconds())
	d.set("jobs_per_claim", float64(stats.Claimed)/float64(max(stats.Claims, 1)))
	d.set("claims", float64(stats.Claims))
	d.set("front_looks", float64(stats.Fronts))
	if deleteDone {
		return []*Result{d}, nil
	}
	lat, err := b.loneJobs(ctx, jobs, p, b.opts.Jobs)
	if err != nil {
		return nil, err
	}
	l := &Result{Scenario: "xmin_lone", Conditions: fmt.Sprintf("pair %d, %s: %d jobs alone, %s apart, after the drain of %d, %s",
		pair, state, b.opts.Jobs, b.opts.Spacing, b.opts.DrainJobs, retain)}
	addPercentiles(l, "lone_ms", lat)
	return []*Result{d, l}, nil
}

// loneJobs inserts n jobs one per transaction, Spacing apart, and returns
// the delays from each commit to its start.
func (b *bench) loneJobs(ctx context.Context, jobs string, p *probe, n int) ([]time.Duration, error) {
	conn, err := b.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	committed := make(map[int64]time.Time, n)
	for range n {
		var id int64
		if err := conn.QueryRow(ctx, "INSERT INTO "+jobs+" (kind) VALUES ('noop') RETURNING id").Scan(&id); err != nil {
			return nil, err
		}
		committed[id] = time.Now()
		time.Sleep(b.opts.Spacing) // the scenario's pacing, not synchronisation
	}
	return waitLatencies(ctx, p, committed, 60*time.Second)
}

// burstJobs is how many jobs each rung of the curve drains at once.
const burstJobs = 5000

// xminCurve: one worker, one hold from the start; for each rung of
// XminLadder, the jobs up to it run, then the lone job and a burst.
func (b *bench) xminCurve(ctx context.Context) (*Result, error) {
	schema, drop, err := b.schema(ctx)
	if err != nil {
		return nil, err
	}
	defer drop()
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	h, err := b.hold(ctx)
	if err != nil {
		return nil, err
	}
	defer h.release(ctx)
	p := newProbe(0)
	stop, err := b.runWorker(ctx, schema, p, nil)
	if err != nil {
		return nil, err
	}
	defer stop()
	r := &Result{Scenario: "xmin_curve", Conditions: fmt.Sprintf("one worker, CONCURRENCY=%d, done jobs kept, a transaction held open throughout; "+
		"at each rung (jobs run under the hold): %d jobs alone %s apart, then a burst of %d jobs",
		b.base.Concurrency, min(b.opts.Jobs, 200), b.opts.Spacing, burstJobs)}
	ran := int64(0) // jobs run so far
	wait := func(n int64) error {
		for p.count.Load() < n {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(5 * time.Millisecond):
			}
		}
		return nil
	}
	for _, rung := range b.opts.XminLadder {
		if more := int64(rung) - ran; more > 0 {
			fmt.Fprintf(b.log, "bench: xmin: running jobs up to %d under the hold\n", rung)
			if _, err := b.pool.Exec(ctx, "INSERT INTO "+jobs+" (kind) SELECT 'noop' FROM generate_series(1, $1)", more); err != nil {
				return nil, err
			}
			ran += more
			if err := wait(ran); err != nil {
				return nil, err
			}
		}
		lone := p.worker.Claimer(pgdispatch.DefaultQueue).Stats()
		lat, err := b.loneJobs(ctx, jobs, p, min(b.opts.Jobs, 200))
		if err != nil {
			return nil, err
		}
		ran += int64(len(lat))
		addPercentiles(r, fmt.Sprintf("lone_at_%d_ms", rung), lat)
		before := p.worker.Claimer(pgdispatch.DefaultQueue).Stats()
		r.set(fmt.Sprintf("lone_at_%d_front_looks", rung), float64(before.Fronts-lone.Fronts))
		start := time.Now()
		if _, err := b.pool.Exec(ctx, "INSERT INTO "+jobs+" (kind) SELECT 'noop' FROM generate_series(1, $1)", burstJobs); err != nil {
			return nil, err
		}
		ran += burstJobs
		if err := wait(ran); err != nil {
			return nil, err
		}
		took := time.Since(start)
		after := p.worker.Claimer(pgdispatch.DefaultQueue).Stats()
		r.set(fmt.Sprintf("burst_at_%d_jobs_per_s", rung), burstJobs/took.Seconds())
		r.set(fmt.Sprintf("burst_at_%d_ms_per_claim", rung), float64(took.Microseconds())/1000/float64(max(after.Claims-before.Claims, 1)))
		r.set(fmt.Sprintf("burst_at_%d_front_looks", rung), float64(after.Fronts-before.Fronts))
	}
	return r, nil
}
