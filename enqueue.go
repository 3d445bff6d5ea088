package pgdispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
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
	// MaxAttempts defaults to the worker's MAX_ATTEMPTS.
	MaxAttempts int
}

// defaultCallTimeout bounds Enqueue when ctx has no deadline of its own.
const defaultCallTimeout = 10 * time.Second

// Enqueue inserts job into the default schema and returns its id, or the id
// of the job that already holds job.DedupKey.
func Enqueue(ctx context.Context, db DB, job Job) (int64, error) {
	return Schema(DefaultSchema).Enqueue(ctx, db, job)
}

// Schema names a pgdispatch installation by its schema, for programs that use
// one other than DefaultSchema.
type Schema string

// Enqueue inserts job into schema s; see the package-level Enqueue.
func (s Schema) Enqueue(ctx context.Context, db DB, job Job) (int64, error) {
	if job.Kind == "" {
		return 0, errors.New("enqueue: Kind is required")
	}
	if job.MaxAttempts < 0 {
		return 0, errors.New("enqueue: MaxAttempts must not be negative")
	}
	payload, err := encodePayload(job.Payload)
	if err != nil {
		return 0, fmt.Errorf("enqueue: payload: %w", err)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, defaultCallTimeout)
		defer cancel()
	}
	sql := "SELECT " + pgx.Identifier{string(s), "enqueue"}.Sanitize() +
		"(kind => $1, payload => $2, queue => $3, run_at => $4, priority => $5, dedup_key => $6, max_attempts => $7)"
	var id int64
	err = db.QueryRow(ctx, sql, job.Kind, payload, nilIfZero(job.Queue), nilIfZero(job.RunAt),
		job.Priority, nilIfZero(job.DedupKey), nilIfZero(int32(job.MaxAttempts))).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("enqueue %s job: %w", job.Kind, err)
	}
	return id, nil
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
