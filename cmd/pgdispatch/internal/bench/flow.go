package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/executors"
)

// flowRateKeys is the number of keys of the flow scenario's rate part.
const flowRateKeys = 10

// FlowParts are the flow scenario's parts, in the order they run.
var FlowParts = []string{"concurrency", "strict", "rate", "fair", "wakeups"}

// flowStall is how long a part of the flow scenario waits for a job to
// end before it reports a stall: a limited key that is never claimed again.
const flowStall = 30 * time.Second

// flow: flow control by key, the acceptance of each limit, with FlowWorkers
// workers in this process, each with a pool and a worker id of its own.
// Each part is a result: concurrency, strict, rate, fair and wakeups.
func (b *bench) flow(ctx context.Context) ([]*Result, error) {
	parts := map[string]func(context.Context) (*Result, error){
		"concurrency": b.flowConcurrency, "strict": b.flowStrict, "rate": b.flowRate, "fair": b.flowFair, "wakeups": b.flowWakeups,
	}
	var out []*Result
	for _, name := range FlowParts {
		if !slices.Contains(b.opts.FlowParts, name) {
			continue
		}
		r, err := parts[name](ctx)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// flowWorkers starts n workers on schema, each with a pool and a worker id
// of its own, each running p as the no-op kind; tune changes each one's
// config, as runWorker's does. stop stops them all and closes their pools.
func (b *bench) flowWorkers(ctx context.Context, schema string, n int, p *probe, tune func(*pgdispatch.Config)) (stop func(), err error) {
	var stops []func()
	stop = func() {
		var wg sync.WaitGroup
		for _, s := range stops {
			wg.Add(1)
			go func() { defer wg.Done(); s() }()
		}
		wg.Wait()
	}
	for i := range n {
		pool, err := pgxpool.NewWithConfig(ctx, b.pool.Config().Copy())
		if err != nil {
			stop()
			return nil, err
		}
		wb := *b
		wb.pool, wb.base.Pool = pool, pool
		wb.base.WorkerID = fmt.Sprintf("%s-flow-%d", cmp.Or(b.base.WorkerID, "bench"), i+1)
		s, err := wb.runWorker(ctx, schema, p, tune)
		if err != nil {
			pool.Close()
			stop()
			return nil, err
		}
		stops = append(stops, func() { s(); pool.Close() })
	}
	return stop, nil
}

// flowLimit declares a limit for every key of the default queue of schema:
// concurrency and rate 0 are none.
func (b *bench) flowLimit(ctx context.Context, schema string, concurrency int, strict bool, rate int, per time.Duration) error {
	orNil := func(n int) any {
		if n == 0 {
			return nil
		}
		return n
	}
	var perArg any
	if per > 0 {
		perArg = per
	}
	_, err := b.pool.Exec(ctx, "SELECT "+pgx.Identifier{schema, "set_flow_limit"}.Sanitize()+"($1, NULL, $2, $3, $4, $5)",
		pgdispatch.DefaultQueue, orNil(concurrency), strict, orNil(rate), perArg)
	if err != nil {
		return fmt.Errorf("set_flow_limit: %w", err)
	}
	return nil
}

// insertFlowJobs inserts n no-op jobs in one statement, the i-th of key
// prefix || i % keys, so that the keys' jobs interleave in id order, and
// returns each job's key.
func (b *bench) insertFlowJobs(ctx context.Context, schema, prefix string, n, keys int) (map[int64]string, error) {
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	rows, err := b.pool.Query(ctx, "INSERT INTO "+jobs+" (kind, flow_key) SELECT 'noop', $2 || (i % $3) FROM generate_series(1, $1) i ORDER BY i RETURNING id, flow_key",
		n, prefix, keys)
	if err != nil {
		return nil, err
	}
	out := make(map[int64]string, n)
	var (
		id  int64
		key string
	)
	if _, err := pgx.ForEachRow(rows, []any{&id, &key}, func() error { out[id] = key; return nil }); err != nil {
		return nil, fmt.Errorf("insert jobs: %w", err)
	}
	if _, err := b.pool.Exec(ctx, "VACUUM ANALYZE "+jobs); err != nil {
		return nil, err
	}
	return out, nil
}

// waitDone waits until p has counted its target, and reports a stall when
// no job ended for flowStall.
func waitDone(ctx context.Context, p *probe) error {
	last, since := p.count.Load(), time.Now()
	for {
		select {
		case <-p.done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if n := p.count.Load(); n != last {
			last, since = n, time.Now()
		} else if time.Since(since) > flowStall {
			return fmt.Errorf("stalled: %d of %d jobs done, none for %s", n, p.target, flowStall)
		}
	}
}

// attemptRecord is one attempt as the flow executor saw it.
type attemptRecord struct {
	id         int64
	attempt    int
	start, end time.Time
	failed     bool
}

// flowExec is the flow scenario's executor: it records each attempt, fails
// the attempts fail says, and counts the others with next.
type flowExec struct {
	fail func(*executors.Job) bool // nil: none
	next *probe
	mu   sync.Mutex
	runs []attemptRecord
}

func (e *flowExec) Execute(ctx context.Context, job *executors.Job) error {
	start := time.Now()
	failed := e.fail != nil && e.fail(job)
	e.mu.Lock()
	e.runs = append(e.runs, attemptRecord{id: job.ID, attempt: job.Attempt, start: start, end: time.Now(), failed: failed})
	e.mu.Unlock()
	if failed {
		return errors.New("bench: a failed first attempt")
	}
	return e.next.Execute(ctx, job)
}

// attempts are the attempts recorded so far, by start time.
func (e *flowExec) attempts() []attemptRecord {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := slices.Clone(e.runs)
	slices.SortFunc(out, func(x, y attemptRecord) int { return x.start.Compare(y.start) })
	return out
}

// registerAsNoop makes e the no-op kind's executor of a worker's config.
func registerAsNoop(e executors.Executor) func(*pgdispatch.Config) {
	return func(c *pgdispatch.Config) { c.Registry.Register(executors.KindNoop, e) }
}

// maxInWindow is the most of times (sorted) in any window [t, t+w).
func maxInWindow(times []time.Time, w time.Duration) int {
	most, i := 0, 0
	for j := range times {
		for times[j].Sub(times[i]) >= w {
			i++
		}
		most = max(most, j-i+1)
	}
	return most
}
