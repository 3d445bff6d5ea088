package admin_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/admin"
	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/testkit/exampledb"
)

// A job's row is its outcome: Get reads it by the id Enqueue returned, and
// Retry gives a dead job another attempt once its cause is fixed.
func ExampleAdmin_Get() {
	ctx := context.Background()
	databaseURL, drop := exampledb.New() // your DATABASE_URL
	defer drop()
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := pgdispatch.Migrate(ctx, pool, pgdispatch.DefaultSchema); err != nil {
		log.Fatal(err)
	}

	// A worker whose charge executor fails for good.
	ran := make(chan struct{}, 1)
	registry := executors.NewRegistry()
	registry.Register("charge", executors.Func(func(context.Context, *executors.Job) error {
		ran <- struct{}{}
		return executors.Permanentf("card declined: insufficient funds")
	}))
	worker, err := pgdispatch.NewWorker(pgdispatch.Config{Pool: pool, WorkerID: "example", Registry: registry})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- worker.Run(runCtx) }()
	id, err := pgdispatch.Enqueue(ctx, pool, pgdispatch.Job{Kind: "charge", Payload: map[string]any{"order_id": 1042}, MaxAttempts: 3})
	if err != nil {
		log.Fatal(err)
	}
	<-ran
	stop() // Run returns once the last outcomes are written
	if err := <-stopped; err != nil {
		log.Fatal(err)
	}

	a := admin.New(pool, pgdispatch.DefaultSchema, 10*time.Second)
	job, err := a.Get(ctx, id)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("job %d: %s after %d of %d attempts, finished: %t\n", job.ID, job.Status, job.Attempts, *job.MaxAttempts, job.FinishedAt != nil)
	fmt.Println("last_error:", *job.LastError)

	changes, err := a.Retry(ctx, []int64{id})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("retried: %t (was %s)\n", changes[0].Changed, changes[0].Status)
	if job, err = a.Get(ctx, id); err != nil {
		log.Fatal(err)
	}
	fmt.Println("job", job.ID, "is", job.Status)
	// Output:
	// job 1: dead after 1 of 3 attempts, finished: true
	// last_error: card declined: insufficient funds
	// retried: true (was dead)
	// job 1 is pending
}
