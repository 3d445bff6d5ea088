package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// flowStartsSQL records, in the schema's bench_starts, each job's key and
// the time the claim took it (its updated_at, the time the rate limit
// counts by): a trigger on the jobs table, for the bench only.
const flowStartsSQL = `
CREATE TABLE {schema}.bench_starts (key text, at timestamptz NOT NULL);
CREATE FUNCTION {schema}.bench_start() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.bench_starts (key, at) VALUES (NEW.flow_key, NEW.updated_at);
    RETURN NULL;
END $$;
CREATE TRIGGER bench_start AFTER UPDATE OF status ON {jobs}
    FOR EACH ROW WHEN (NEW.status = 'running' AND OLD.status <> 'running')
    EXECUTE FUNCTION {schema}.bench_start();`

// flowRate: flowRateKeys keys, each limited to FlowRate starts a second,
// FlowWorkers workers for FlowRateDuration over more jobs than the limit
// lets start. The starts are counted twice: at the executor's start times,
// and (claimed) at the times of the claims in the database (bench_starts),
// the times the limit counts by.
func (b *bench) flowRate(ctx context.Context) (*Result, error) {
	schema, drop, err := b.schema(ctx)
	if err != nil {
		return nil, err
	}
	defer drop()
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	r := strings.NewReplacer("{schema}", pgx.Identifier{schema}.Sanitize(), "{jobs}", jobs)
	if _, err := b.pool.Exec(ctx, r.Replace(flowStartsSQL)); err != nil {
		return nil, fmt.Errorf("bench_starts: %w", err)
	}
	secs := b.opts.FlowRateDuration.Seconds()
	perKey := b.opts.FlowRate * (int(secs) + 3)
	keys, err := b.insertFlowJobs(ctx, schema, "r", perKey*flowRateKeys, flowRateKeys)
	if err != nil {
		return nil, err
	}
	if err := b.flowLimit(ctx, schema, 0, false, b.opts.FlowRate, time.Second); err != nil {
		return nil, err
	}
	var dbStart time.Time
	if err := b.pool.QueryRow(ctx, "SELECT now()").Scan(&dbStart); err != nil {
		return nil, err
	}
	p := newCounter(0)
	e := &flowExec{next: p}
	start := time.Now()
	stop, err := b.flowWorkers(ctx, schema, b.opts.FlowWorkers, p, registerAsNoop(e))
	if err != nil {
		return nil, err
	}
	select {
	case <-time.After(time.Until(start.Add(b.opts.FlowRateDuration))): // the part's length
	case <-ctx.Done():
	}
	stop()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// the executor's starts in the part's length
	local := map[string][]time.Time{}
	for _, a := range e.attempts() {
		if a.start.Before(start.Add(b.opts.FlowRateDuration)) {
			local[keys[a.id]] = append(local[keys[a.id]], a.start)
		}
	}
	// the claims' starts in the part's length, on the server's clock
	rows, err := b.pool.Query(ctx, "SELECT key, at FROM "+pgx.Identifier{schema, "bench_starts"}.Sanitize()+" WHERE at < $1 ORDER BY at",
		dbStart.Add(b.opts.FlowRateDuration))
	if err != nil {
		return nil, err
	}
	claimed := map[string][]time.Time{}
	var (
		key string
		at  time.Time
	)
	if _, err := pgx.ForEachRow(rows, []any{&key, &at}, func() error { claimed[key] = append(claimed[key], at); return nil }); err != nil {
		return nil, fmt.Errorf("read bench_starts: %w", err)
	}
	mostClaimed, totalClaimed := windows(claimed)
	mostLocal, totalLocal := windows(local)
	expected := float64(flowRateKeys*b.opts.FlowRate) * secs
	res := &Result{Scenario: "flow_rate", Conditions: fmt.Sprintf("%d keys, each at most %d starts a second (set_flow_limit rate %d per 1s), %d workers, CONCURRENCY=%d each, for %s; starts at the executor's times, and (claimed) at the claims' times in the database",
		flowRateKeys, b.opts.FlowRate, b.opts.FlowRate, b.opts.FlowWorkers, b.base.Concurrency, b.opts.FlowRateDuration)}
	res.set("max_starts_in_any_1s_window", float64(mostLocal))
	res.set("total_starts", float64(totalLocal))
	res.set("expected", expected)
	res.set("total_vs_expected", float64(totalLocal)/expected)
	res.set("max_starts_in_any_1s_window_claimed", float64(mostClaimed))
	res.set("total_starts_claimed", float64(totalClaimed))
	return res, nil
}

// windows is the most starts of a key in any one-second window, and the
// starts of every key.
func windows(starts map[string][]time.Time) (most, total int) {
	for _, ts := range starts {
		slices.SortFunc(ts, time.Time.Compare)
		most = max(most, maxInWindow(ts, time.Second))
		total += len(ts)
	}
	return most, total
}
