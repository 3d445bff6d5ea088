package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdispatch/pgdispatch"
)

// tableHealth is one sample of the jobs table's size and dead rows.
type tableHealth struct {
	tableBytes, indexBytes int64
	live, dead             int64
	autovacuums            int64
}

func (b *bench) tableHealth(ctx context.Context, schema string) (tableHealth, error) {
	var h tableHealth
	// pg_stat_user_tables is refreshed by the statistics collector, within
	// a second or so of a backend's activity.
	err := b.pool.QueryRow(ctx, `
SELECT pg_relation_size(c.oid), pg_indexes_size(c.oid),
       coalesce(s.n_live_tup, 0), coalesce(s.n_dead_tup, 0), coalesce(s.autovacuum_count, 0)
FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
WHERE c.oid = $1::regclass`, pgx.Identifier{schema, "jobs"}.Sanitize()).
		Scan(&h.tableBytes, &h.indexBytes, &h.live, &h.dead, &h.autovacuums)
	return h, err
}

// soak: writers at full speed and a worker for minutes, sampling the jobs
// table's size, its indexes' size and its dead rows once a minute. With done
// jobs purged (RETAIN_DONE, SWEEP_INTERVAL), the sizes must level off
// instead of growing with the jobs written.
func (b *bench) soak(ctx context.Context) ([]*Result, error) {
	schema, p, cleanup, err := b.worker(ctx, 0, nil)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	first, err := b.tableHealth(ctx, schema)
	if err != nil {
		return nil, err
	}
	r := &Result{Scenario: "soak", Conditions: fmt.Sprintf("%d writers for %s, one job per transaction, RETAIN_DONE=%s, SWEEP_INTERVAL=%s",
		b.opts.SoakWriters, b.opts.SoakDuration, b.retainSetting(), b.base.SweepInterval)}

	type loaded struct {
		jobs int
		err  error
	}
	done := make(chan loaded, 1)
	go func() {
		committed, _, err := b.writerLoad(ctx, schema, b.opts.SoakWriters, b.opts.SoakDuration, false)
		done <- loaded{len(committed), err}
	}()
	var (
		maxTable, maxIndex, maxDead int64
		samples                     []tableHealth
	)
	tick := time.NewTicker(min(time.Minute, b.opts.SoakDuration/4+time.Second))
	defer tick.Stop()
	var result loaded
	for waiting := true; waiting; {
		select {
		case result = <-done:
			waiting = false
		case <-tick.C:
		}
		h, err := b.tableHealth(ctx, schema)
		if err != nil {
			return nil, err
		}
		samples = append(samples, h)
		maxTable, maxIndex, maxDead = max(maxTable, h.tableBytes), max(maxIndex, h.indexBytes), max(maxDead, h.dead)
		fmt.Fprintf(b.log, "bench: soak: table %.1f MB, indexes %.1f MB, live %d, dead %d, autovacuums %d, jobs done %d\n",
			mb(h.tableBytes), mb(h.indexBytes), h.live, h.dead, h.autovacuums, p.count.Load())
	}
	if result.err != nil {
		return nil, result.err
	}
	mid, last := samples[len(samples)/2], samples[len(samples)-1]
	r.set("jobs_written", float64(result.jobs))
	r.set("jobs_per_s", float64(result.jobs)/b.opts.SoakDuration.Seconds())
	r.set("table_mb_start", mb(first.tableBytes))
	r.set("table_mb_halfway", mb(mid.tableBytes))
	r.set("table_mb_end", mb(last.tableBytes))
	r.set("table_mb_max", mb(maxTable))
	r.set("indexes_mb_halfway", mb(mid.indexBytes))
	r.set("indexes_mb_end", mb(last.indexBytes))
	r.set("indexes_mb_max", mb(maxIndex))
	r.set("live_rows_end", float64(last.live))
	r.set("dead_rows_end", float64(last.dead))
	r.set("dead_rows_max", float64(maxDead))
	r.set("autovacuums", float64(last.autovacuums))
	return []*Result{r}, nil
}

func mb(b int64) float64 { return float64(b) / (1 << 20) }

func (b *bench) retainSetting() string {
	if b.base.RetainDone == pgdispatch.RetainDoneNone {
		return "0"
	}
	return b.base.RetainDone.String()
}

// setDeleteDone makes c delete each job as soon as it is done, or keep
// done jobs for the sweeper.
func setDeleteDone(c *pgdispatch.Config, on bool) {
	switch {
	case on:
		c.RetainDone = pgdispatch.RetainDoneNone
	case c.RetainDone == pgdispatch.RetainDoneNone:
		c.RetainDone = 0
	}
}
