package pgdispatch_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/internal/testkit/exampledb"
)

// Enqueue takes the caller's transaction: the job commits with the order,
// or not at all. A dedup key makes a second enqueue of the same event
// return the first job's id instead of adding one.
func ExampleEnqueue() {
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
	if _, err := pool.Exec(ctx, "CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL)"); err != nil {
		log.Fatal(err)
	}

	pay := func(order int64, declined bool) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO orders (id, status) VALUES ($1, 'paid')", order); err != nil {
				return err
			}
			_, err := pgdispatch.Enqueue(ctx, tx, pgdispatch.Job{
				Kind: "email",
				Payload: map[string]any{
					"to":      []string{"alice@example.com"},
					"subject": fmt.Sprintf("Order %d is paid", order),
					"text":    "Thank you.",
				},
				DedupKey: fmt.Sprintf("order-%d-paid", order),
			})
			if err != nil {
				return err
			}
			if declined {
				return errors.New("card declined") // rolls back the order and its job
			}
			return nil
		})
	}
	fmt.Println("order 1042:", pay(1042, false))
	fmt.Println("order 1043:", pay(1043, true))

	// The same event again, from a retried request: no second job.
	again, err := pgdispatch.EnqueueChecked(ctx, pool, pgdispatch.Job{Kind: "email", DedupKey: "order-1042-paid"})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("created again:", again.Created)

	rows, err := pool.Query(ctx, "SELECT kind, payload->>'subject', status FROM pgdispatch.jobs ORDER BY id")
	if err != nil {
		log.Fatal(err)
	}
	var kind, subject, status string
	_, err = pgx.ForEachRow(rows, []any{&kind, &subject, &status}, func() error {
		fmt.Printf("%s %q %s\n", kind, subject, status)
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output:
	// order 1042: <nil>
	// order 1043: card declined
	// created again: false
	// email "Order 1042 is paid" pending
}
