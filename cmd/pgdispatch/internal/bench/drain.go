package bench

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdispatch/pgdispatch"
)

// drain: N jobs inserted first, then one worker, timed until all are done;
// with done jobs deleted at once (RETAIN_DONE=0) and kept (RETAIN_DONE=24h).
func (b *bench) drain(ctx context.Context) ([]*Result, error) {
	var out []*Result
	for _, deleteDone := range []bool{true, false} {
		schema, drop, err := b.schema(ctx)
		if err != nil {
			return nil, err
		}
		jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
		if _, err := b.pool.Exec(ctx, "INSERT INTO "+jobs+" (kind) SELECT 'noop' FROM generate_series(1, $1)", b.opts.DrainJobs); err != nil {
			drop()
			return nil, err
		}
		if _, err := b.pool.Exec(ctx, "VACUUM ANALYZE "+jobs); err != nil {
			drop()
			return nil, err
		}
		p := newCounter(int64(b.opts.DrainJobs))
		start := time.Now()
		stop, err := b.runWorker(ctx, schema, p, func(c *pgdispatch.Config) { setDeleteDone(c, deleteDone) })
		if err != nil {
			drop()
			return nil, err
		}
		select {
		case <-p.done:
		case <-ctx.Done():
			stop()
			drop()
			return nil, ctx.Err()
		}
		executed := time.Since(start)
		stats := p.worker.Claimer(pgdispatch.DefaultQueue).Stats()
		stop() // writes the last outcomes
		recorded := time.Since(start)
		var left int64
		_ = b.pool.QueryRow(ctx, "SELECT count(*) FROM "+jobs+" WHERE status <> 'done'").Scan(&left)
		drop()
		retain := "RETAIN_DONE=24h (done jobs kept)"
		if deleteDone {
			retain = "RETAIN_DONE=0 (done jobs deleted)"
		}
		r := &Result{Scenario: "drain", Conditions: fmt.Sprintf("%d jobs, one worker, CONCURRENCY=%d, %s", b.opts.DrainJobs, b.base.Concurrency, retain)}
		r.set("jobs_per_s", float64(b.opts.DrainJobs)/executed.Seconds())
		r.set("jobs_per_s_recorded", float64(b.opts.DrainJobs)/recorded.Seconds())
		r.set("seconds", executed.Seconds())
		r.set("jobs_per_claim", float64(stats.Claimed)/float64(max(stats.Claims, 1)))
		r.set("not_done_after", float64(left))
		out = append(out, r)
	}
	return out, nil
}

// floorSQL is a procedure that drains the queue as a worker does, with the
// same row writes, inside the server: no network, no client, no executor.
// Each loop claims up to $1 due jobs (FOR UPDATE SKIP LOCKED, then running,
// the attempt counted, a lease) and commits without waiting for its WAL
// flush, then records them done and commits with it, as the claimer and the
// completer do. The statements mirror the claimer's (claimer/claim.go and
// claimer/internal/completer) in the rows and columns they write; the
// claimer's own also report the next run_at and skipped rows, and bound the
// payload bytes.
const floorSQL = `
CREATE PROCEDURE {schema}.bench_floor(batch int) LANGUAGE plpgsql AS $$
DECLARE
    claimed_ids bigint[];
    claimed_attempts int[];
BEGIN
    LOOP
        PERFORM set_config('synchronous_commit', 'off', true);
        WITH c AS (
            SELECT ctid FROM {jobs}
            WHERE status = 'pending' AND queue = 'default' AND run_at <= now()
            ORDER BY priority, run_at, id
            LIMIT batch
            FOR UPDATE SKIP LOCKED
        ), u AS (
            UPDATE {jobs} j
            SET status = 'running', attempts = least(j.attempts, 999999) + 1, max_attempts = coalesce(j.max_attempts, 5),
                locked_by = 'bench-floor', locked_until = now() + interval '30 seconds', updated_at = now()
            WHERE j.ctid = ANY(ARRAY(SELECT ctid FROM c))
            RETURNING j.id, j.attempts
        )
        SELECT array_agg(u.id ORDER BY u.id), array_agg(u.attempts ORDER BY u.id) INTO claimed_ids, claimed_attempts FROM u;
        EXIT WHEN claimed_ids IS NULL;
        COMMIT;
        UPDATE {jobs} j
        SET status = 'done', finished_at = now(), locked_by = NULL, locked_until = NULL, updated_at = now()
        FROM unnest(claimed_ids, claimed_attempts) AS v(id, attempt)
        WHERE j.id = v.id AND (j.status = 'running' AND j.locked_by = 'bench-floor' AND j.attempts = v.attempt) IS TRUE;
        COMMIT;
    END LOOP;
END $$`

// floor: the in-server floor of a drain with done jobs kept (floorSQL), as
// a share of which the drain's figure reads.
func (b *bench) floor(ctx context.Context) ([]*Result, error) {
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
	r := strings.NewReplacer("{schema}", pgx.Identifier{schema}.Sanitize(), "{jobs}", jobs)
	if _, err := b.pool.Exec(ctx, r.Replace(floorSQL)); err != nil {
		return nil, err
	}
	conn, err := b.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	if _, err := conn.Exec(ctx, "SET statement_timeout = 0"); err != nil {
		return nil, err
	}
	start := time.Now()
	if _, err := conn.Exec(ctx, "CALL "+pgx.Identifier{schema}.Sanitize()+".bench_floor($1)", b.base.Concurrency); err != nil {
		return nil, err
	}
	took := time.Since(start)
	res := &Result{Scenario: "floor", Conditions: fmt.Sprintf("%d jobs claimed %d at a time and recorded done (kept) by a PL/pgSQL procedure in the server",
		b.opts.DrainJobs, b.base.Concurrency)}
	res.set("jobs_per_s", float64(b.opts.DrainJobs)/took.Seconds())
	return []*Result{res}, nil
}
