// Package workertest runs a pgdispatch worker for a test, on a schema of its
// own, and stops it gracefully when the test ends.
package workertest

import (
	"context"
	"encoding/json"
	"sync"
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
	Run(context.Background(), t, cfg)
	return schema
}

// Run runs a worker of cfg under ctx (which may carry test hooks) until the
// test ends, and returns it with a graceful stop the test may call sooner.
// The stop fails the test if the worker ends with an error, or is not done
// within a minute.
func Run(ctx context.Context, t testing.TB, cfg pgdispatch.Config) (w *pgdispatch.Worker, stop func()) {
	t.Helper()
	w, err := pgdispatch.NewWorker(cfg)
	if err != nil {
		t.Fatalf("workertest: %v", err)
	}
	return w, Serve(ctx, t, w, cfg.WorkerID)
}

// Serve is Run for a worker made already, as a test that attaches to it
// before it runs makes it; id names it in failures.
func Serve(ctx context.Context, t testing.TB, w *pgdispatch.Worker, id string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("workertest: worker %s stopped with %v", id, err)
				}
			case <-time.After(time.Minute):
				t.Errorf("workertest: worker %s did not stop within a minute", id)
			}
		})
	}
	t.Cleanup(stop)
	return stop
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
