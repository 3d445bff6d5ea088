package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Live is the state of the queues and workers that a console shows and
// keeps current: what one statement reads from the partial indexes of the
// active jobs and of the last minute's finished ones, whatever the number
// of finished jobs kept.
type Live struct {
	Queues  []LiveQueue `json:"queues"`
	Workers []Worker    `json:"workers"`
	// MaxID is the newest job's id: it moves with every insert.
	MaxID int64 `json:"max_id"`
}

// LiveQueue is one queue's part of Live.
type LiveQueue struct {
	Queue   string `json:"queue"`
	Pending int64  `json:"pending"`
	Due     int64  `json:"due"`
	Running int64  `json:"running"`
	// OldestDueSeconds is the age of the oldest due job (the lag); nil
	// when none is due.
	OldestDueSeconds *float64 `json:"oldest_due_seconds"`
	DoneLastMinute   int64    `json:"done_last_minute"`
	DeadLastMinute   int64    `json:"dead_last_minute"`
	Paused           bool     `json:"paused"`
}

// Worker is a worker that holds running jobs, from their rows' locked_by.
// A worker with nothing running leaves no trace in the table.
type Worker struct {
	Name    string `json:"name"`
	Running int64  `json:"running"`
	// Jobs are the first running jobs' ids and kinds, up to 20.
	Jobs []WorkerJob `json:"jobs"`
	// LeaseUntil is the latest lease it holds: it renews them every third
	// of the lease while it is alive.
	LeaseUntil time.Time `json:"lease_until"`
}

// WorkerJob is a job a Worker runs.
type WorkerJob struct {
	ID   int64  `json:"id"`
	Kind string `json:"kind"`
}

const liveSQL = `
WITH a AS (
    SELECT queue, status, run_at FROM {jobs} WHERE status = 'pending'
    UNION ALL
    SELECT queue, status, run_at FROM {jobs} WHERE status = 'running'
), act AS (
    SELECT queue,
           count(*) FILTER (WHERE status = 'pending') AS pending,
           count(*) FILTER (WHERE status = 'pending' AND run_at <= now()) AS due,
           count(*) FILTER (WHERE status = 'running') AS running,
           extract(epoch FROM now() - min(run_at) FILTER (WHERE status = 'pending' AND run_at <= now()))::float8 AS oldest
    FROM a GROUP BY queue
), fin AS (
    SELECT queue, count(*) FILTER (WHERE status = 'done') AS done, count(*) FILTER (WHERE status = 'dead') AS dead
    FROM {jobs} WHERE status IN ('done', 'dead') AND finished_at > now() - interval '1 minute'
    GROUP BY queue
), q AS (
    SELECT coalesce(act.queue, fin.queue, p.name) AS queue,
           coalesce(act.pending, 0) AS pending, coalesce(act.due, 0) AS due, coalesce(act.running, 0) AS running,
           act.oldest AS oldest_due_seconds,
           coalesce(fin.done, 0) AS done_last_minute, coalesce(fin.dead, 0) AS dead_last_minute,
           p.paused_at IS NOT NULL AS paused
    FROM act FULL JOIN fin ON fin.queue = act.queue
         FULL JOIN {schema}.queues p ON p.name = coalesce(act.queue, fin.queue)
), r AS (
    SELECT id, kind, locked_by, locked_until,
           row_number() OVER (PARTITION BY locked_by ORDER BY id) AS n,
           count(*) OVER (PARTITION BY locked_by) AS running
    FROM {jobs} WHERE status = 'running' AND locked_by IS NOT NULL
), w AS (
    SELECT locked_by AS name, max(running) AS running,
           json_agg(json_build_object('id', id, 'kind', kind) ORDER BY id) FILTER (WHERE n <= 20) AS jobs,
           max(locked_until) AS lease_until
    FROM r GROUP BY locked_by
)
SELECT json_build_object(
    'queues', coalesce((SELECT json_agg(q ORDER BY q.queue) FROM q WHERE q.pending + q.running + q.done_last_minute + q.dead_last_minute > 0 OR q.paused), '[]'),
    'workers', coalesce((SELECT json_agg(w ORDER BY w.name) FROM w), '[]'),
    'max_id', coalesce((SELECT max(id) FROM {jobs}), 0))`

// Live reads the queues' and workers' state in one statement.
func (a *Admin) Live(ctx context.Context) (Live, error) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	var raw []byte
	if err := a.pool.QueryRow(ctx, a.sql(liveSQL)).Scan(&raw); err != nil {
		return Live{}, fmt.Errorf("live state: %w", err)
	}
	var l Live
	if err := json.Unmarshal(raw, &l); err != nil {
		return Live{}, fmt.Errorf("live state: %w", err)
	}
	return l, nil
}

// Minute is one queue's finished jobs in one minute.
type Minute struct {
	Queue  string    `json:"queue"`
	Minute time.Time `json:"minute"`
	Done   int64     `json:"done"`
	Dead   int64     `json:"dead"`
}

// LastHour counts each queue's done and dead jobs per minute over the last
// hour, from jobs_finished_idx. Done jobs count while they are kept
// (RETAIN_DONE). Minutes without any are left out.
func (a *Admin) LastHour(ctx context.Context) ([]Minute, error) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	rows, _ := a.pool.Query(ctx, a.sql(`
SELECT queue, date_trunc('minute', finished_at),
       count(*) FILTER (WHERE status = 'done'), count(*) FILTER (WHERE status = 'dead')
FROM {jobs}
WHERE status IN ('done', 'dead') AND finished_at > date_trunc('minute', now()) - interval '59 minutes'
GROUP BY 1, 2 ORDER BY 1, 2`))
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Minute])
	if err != nil {
		return nil, fmt.Errorf("the last hour: %w", err)
	}
	return out, nil
}
