package triggers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/internal/testkit/exampledb"
	"github.com/pgdispatch/pgdispatch/triggers"
)

// A dispatch trigger turns row changes in the application's own table into
// jobs, in the writer's transaction, with no change to the writer: here an
// http_callback job each time an order becomes paid, with the row in the
// POSTed body.
func ExampleAdd() {
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

	name, created, err := triggers.Add(ctx, pool, pgdispatch.DefaultSchema, triggers.Spec{
		Table:   "public.orders",
		Events:  []string{"insert", "update"},
		Kind:    "http_callback",
		Payload: json.RawMessage(`{"url": "https://shop.example.com/hooks/order-paid"}`),
		When:    "NEW.status = 'paid'",
	})
	fmt.Println(name, created, err)

	// The application writes its table as it always has.
	for _, sql := range []string{
		"INSERT INTO orders (id, status) VALUES (1042, 'new'), (1043, 'paid')",
		"UPDATE orders SET status = 'paid' WHERE id = 1042",
	} {
		if _, err := pool.Exec(ctx, sql); err != nil {
			log.Fatal(err)
		}
	}

	rows, err := pool.Query(ctx, `SELECT kind, payload->>'url', payload->'data'->>'op', payload->'data'->'new'
		FROM pgdispatch.jobs ORDER BY id`)
	if err != nil {
		log.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var kind, url, op string
		var row json.RawMessage
		if err := rows.Scan(&kind, &url, &op, &row); err != nil {
			log.Fatal(err)
		}
		fmt.Println(kind, url, op, string(row))
	}
	if err := rows.Err(); err != nil {
		log.Fatal(err)
	}
	// Output:
	// orders_http_callback true <nil>
	// http_callback https://shop.example.com/hooks/order-paid INSERT {"id": 1043, "status": "paid"}
	// http_callback https://shop.example.com/hooks/order-paid UPDATE {"id": 1042, "status": "paid"}
}
