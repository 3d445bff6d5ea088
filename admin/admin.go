// Package admin reads and repairs a pgdispatch queue: the numbers per queue
// and kind, job listings, and the retry and cancel of jobs. Every write locks
// its rows in id order, in batches, so it is safe while workers run.
package admin

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdispatch/pgdispatch/internal/stmttimeout"
	"github.com/pgdispatch/pgdispatch/migrations"
)

const (
	// BatchSize is how many jobs one transaction of a bulk retry touches.
	BatchSize = 1000
	// DefaultLimit is how many jobs List returns unless told.
	DefaultLimit = 50
)

// ErrNotFound means no job has the id.
var ErrNotFound = errors.New("no such job")

// Admin works on one schema's jobs.
type Admin struct {
	pool    *pgxpool.Pool
	schema  string
	jobs    string // the quoted table name
	timeout time.Duration
}

// New returns an Admin for schema's jobs on pool. timeout bounds each
// statement (default 10s).
func New(pool *pgxpool.Pool, schema string, timeout time.Duration) *Admin {
	return &Admin{pool: pool, schema: schema, jobs: pgx.Identifier{schema, "jobs"}.Sanitize(), timeout: cmp.Or(timeout, stmttimeout.Default)}
}

// sql names the schema's objects in s: {jobs}, and {schema}.name for the
// others.
func (a *Admin) sql(s string) string {
	return strings.NewReplacer("{jobs}", a.jobs, "{schema}", pgx.Identifier{a.schema}.Sanitize()).Replace(s)
}

// QueueStats are the numbers of one queue and kind.
type QueueStats struct {
	Queue   string `json:"queue"`
	Kind    string `json:"kind"`
	Pending int64  `json:"pending"` // pending, due or scheduled
	Due     int64  `json:"due"`     // of those, due now
	Running int64  `json:"running"` // leased to a worker
	// Done, Dead and Cancelled count the finished jobs the table keeps (done
	// jobs for RETAIN_DONE, the others for RETAIN_DEAD). They are nil when
	// counting them took longer than Admin's finished-count budget: they are
	// the only figures that read every kept row.
	Done      *int64 `json:"done"`
	Dead      *int64 `json:"dead"`
	Cancelled *int64 `json:"cancelled"`
	// OldestDueSeconds is the age of the oldest due pending job, from its
	// run_at; nil when none is due.
	OldestDueSeconds *float64 `json:"oldest_due_seconds"`
	// DoneLastMinute and DeadLastMinute are the jobs that finished in the
	// last minute: the throughput. Done jobs count only while they are kept
	// (RETAIN_DONE above a minute).
	DoneLastMinute int64 `json:"done_last_minute"`
	DeadLastMinute int64 `json:"dead_last_minute"`
	// Paused is true while the queue is paused (pause_queue).
	Paused bool `json:"paused"`
}

// The stats read the table three times in one snapshot. The active jobs and
// the last minute's are found through the partial indexes, so they cost the
// same however many finished jobs are kept. The finished totals read every
// kept row (0.5 s for 2 million on the project's machine), so they run last,
// under a budget of their own.
const (
	activeStatsSQL = `
SELECT queue, kind,
       count(*) FILTER (WHERE status = 'pending'),
       count(*) FILTER (WHERE status = 'pending' AND run_at <= now()),
       count(*) FILTER (WHERE status = 'running'),
       extract(epoch FROM now() - min(run_at) FILTER (WHERE status = 'pending' AND run_at <= now()))::float8
FROM (SELECT queue, kind, status, run_at FROM {jobs} WHERE status = 'pending'
      UNION ALL
      SELECT queue, kind, status, run_at FROM {jobs} WHERE status = 'running') a
GROUP BY queue, kind`

	lastMinuteStatsSQL = `
SELECT queue, kind,
       count(*) FILTER (WHERE status = 'done'),
       count(*) FILTER (WHERE status = 'dead')
FROM {jobs}
WHERE status IN ('done', 'dead') AND finished_at > now() - interval '1 minute'
GROUP BY queue, kind`

	finishedStatsSQL = `
SELECT queue, kind,
       count(*) FILTER (WHERE status = 'done'),
       count(*) FILTER (WHERE status = 'dead'),
       count(*) FILTER (WHERE status = 'cancelled')
FROM {jobs}
WHERE status IN ('done', 'dead', 'cancelled')
GROUP BY queue, kind`
)

// DefaultFinishedBudget bounds the count of finished jobs in Stats.
const DefaultFinishedBudget = 5 * time.Second

// Stats counts the jobs of every queue and kind by status, in one snapshot.
// The counts of finished jobs get budget (DefaultFinishedBudget when 0, and
// never more than the Admin's timeout); when they need longer they are left
// nil, and finishedCounted is false.
func (a *Admin) Stats(ctx context.Context, budget time.Duration) (stats []QueueStats, finishedCounted bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	tx, err := a.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, false, fmt.Errorf("stats: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	byKey := map[[2]string]*QueueStats{}
	row := func(queue, kind string) *QueueStats {
		k := [2]string{queue, kind}
		if byKey[k] == nil {
			byKey[k] = &QueueStats{Queue: queue, Kind: kind}
		}
		return byKey[k]
	}
	var (
		queue, kind         string
		pending, due        int64
		run                 int64
		oldest              *float64
		done, dead, cancels int64
	)
	rows, _ := tx.Query(ctx, a.sql(activeStatsSQL))
	if _, err := pgx.ForEachRow(rows, []any{&queue, &kind, &pending, &due, &run, &oldest}, func() error {
		s := row(queue, kind)
		s.Pending, s.Due, s.Running, s.OldestDueSeconds = pending, due, run, oldest
		return nil
	}); err != nil {
		return nil, false, fmt.Errorf("stats: active jobs: %w", err)
	}
	rows, _ = tx.Query(ctx, a.sql(lastMinuteStatsSQL))
	if _, err := pgx.ForEachRow(rows, []any{&queue, &kind, &done, &dead}, func() error {
		s := row(queue, kind)
		s.DoneLastMinute, s.DeadLastMinute = done, dead
		return nil
	}); err != nil {
		return nil, false, fmt.Errorf("stats: the last minute: %w", err)
	}

	paused := map[string]bool{}
	rows, _ = tx.Query(ctx, a.sql(`SELECT name FROM {schema}.queues WHERE paused_at IS NOT NULL`))
	if _, err := pgx.ForEachRow(rows, []any{&queue}, func() error {
		paused[queue] = true
		return nil
	}); err != nil {
		return nil, false, fmt.Errorf("stats: paused queues: %w", err)
	}

	// The budget is the server's statement_timeout, so that the scan stops
	// when it runs out and the transaction can tell why.
	budget = min(cmp.Or(budget, DefaultFinishedBudget), a.timeout)
	if _, err := tx.Exec(ctx, "SELECT set_config('statement_timeout', $1, true)",
		strconv.FormatInt(max(budget.Milliseconds(), 1), 10)); err != nil {
		return nil, false, fmt.Errorf("stats: %w", err)
	}
	// Kept apart until the count has completed: all of it applies, or none.
	var finished []QueueStats
	rows, _ = tx.Query(ctx, a.sql(finishedStatsSQL))
	_, err = pgx.ForEachRow(rows, []any{&queue, &kind, &done, &dead, &cancels}, func() error {
		finished = append(finished, QueueStats{Queue: queue, Kind: kind, Done: ptr(done), Dead: ptr(dead), Cancelled: ptr(cancels)})
		return nil
	})
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		finishedCounted = true
	case errors.As(err, &pgErr) && pgErr.Code == "57014" && ctx.Err() == nil: // query_canceled: the budget
	default:
		return nil, false, fmt.Errorf("stats: finished jobs: %w", err)
	}

	for _, f := range finished {
		s := row(f.Queue, f.Kind)
		s.Done, s.Dead, s.Cancelled = f.Done, f.Dead, f.Cancelled
	}
	for _, s := range byKey {
		s.Paused = paused[s.Queue]
		if finishedCounted && s.Done == nil { // no finished jobs of its own
			s.Done, s.Dead, s.Cancelled = ptr[int64](0), ptr[int64](0), ptr[int64](0)
		}
		stats = append(stats, *s)
	}
	slices.SortFunc(stats, func(x, y QueueStats) int {
		return cmp.Or(strings.Compare(x.Queue, y.Queue), strings.Compare(x.Kind, y.Kind))
	})
	return stats, finishedCounted, nil
}

func ptr[T any](v T) *T { return &v }

// Job is a job's row.
type Job struct {
	ID          int64           `json:"id"`
	Queue       string          `json:"queue"`
	Kind        string          `json:"kind"`
	Payload     json.RawMessage `json:"payload"`
	Priority    int16           `json:"priority"`
	RunAt       time.Time       `json:"run_at"`
	Status      string          `json:"status"`
	Attempts    int32           `json:"attempts"`
	MaxAttempts *int32          `json:"max_attempts"`
	DedupKey    *string         `json:"dedup_key"`
	// FlowKey is the key the flow limits of the job's queue apply to; nil:
	// none.
	FlowKey     *string    `json:"flow_key"`
	LastError   *string    `json:"last_error"`
	LockedBy    *string    `json:"locked_by"`
	LockedUntil *time.Time `json:"locked_until"`
	CreatedAt   time.Time  `json:"created_at"`
	UpdatedAt   time.Time  `json:"updated_at"`
	FinishedAt  *time.Time `json:"finished_at"`
	// Errors are the failed attempts, oldest first (the last 20): see
	// Attempt. Null until an attempt fails.
	Errors json.RawMessage `json:"errors"`
	// Result is what the attempt that succeeded recorded; null for none.
	Result json.RawMessage `json:"result"`
}

// AttemptsText writes j's attempts as "2/5", or "2" when its max_attempts
// is NULL (the worker's MAX_ATTEMPTS applies).
func (j Job) AttemptsText() string {
	if j.MaxAttempts == nil {
		return strconv.Itoa(int(j.Attempts))
	}
	return fmt.Sprintf("%d/%d", j.Attempts, *j.MaxAttempts)
}

// Attempt is an entry of a job's errors, as the worker writes it. A row's
// errors are written by whoever may write the row: read them leniently
// (History).
type Attempt struct {
	Attempt    int             `json:"attempt"`
	StartedAt  *time.Time      `json:"started_at"`
	FinishedAt *time.Time      `json:"finished_at"`
	Worker     string          `json:"worker"`
	Error      string          `json:"error"`
	Result     json.RawMessage `json:"result,omitempty"`
}

// History decodes j.Errors. Entries that are not objects of the worker's
// shape are left out, and counted in skipped.
func (j Job) History() (entries []Attempt, skipped int) {
	var raw []json.RawMessage
	if len(j.Errors) == 0 || json.Unmarshal(j.Errors, &raw) != nil {
		if len(j.Errors) > 0 && string(j.Errors) != "null" {
			skipped = 1
		}
		return nil, skipped
	}
	for _, r := range raw {
		var e Attempt
		if json.Unmarshal(r, &e) != nil {
			skipped++
			continue
		}
		entries = append(entries, e)
	}
	return entries, skipped
}

const jobColumns = `id, queue, kind, payload, priority, run_at, status, attempts, max_attempts, dedup_key, flow_key,
       last_error, locked_by, locked_until, created_at, updated_at, finished_at, errors, result`

func scanJob(row pgx.CollectableRow) (Job, error) {
	var j Job
	err := row.Scan(&j.ID, &j.Queue, &j.Kind, &j.Payload, &j.Priority, &j.RunAt, &j.Status, &j.Attempts,
		&j.MaxAttempts, &j.DedupKey, &j.FlowKey, &j.LastError, &j.LockedBy, &j.LockedUntil, &j.CreatedAt, &j.UpdatedAt, &j.FinishedAt,
		&j.Errors, &j.Result)
	return j, err
}

// Filter selects jobs. Empty fields select everything.
type Filter struct {
	Statuses []string
	Queue    string
	Kind     string
	// Limit is the most jobs returned, newest first. Default: DefaultLimit.
	Limit int
}

// Statuses are the statuses a job can have.
var Statuses = []string{"pending", "running", "done", "dead", "cancelled"}

// List returns the newest jobs that f selects.
func (a *Admin) List(ctx context.Context, f Filter) ([]Job, error) {
	for _, s := range f.Statuses {
		if !slices.Contains(Statuses, s) {
			return nil, fmt.Errorf("unknown status %q: want one of %s", s, strings.Join(Statuses, ", "))
		}
	}
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	var statuses []string // nil selects all
	if len(f.Statuses) > 0 {
		statuses = f.Statuses
	}
	rows, err := a.pool.Query(ctx, a.sql(`SELECT `+jobColumns+` FROM {jobs}
		WHERE ($1::text[] IS NULL OR status = ANY($1)) AND ($2 = '' OR queue = $2) AND ($3 = '' OR kind = $3)
		ORDER BY id DESC LIMIT $4`), statuses, f.Queue, f.Kind, cmp.Or(f.Limit, DefaultLimit))
	if err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	jobs, err := pgx.CollectRows(rows, scanJob)
	if err != nil {
		return nil, fmt.Errorf("list jobs: %w", err)
	}
	return jobs, nil
}

// Get returns job id, or ErrNotFound.
func (a *Admin) Get(ctx context.Context, id int64) (Job, error) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	rows, err := a.pool.Query(ctx, a.sql(`SELECT `+jobColumns+` FROM {jobs} WHERE id = $1`), id)
	if err != nil {
		return Job{}, fmt.Errorf("job %d: %w", id, err)
	}
	j, err := pgx.CollectExactlyOneRow(rows, scanJob)
	if errors.Is(err, pgx.ErrNoRows) {
		return Job{}, fmt.Errorf("job %d: %w", id, ErrNotFound)
	}
	if err != nil {
		return Job{}, fmt.Errorf("job %d: %w", id, err)
	}
	return j, nil
}

// Change is what a retry or cancel did to one job.
type Change struct {
	ID int64 `json:"id"`
	// Status is the job's status before; empty when there is no such job.
	Status string `json:"status"`
	// Changed is false when the job was left as it was: not found, or in a
	// status the operation does not apply to.
	Changed bool `json:"changed"`
}

// retrySet makes a job pending and due now. A job whose attempts are used
// up gets one more, within the table's bound (migrations.AttemptsLimit): at
// the bound a claim counts no further, so the job keeps its one more.
var retrySet = `status = 'pending',
    run_at = now(),
    max_attempts = CASE WHEN j.max_attempts IS NOT NULL AND j.attempts >= j.max_attempts
                        THEN least(j.attempts + 1, ` + strconv.Itoa(migrations.AttemptsLimit) + `) ELSE j.max_attempts END,
    finished_at = NULL,
    locked_by = NULL,
    locked_until = NULL,
    updated_at = now()`

// Retry makes the dead or cancelled jobs among ids pending and due now,
// each with at least one more attempt; last_error keeps the last failure.
// Jobs in other statuses are left as they are.
//
// Only the rows it changes are locked; the others are read.
func (a *Admin) Retry(ctx context.Context, ids []int64) ([]Change, error) {
	return a.change(ctx, ids, "retry", `WITH s AS (
	    SELECT id, status FROM {jobs} WHERE id = ANY($1)
	), l AS (
	    SELECT id, status FROM {jobs} WHERE id = ANY($1) AND status IN ('dead', 'cancelled') ORDER BY id FOR UPDATE
	), u AS (
	    UPDATE {jobs} j SET `+retrySet+`
	    FROM l WHERE j.id = l.id
	    RETURNING j.id
	)
	SELECT s.id, coalesce(l.status, s.status), u.id IS NOT NULL
	FROM s LEFT JOIN l ON l.id = s.id LEFT JOIN u ON u.id = s.id ORDER BY s.id`)
}

// Cancel makes the pending and running jobs among ids cancelled, through
// the SQL function cancel(). A running job's worker is notified: it
// cancels the executor's context within milliseconds and drops its
// outcome, and the attempt goes into the job's errors.
func (a *Admin) Cancel(ctx context.Context, ids []int64) ([]Change, error) {
	return a.change(ctx, ids, "cancel", `SELECT id, previous_status, cancelled FROM {schema}.cancel(VARIADIC $1::bigint[])`)
}

// change runs a per-id statement over ids in batches, in id order, and
// reports each id, found or not. The statement takes the batch as $1, and
// args after it.
func (a *Admin) change(ctx context.Context, ids []int64, what, stmt string, args ...any) ([]Change, error) {
	ids = slices.Clone(ids)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	out := make([]Change, 0, len(ids))
	for batch := range slices.Chunk(ids, BatchSize) {
		found, err := a.changeBatch(ctx, batch, what, stmt, args...)
		if err != nil {
			return out, err
		}
		for _, id := range batch {
			c, ok := found[id]
			if !ok {
				c = Change{ID: id}
			}
			out = append(out, c)
		}
	}
	return out, nil
}

func (a *Admin) changeBatch(ctx context.Context, ids []int64, what, stmt string, args ...any) (map[int64]Change, error) {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	rows, err := a.pool.Query(ctx, a.sql(stmt), append([]any{ids}, args...)...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	found := map[int64]Change{}
	var c Change
	_, err = pgx.ForEachRow(rows, []any{&c.ID, &c.Status, &c.Changed}, func() error {
		found[c.ID] = c
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return found, nil
}

// RetryDead retries every dead job of queue and kind (empty: all), as
// RetryDeadMatching does. It returns how many it retried.
func (a *Admin) RetryDead(ctx context.Context, queue, kind string) (int64, error) {
	return a.RetryDeadMatching(ctx, DeadFilter{Queue: queue, Kind: kind})
}
