package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/executors"
)

// flowConcurrency: FlowJobs jobs over FlowKeys keys drained by FlowWorkers
// workers, with every key limited to one running job and without a limit,
// each in a schema of its own; during each drain, a connection of its own
// reads the most running jobs of any key, again and again.
func (b *bench) flowConcurrency(ctx context.Context) (*Result, error) {
	unlimited, mostUnlimited, _, err := b.flowDrain(ctx, false)
	if err != nil {
		return nil, err
	}
	limited, most, samples, err := b.flowDrain(ctx, true)
	if err != nil {
		return nil, err
	}
	r := &Result{Scenario: "flow_concurrency", Conditions: fmt.Sprintf("%d jobs over %d keys, each key at most 1 running (set_flow_limit concurrency 1) and without a limit, %d workers, CONCURRENCY=%d each, %s",
		b.opts.FlowJobs, b.opts.FlowKeys, b.opts.FlowWorkers, b.base.Concurrency, retainName(b.base.RetainDone == pgdispatch.RetainDoneNone))}
	r.set("max_running_per_key", float64(most))
	r.set("max_running_per_key_unlimited", float64(mostUnlimited))
	r.set("samples", float64(samples))
	r.set("jobs_per_s", limited)
	r.set("jobs_per_s_unlimited", unlimited)
	r.set("limited_vs_unlimited", limited/unlimited)
	return r, nil
}

// flowDrain is one drain of flowConcurrency: its jobs/s, the most running
// jobs of a key the sampler saw, and its samples.
func (b *bench) flowDrain(ctx context.Context, limited bool) (rate float64, most, samples int, err error) {
	schema, drop, err := b.schema(ctx)
	if err != nil {
		return 0, 0, 0, err
	}
	defer drop()
	if _, err := b.insertFlowJobs(ctx, schema, "k", b.opts.FlowJobs, b.opts.FlowKeys); err != nil {
		return 0, 0, 0, err
	}
	if limited {
		if err := b.flowLimit(ctx, schema, 1, false, 0, 0); err != nil {
			return 0, 0, 0, err
		}
	}
	// Both drains are sampled, so that the sampler's own load weighs on
	// both sides of the ratio, and the drain without a limit shows that
	// it sees a key's jobs running side by side.
	sampled := make(chan sampleResult, 1)
	sampling, stopSampling := context.WithCancel(ctx)
	defer stopSampling()
	conn, err := b.connect(ctx)
	if err != nil {
		return 0, 0, 0, err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	go func() { sampled <- sampleRunning(sampling, conn, pgx.Identifier{schema, "jobs"}.Sanitize()) }()
	p := newCounter(int64(b.opts.FlowJobs))
	start := time.Now()
	stop, err := b.flowWorkers(ctx, schema, b.opts.FlowWorkers, p, nil)
	if err != nil {
		return 0, 0, 0, err
	}
	err = waitDone(ctx, p)
	took := time.Since(start)
	stopSampling()
	stop()
	if err != nil {
		return 0, 0, 0, err
	}
	s := <-sampled
	if s.err != nil {
		return 0, 0, 0, fmt.Errorf("sample running jobs: %w", s.err)
	}
	fmt.Fprintf(b.log, "bench: flow: drain, limited %v: %.0f jobs/s, most running of a key %d in %d samples\n",
		limited, float64(b.opts.FlowJobs)/took.Seconds(), s.most, s.samples)
	return float64(b.opts.FlowJobs) / took.Seconds(), s.most, s.samples, nil
}

type sampleResult struct {
	most, samples int
	err           error
}

// sampleRunning reads, until ctx ends, the most running jobs of any key.
func sampleRunning(ctx context.Context, conn *pgx.Conn, jobs string) sampleResult {
	var s sampleResult
	sql := "SELECT coalesce(max(n), 0) FROM (SELECT count(*) n FROM " + jobs +
		" WHERE status = 'running' AND flow_key IS NOT NULL GROUP BY flow_key) c"
	for ctx.Err() == nil {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var n int
		err := conn.QueryRow(qctx, sql).Scan(&n)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				s.err = err
			}
			return s
		}
		s.most, s.samples = max(s.most, n), s.samples+1
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Millisecond): // the sampler's pace
		}
	}
	return s
}

// flowStrict: FlowStrictKeys keys of FlowStrictJobs jobs each, every key
// strict, FlowWorkers workers; the first attempt of every 20th job fails
// and is retried 10 ms later. Every attempt is checked against the order:
// no job of a key starts before every job ahead of it in (priority, run_at,
// id) order has ended for good, and no two attempts of a key overlap.
func (b *bench) flowStrict(ctx context.Context) (*Result, error) {
	schema, drop, err := b.schema(ctx)
	if err != nil {
		return nil, err
	}
	defer drop()
	n := b.opts.FlowStrictKeys * b.opts.FlowStrictJobs
	keys, err := b.insertFlowJobs(ctx, schema, "s", n, b.opts.FlowStrictKeys)
	if err != nil {
		return nil, err
	}
	if err := b.flowLimit(ctx, schema, 0, true, 0, 0); err != nil {
		return nil, err
	}
	// A key's jobs, in the order they must start: inserted by one
	// statement, they have one priority and run_at, and ids in order.
	order := map[string][]int64{}
	for id, key := range keys {
		order[key] = append(order[key], id)
	}
	for _, ids := range order {
		slices.Sort(ids)
	}
	p := newCounter(int64(n))
	e := &flowExec{next: p, fail: func(j *executors.Job) bool { return j.ID%20 == 0 && j.Attempt == 1 }}
	start := time.Now()
	stop, err := b.flowWorkers(ctx, schema, b.opts.FlowWorkers, p, func(c *pgdispatch.Config) {
		registerAsNoop(e)(c)
		c.RetryBackoff = func(int) time.Duration { return 10 * time.Millisecond }
	})
	if err != nil {
		return nil, err
	}
	err = waitDone(ctx, p)
	took := time.Since(start)
	stop()
	if err != nil {
		return nil, err
	}
	attempts := e.attempts()
	violations, overlaps, detail := strictViolations(order, keys, attempts)
	if detail != "" {
		fmt.Fprintln(b.log, "bench: flow: strict:", detail)
	}
	r := &Result{Scenario: "flow_strict", Conditions: fmt.Sprintf("%d keys × %d jobs, every key strict, %d workers, CONCURRENCY=%d each, the first attempt of every 20th job failing, retried after 10ms",
		b.opts.FlowStrictKeys, b.opts.FlowStrictJobs, b.opts.FlowWorkers, b.base.Concurrency)}
	r.set("order_violations", float64(violations))
	r.set("overlaps", float64(overlaps))
	r.set("attempts", float64(len(attempts)))
	r.set("jobs_per_s", float64(n)/took.Seconds())
	return r, nil
}

// strictViolations counts, per key, the first attempts that started before
// every job of the key ahead of them had ended for good (order violations;
// two attempts of the key at once count too), and, of those, the
// overlaps, with a line on the first few.
func strictViolations(order map[string][]int64, keys map[int64]string, attempts []attemptRecord) (violations, overlaps int, detail string) {
	// the end of each job's last attempt, the one that did not fail
	ended := map[int64]time.Time{}
	for _, a := range attempts {
		if !a.failed {
			ended[a.id] = a.end
		}
	}
	pos := map[int64]int{}
	for _, ids := range order {
		for i, id := range ids {
			pos[id] = i
		}
	}
	var lines []string
	lastEnd := map[string]attemptRecord{} // each key's attempt that ended last so far, by start order
	for _, a := range attempts {
		key := keys[a.id]
		bad := false
		if prev, ok := lastEnd[key]; ok && a.start.Before(prev.end) {
			overlaps++
			bad = true
			lines = append(lines, fmt.Sprintf("key %s: job %d attempt %d started while job %d attempt %d ran", key, a.id, a.attempt, prev.id, prev.attempt))
		}
		if a.attempt == 1 && !bad {
			if i := pos[a.id]; i > 0 {
				before := order[key][i-1]
				if e, ok := ended[before]; !ok || a.start.Before(e) {
					bad = true
					lines = append(lines, fmt.Sprintf("key %s: job %d started before job %d ended", key, a.id, before))
				}
			}
		}
		if bad {
			violations++
		}
		if prev, ok := lastEnd[key]; !ok || a.end.After(prev.end) {
			lastEnd[key] = a
		}
	}
	return violations, overlaps, strings.Join(lines[:min(len(lines), 5)], "; ")
}
