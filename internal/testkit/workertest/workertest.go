// Package workertest runs a pgdispatch worker for a test, on a schema of its
// own, and stops it gracefully when the test ends.
package workertest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap/zaptest"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

// Start runs a worker on a migrated schema of the test's own (pgtest.Schema)
// with registry, the fallback tick an hour away and retries 100 ms apart,
// and returns the schema. The worker stops before the schema is handed on.
func Start(t *testing.T, id string, registry *executors.Registry) string {
	t.Helper()
	schema := pgtest.Schema(t)
	cfg := pgdispatch.Config{Pool: pgtest.Pool(t), Schema: schema, WorkerID: id, Registry: registry, Logger: zaptest.NewLogger(t)}
	cfg.PollInterval = time.Hour
	cfg.RetryBackoff = func(int) time.Duration { return 100 * time.Millisecond }
	w, err := pgdispatch.NewWorker(cfg)
	if err != nil {
		t.Fatalf("workertest: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("workertest: worker stopped with %v", err)
		}
	})
	return schema
}

// Enqueue inserts a job with plain SQL, as any writer would, and returns its id.
func Enqueue(t *testing.T, schema, kind string, payload any, maxAttempts int) int64 {
	t.Helper()
	raw, err := json.Marshal(payload)
	if err != nil {
		t.Fatalf("workertest: %v", err)
	}
	var id int64
	err = pgtest.Pool(t).QueryRow(context.Background(),
		"INSERT INTO "+pgx.Identifier{schema, "jobs"}.Sanitize()+" (kind, payload, max_attempts) VALUES ($1, $2, $3) RETURNING id",
		kind, raw, maxAttempts).Scan(&id)
	if err != nil {
		t.Fatalf("workertest: enqueue: %v", err)
	}
	return id
}
