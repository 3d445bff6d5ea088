package pgdispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgdispatch/pgdispatch/internal/tracing"
	"github.com/pgdispatch/pgdispatch/migrations"
)

// DB is what Enqueue needs of a database handle: a *pgxpool.Pool, a *pgx.Conn
// or a pgx.Tx. Inside a transaction, the job commits or rolls back with it.
type DB interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Job describes a job to enqueue. Kind is required; every other field has the
// table's default when left zero.
type Job struct {
	Kind string
	// Payload is the executor's input. A json.RawMessage or []byte is sent as
	// it is; anything else is marshalled to JSON. Default: {}.
	Payload any
	// Queue defaults to "default".
	Queue string
	// RunAt is when the job becomes due. Default: now.
	RunAt time.Time
	// Priority: smaller runs first. Default: 0.
	Priority int16
	// DedupKey makes the enqueue idempotent: while a job with the same key
	// exists, Enqueue returns its id and inserts nothing.
	DedupKey string
	// MaxAttempts defaults to the worker's MAX_ATTEMPTS; at most
	// migrations.AttemptsLimit.
	MaxAttempts int
	// TraceParent and TraceState are the W3C Trace Context of the writer's
	// span: a worker with tracing on traces the job's attempts as its
	// children (docs/operations.md, "Tracing"). Default: those of the span
	// the context passed to Enqueue carries (OpenTelemetry), if any. A
	// worker ignores a malformed TraceParent; the table refuses one longer
	// than 128 bytes, and a TraceState longer than 512.
	TraceParent, TraceState string
	// FlowKey is the key the flow limits of the job's queue apply to, such
	// as the customer or the receiving host (docs/operations.md, "Flow
	// control"): 1 to 256 characters. Default: none.
	FlowKey string
}

// Enqueue inserts job into the default schema and returns its id, or the id
// of the job that already holds job.DedupKey.
func Enqueue(ctx context.Context, db DB, job Job) (int64, error) {
	return Schema(DefaultSchema).Enqueue(ctx, db, job)
}

// EnqueueChecked is Enqueue that also says whether the job was created, and
// whether a job holding job.DedupKey is the one asked for.
func EnqueueChecked(ctx context.Context, db DB, job Job) (Enqueued, error) {
	return Schema(DefaultSchema).EnqueueChecked(ctx, db, job)
}

// Enqueued is what EnqueueChecked did.
type Enqueued struct {
	// ID is the job created, or the one that holds the dedup key.
	ID int64
	// Created is false when a job already held the dedup key.
	Created bool
	// Conflict is true when the job that holds the dedup key is not the one
	// asked for: another role created it (the role this session logged in
	// as did not, and may not read the table), or it has another kind,
	// queue, payload, priority or flow key, another max_attempts (when
	// MaxAttempts is set), or it has not run yet and is due later than asked. Another
	// writer of the table may have taken the key first, so that this job is
	// never created (docs/security.md). Nothing else of a job another role
	// created is compared or told.
	Conflict bool
}

// Schema names a pgdispatch installation by its schema, for programs that use
// one other than DefaultSchema.
type Schema string

// Enqueue inserts job into schema s; see the package-level Enqueue.
func (s Schema) Enqueue(ctx context.Context, db DB, job Job) (int64, error) {
	var id int64
	err := s.call(ctx, db, "enqueue", job, &id)
	return id, err
}

// EnqueueChecked inserts job into schema s; see the package-level
// EnqueueChecked.
func (s Schema) EnqueueChecked(ctx context.Context, db DB, job Job) (Enqueued, error) {
	var e Enqueued
	err := s.call(ctx, db, "enqueue_checked", job, &e.ID, &e.Created, &e.Conflict)
	return e, err
}

// call runs the SQL function fn of schema s (enqueue or enqueue_checked)
// for job, and scans its result into dest.
func (s Schema) call(ctx context.Context, db DB, fn string, job Job, dest ...any) error {
	if job.Kind == "" {
		return errors.New("enqueue: Kind is required")
	}
	if job.MaxAttempts < 0 || job.MaxAttempts > migrations.AttemptsLimit {
		return fmt.Errorf("enqueue: MaxAttempts %d: must be from 0 (the worker's MAX_ATTEMPTS) to %d", job.MaxAttempts, migrations.AttemptsLimit)
	}
	payload, err := encodePayload(job.Payload)
	if err != nil {
		return fmt.Errorf("enqueue: payload: %w", err)
	}
	if job.TraceParent == "" {
		job.TraceParent, job.TraceState = tracing.Headers(ctx)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultStatementTimeout)
		defer cancel()
	}
	args := []any{
		job.Kind, payload, nilIfZero(job.Queue), nilIfZero(job.RunAt),
		job.Priority, nilIfZero(job.DedupKey), nilIfZero(int32(job.MaxAttempts)), //nolint:gosec // checked above
		nilIfZero(job.TraceParent), nilIfZero(job.TraceState),
	}
	sql := "SELECT * FROM " + pgx.Identifier{string(s), fn}.Sanitize() +
		"(kind => $1, payload => $2, queue => $3, run_at => $4, priority => $5, dedup_key => $6, max_attempts => $7, " +
		"traceparent => $8, tracestate => $9"
	// Named only when set, so that a job without a key enqueues into a
	// schema older than migration 16 too.
	if job.FlowKey != "" {
		sql += ", flow_key => $10"
		args = append(args, job.FlowKey)
	}
	err = db.QueryRow(ctx, sql+")", args...).Scan(dest...)
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && (pgErr.Code == "3F000" || pgErr.Code == "42883"): // no such schema, no such function
		return migrations.SchemaMissing(string(s))
	case err != nil:
		return fmt.Errorf("enqueue %s job: %w", job.Kind, err)
	}
	return nil
}

func encodePayload(p any) ([]byte, error) {
	switch p := p.(type) {
	case nil:
		return []byte("{}"), nil
	case json.RawMessage:
		if !json.Valid(p) {
			return nil, errors.New("not valid JSON")
		}
		return p, nil
	case []byte:
		if !json.Valid(p) {
			return nil, errors.New("not valid JSON")
		}
		return p, nil
	default:
		return json.Marshal(p)
	}
}

func nilIfZero[T comparable](v T) any {
	var zero T
	if v == zero {
		return nil
	}
	return v
}
