package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/executors"
)

// fairSpacing is the pause between the fair part's lone key's inserts.
const fairSpacing = 10 * time.Millisecond

// flowFair: one key with FlowBacklog due jobs, the queue limited with no
// limit (its keys only take turns), FlowWorkers workers; while they drain
// the backlog, a second key's jobs are inserted one per transaction from
// another connection, fairSpacing apart: their commit to start.
func (b *bench) flowFair(ctx context.Context) (*Result, error) {
	schema, drop, err := b.schema(ctx)
	if err != nil {
		return nil, err
	}
	defer drop()
	backlog, err := b.insertFlowJobs(ctx, schema, "backlog", b.opts.FlowBacklog, 1)
	if err != nil {
		return nil, err
	}
	var lastBacklog int64
	for id := range backlog {
		lastBacklog = max(lastBacklog, id)
	}
	if err := b.flowLimit(ctx, schema, 0, false, 0, 0); err != nil {
		return nil, err
	}
	conn, err := b.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	drained, lone := newCounter(int64(b.opts.FlowBacklog)), newProbe(0)
	split := executors.Func(func(ctx context.Context, job *executors.Job) error {
		if job.ID > lastBacklog {
			return lone.Execute(ctx, job)
		}
		return drained.Execute(ctx, job)
	})
	start := time.Now()
	stop, err := b.flowWorkers(ctx, schema, b.opts.FlowWorkers, drained, registerAsNoop(split))
	if err != nil {
		return nil, err
	}
	defer stop()
	insert := "INSERT INTO " + pgx.Identifier{schema, "jobs"}.Sanitize() + " (kind, flow_key) VALUES ('noop', 'lone') RETURNING id"
	committed := map[int64]time.Time{}
	for waiting := true; waiting; {
		var id int64
		if err := conn.QueryRow(ctx, insert).Scan(&id); err != nil {
			return nil, err
		}
		committed[id] = time.Now()
		select {
		case <-drained.done:
			waiting = false
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(fairSpacing): // the part's pacing, not synchronisation
		}
	}
	took := time.Since(start)
	lat, err := waitLatencies(ctx, lone, committed, time.Minute)
	if err != nil {
		return nil, err
	}
	r := &Result{Scenario: "flow_fair", Conditions: fmt.Sprintf("one key with %d due jobs and a second key inserting one job per transaction %s apart while they drain, the queue limited with no limit (turns only), %d workers, CONCURRENCY=%d each; the second key's commit to start",
		b.opts.FlowBacklog, fairSpacing, b.opts.FlowWorkers, b.base.Concurrency)}
	addPercentiles(r, "commit_to_start_ms", lat)
	r.set("second_key_jobs", float64(len(committed)))
	r.set("backlog_jobs_per_s", float64(b.opts.FlowBacklog)/took.Seconds())
	return r, nil
}

// flowWakeups: POLL_INTERVAL=1h, one key limited to one running job,
// FlowWakeups jobs, FlowWorkers workers: from each job's end (its executor
// returning) to the next job's start.
func (b *bench) flowWakeups(ctx context.Context) (*Result, error) {
	schema, drop, err := b.schema(ctx)
	if err != nil {
		return nil, err
	}
	defer drop()
	if _, err := b.insertFlowJobs(ctx, schema, "w", b.opts.FlowWakeups, 1); err != nil {
		return nil, err
	}
	if err := b.flowLimit(ctx, schema, 1, false, 0, 0); err != nil {
		return nil, err
	}
	p := newCounter(int64(b.opts.FlowWakeups))
	e := &flowExec{next: p}
	stop, err := b.flowWorkers(ctx, schema, b.opts.FlowWorkers, p, func(c *pgdispatch.Config) {
		registerAsNoop(e)(c)
		c.PollInterval = time.Hour
	})
	if err != nil {
		return nil, err
	}
	err = waitDone(ctx, p)
	stop()
	if err != nil {
		return nil, err
	}
	attempts := e.attempts()
	var gaps []time.Duration
	overlaps := 0
	for i := 1; i < len(attempts); i++ {
		gap := attempts[i].start.Sub(attempts[i-1].end)
		if gap < 0 {
			overlaps++
			continue
		}
		gaps = append(gaps, gap)
	}
	r := &Result{Scenario: "flow_wakeups", Conditions: fmt.Sprintf("POLL_INTERVAL=1h, one key at most 1 running (set_flow_limit concurrency 1), %d jobs, %d workers, CONCURRENCY=%d each; from a job's end (its executor returning) to the next one's start",
		b.opts.FlowWakeups, b.opts.FlowWorkers, b.base.Concurrency)}
	addPercentiles(r, "end_to_start_ms", gaps)
	r.set("overlaps", float64(overlaps))
	return r, nil
}
