package pgdispatch_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/testkit/exampledb"
)

// thumbnailer is a custom executor: any type with an Execute method. The
// error it returns tells the worker what comes next: nil is done,
// executors.Permanent is dead at once, executors.RetryAfter retries at the
// time it names, and any other error retries with backoff until the job's
// attempts are used up.
type thumbnailer struct {
	ran chan<- string // what each attempt did, for the example to print
}

func (t thumbnailer) Execute(ctx context.Context, job *executors.Job) error {
	var p struct {
		Image string `json:"image"`
		Width int    `json:"width"`
	}
	if err := json.Unmarshal(job.Payload, &p); err != nil || p.Image == "" || p.Width <= 0 {
		t.ran <- fmt.Sprintf("job %d attempt %d: bad payload", job.ID, job.Attempt)
		return executors.Permanentf("payload: want an image and a width above 0")
	}
	if job.Attempt == 1 {
		t.ran <- fmt.Sprintf("job %d attempt %d: storage busy", job.ID, job.Attempt)
		return executors.RetryAfter(10*time.Millisecond, errors.New("storage busy"))
	}
	t.ran <- fmt.Sprintf("job %d attempt %d: %s at %d px", job.ID, job.Attempt, p.Image, p.Width)
	return nil
}

func Example_customExecutor() {
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

	ran := make(chan string, 10)
	registry := executors.NewRegistry()
	registry.Register("thumbnail", thumbnailer{ran: ran})
	worker, err := pgdispatch.NewWorker(pgdispatch.Config{Pool: pool, WorkerID: "example", Registry: registry})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- worker.Run(runCtx) }()

	for _, payload := range []string{`{"image": "cat.png"}`, `{"image": "cat.png", "width": 640}`} {
		if _, err := pgdispatch.Enqueue(ctx, pool, pgdispatch.Job{Kind: "thumbnail", Payload: json.RawMessage(payload)}); err != nil {
			log.Fatal(err)
		}
		fmt.Println(<-ran) // one job at a time, for a fixed order
	}
	fmt.Println(<-ran) // the retry

	stop()
	if err := <-stopped; err != nil {
		log.Fatal(err)
	}
	rows, err := pool.Query(ctx, "SELECT id, status, attempts, coalesce(last_error, '') FROM pgdispatch.jobs ORDER BY id")
	if err != nil {
		log.Fatal(err)
	}
	var id int64
	var status, lastError string
	var attempts int
	_, err = pgx.ForEachRow(rows, []any{&id, &status, &attempts, &lastError}, func() error {
		fmt.Printf("job %d: %s, attempts %d, last_error %q\n", id, status, attempts, lastError)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// job 1 attempt 1: bad payload
	// job 2 attempt 1: storage busy
	// job 2 attempt 2: cat.png at 640 px
	// job 1: dead, attempts 1, last_error "payload: want an image and a width above 0"
	// job 2: done, attempts 2, last_error "storage busy"
}
