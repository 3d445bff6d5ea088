package pgdispatch_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/testkit/exampledb"
)

// A program can run a worker of its own, on its own pool, beside its other
// work: Run serves the queues until its context ends, then shuts down
// gracefully and returns.
func ExampleNewWorker() {
	ctx := context.Background()
	databaseURL, drop := exampledb.New() // your DATABASE_URL
	defer drop()
	pool, err := pgdispatch.NewPool(ctx, databaseURL, pgdispatch.PoolConfig{})
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := pgdispatch.Migrate(ctx, pool, pgdispatch.DefaultSchema); err != nil {
		log.Fatal(err)
	}

	welcomed := make(chan string, 1)
	registry := executors.NewRegistry()
	registry.Register("welcome", executors.Func(func(ctx context.Context, job *executors.Job) error {
		var p struct {
			User string `json:"user"`
		}
		if err := json.Unmarshal(job.Payload, &p); err != nil {
			return executors.Permanent(err)
		}
		welcomed <- p.User
		return nil
	}))
	worker, err := pgdispatch.NewWorker(pgdispatch.Config{
		Pool:     pool,
		WorkerID: "signup-service",
		Queues:   []pgdispatch.Queue{{Name: "default", Concurrency: 10}},
		Registry: registry,
	})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- worker.Run(runCtx) }()

	// Any writer may add the job: this program, or plain SQL from another.
	if _, err := pool.Exec(ctx, `INSERT INTO pgdispatch.jobs (kind, payload) VALUES ('welcome', '{"user": "alice"}')`); err != nil {
		log.Fatal(err)
	}
	fmt.Println("welcomed", <-welcomed)

	stop() // as on SIGTERM: claim no more, let running jobs finish, write the last outcomes
	fmt.Println("stopped:", <-stopped)
	var status string
	var attempts int
	if err := pool.QueryRow(ctx, "SELECT status, attempts FROM pgdispatch.jobs").Scan(&status, &attempts); err != nil {
		log.Fatal(err)
	}
	fmt.Println("job:", status, "after", attempts, "attempt")
	// Output:
	// welcomed alice
	// stopped: <nil>
	// job: done after 1 attempt
}
