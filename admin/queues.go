package admin

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdispatch/pgdispatch/migrations"
)

// Pause pauses queue (pause_queue() in SQL): from the next claim on, no
// worker claims its jobs, which are still accepted; running jobs finish.
// It reports whether the queue was active before.
func (a *Admin) Pause(ctx context.Context, queue string) (bool, error) {
	return a.queueCall(ctx, "pause", `SELECT {schema}.pause_queue($1)`, queue)
}

// Resume makes queue active again and wakes its workers (resume_queue()
// in SQL). It reports whether the queue was paused.
func (a *Admin) Resume(ctx context.Context, queue string) (bool, error) {
	return a.queueCall(ctx, "resume", `SELECT {schema}.resume_queue($1)`, queue)
}

func (a *Admin) queueCall(ctx context.Context, what, sql, queue string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	var changed bool
	if err := a.pool.QueryRow(ctx, a.sql(sql), queue).Scan(&changed); err != nil {
		return false, fmt.Errorf("%s queue %q: %w", what, queue, err)
	}
	return changed, nil
}

// QueueKnown reports whether anything names queue: a job of any status, a
// schedule, a dispatch trigger, a row of the queues table (it was paused
// once), or a worker that serves it now (its claimer holds or waits for
// the queue's sleep key, as one does while the queue is empty). A name
// nothing knows is most likely mistyped. It may read every row of the jobs
// table, within the statement's timeout.
func (a *Admin) QueueKnown(ctx context.Context, queue string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	var known bool
	err := a.pool.QueryRow(ctx, a.sql(`
-- Pending jobs first, by the claim's index: the usual case, without a scan.
SELECT EXISTS (SELECT FROM {schema}.queues WHERE name = $1)
    OR EXISTS (SELECT FROM {jobs} WHERE queue = $1 AND status = 'pending')
    OR EXISTS (SELECT FROM {jobs} WHERE queue = $1)
    OR EXISTS (SELECT FROM {schema}.schedules WHERE queue = $1)
    OR EXISTS (SELECT FROM {schema}.event_triggers WHERE queue = $1)
    OR EXISTS (SELECT FROM pg_catalog.pg_locks
               WHERE locktype = 'advisory' AND objsubid = 2
                 AND database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = current_database())
                 AND classid = ($2::int8 & 4294967295)::oid
                 AND objid = (hashtext($1)::int8 & 4294967295)::oid)`),
		queue, migrations.SleepKey(a.schema)).Scan(&known)
	if err != nil {
		return false, fmt.Errorf("look for queue %q: %w", queue, err)
	}
	return known, nil
}

// QueueState is a queue as `queues list` shows it.
type QueueState struct {
	Name string `json:"name"`
	// PausedAt is when the queue was paused; nil while it is active.
	PausedAt *time.Time `json:"paused_at"`
	Pending  int64      `json:"pending"`
	Running  int64      `json:"running"`
}

// Queues lists the queues that hold pending or running jobs, or are
// paused, with their state, in name order.
func (a *Admin) Queues(ctx context.Context) ([]QueueState, error) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	rows, _ := a.pool.Query(ctx, a.sql(`
WITH a AS (
    SELECT queue, count(*) FILTER (WHERE status = 'pending') AS pending,
           count(*) FILTER (WHERE status = 'running') AS running
    FROM (SELECT queue, status FROM {jobs} WHERE status = 'pending'
          UNION ALL
          SELECT queue, status FROM {jobs} WHERE status = 'running') s
    GROUP BY queue
)
SELECT coalesce(q.name, a.queue), q.paused_at, coalesce(a.pending, 0), coalesce(a.running, 0)
FROM {schema}.queues q FULL JOIN a ON a.queue = q.name
WHERE q.paused_at IS NOT NULL OR a.queue IS NOT NULL
ORDER BY 1`))
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (QueueState, error) {
		var q QueueState
		err := row.Scan(&q.Name, &q.PausedAt, &q.Pending, &q.Running)
		return q, err
	})
	if err != nil {
		return nil, fmt.Errorf("list queues: %w", err)
	}
	return out, nil
}

// Snooze makes the pending jobs among ids due after d from now, without
// spending an attempt (snooze() in SQL), and reports each id.
func (a *Admin) Snooze(ctx context.Context, ids []int64, d time.Duration) ([]Change, error) {
	if d < 0 {
		return nil, fmt.Errorf("snooze: the delay must be zero or more, not %s", d)
	}
	return a.change(ctx, ids, "snooze", `WITH l AS (
	    SELECT id, status FROM {jobs} WHERE id = ANY($1) ORDER BY id FOR UPDATE
	)
	SELECT l.id, l.status, l.status = 'pending' AND {schema}.snooze(l.id, make_interval(secs => $2::float8))
	FROM l ORDER BY l.id`, d.Seconds())
}
