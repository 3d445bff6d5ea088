package demo

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// step is one insert of the tour, or, with do, one thing an operator
// does, said in what.
type step struct {
	what, sql string
	do        func(context.Context) error
}

// steps are the tour's inserts, as a reader can paste them into psql.
func (d *demo) steps() []step {
	schema := d.cfg.Worker.Schema
	r := strings.NewReplacer(
		"{jobs}", pgx.Identifier{schema, "jobs"}.Sanitize(),
		"{enqueue}", pgx.Identifier{schema, "enqueue"}.Sanitize(),
		"{hooks}", d.webhooks.URL,
	)
	steps := []step{
		{what: "A webhook: the worker POSTs data to url, signed.", sql: `INSERT INTO {jobs} (kind, payload)
VALUES ('http_callback', '{"url": "{hooks}/orders", "data": {"order_id": 1042, "status": "paid"}}')
RETURNING id`},
		{what: "An email, through the SMTP server.", sql: `INSERT INTO {jobs} (kind, payload)
VALUES ('email', '{"to": ["alice@example.com"], "subject": "Order 1042 has shipped", "text": "It is on its way."}')
RETURNING id`},
		{what: "A webhook whose receiver is not ready: attempt 1 gets 503, and the job is retried.", sql: `INSERT INTO {jobs} (kind, payload)
VALUES ('http_callback', '{"url": "{hooks}/flaky", "data": {"order_id": 1043, "status": "paid"}}')
RETURNING id`},
		{what: "An email the server refuses for good (550): the job is dead at once, the reply in last_error.", sql: `INSERT INTO {jobs} (kind, payload)
VALUES ('email', '{"to": ["nobody@example.com"], "subject": "Order 1043 has shipped", "text": "It is on its way."}')
RETURNING id`},
		{what: "A job for later, through the enqueue() function: due in 2 seconds.", sql: `SELECT {enqueue}('email', '{"to": ["alice@example.com"], "subject": "How was order 1042?", "text": "Tell us."}',
    run_at => now() + interval '2 seconds')`},
		{what: "Three webhooks from one statement, each its own job.", sql: `INSERT INTO {jobs} (kind, payload)
SELECT 'http_callback', jsonb_build_object('url', '{hooks}/orders', 'data', jsonb_build_object('order_id', n, 'status', 'paid'))
FROM generate_series(1044, 1046) AS n
RETURNING id`},
		{what: "The signing secret is rotated, as `pgdispatch secrets rotate --overlap 1m --print` does: the\n" +
			"-- receiver is given the new secret, and for a minute each webhook is signed by both.", do: d.rotateOnce},
		{what: "A webhook during the overlap.", sql: `INSERT INTO {jobs} (kind, payload)
VALUES ('http_callback', '{"url": "{hooks}/orders", "data": {"order_id": 1047, "status": "paid"}}')
RETURNING id`},
	}
	if d.amqp != nil {
		steps = append(steps, step{what: "A message to RabbitMQ, done when the broker confirms it.", sql: `INSERT INTO {jobs} (kind, payload)
VALUES ('rabbitmq', '{"routing_key": "` + d.amqp.Queue + `", "body": {"order_id": 1042, "event": "shipped"}}')
RETURNING id`})
	}
	for i := range steps {
		steps[i].sql = r.Replace(steps[i].sql)
	}
	return steps
}

// tour inserts the steps' jobs from a connection of its own, waits until
// each is done or dead, and says what happened. It returns nil when ctx
// ends.
func (d *demo) tour(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, d.cfg.DatabaseURL)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("producer: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()

	began := time.Now()
	var ids []int64
	pause := time.NewTicker(d.cfg.Interval)
	defer pause.Stop()
	for i, s := range d.steps() {
		if i > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-pause.C:
			}
		}
		if s.do != nil {
			d.write(fmt.Sprintf("\n-- %s\n", s.what))
			if err := s.do(ctx); err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			continue
		}
		d.write(fmt.Sprintf("\n-- %s\n%s;\n", s.what, s.sql))
		got, err := d.insert(ctx, conn, s.sql)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("producer: %w", err)
		}
		ids = append(ids, got...)
	}

	var done, dead, retried int
	for {
		d.mu.Lock()
		done, dead, retried = 0, 0, 0
		for _, id := range ids {
			switch d.finals[id] {
			case "done":
				done++
				if d.retried[id] {
					retried++
				}
			case "dead":
				dead++
			}
		}
		finished := d.finished
		d.mu.Unlock()
		if done+dead == len(ids) {
			break
		}
		select {
		case <-ctx.Done():
			return nil
		case <-finished:
		}
	}
	where := "psql on the same database"
	if d.cfg.PsqlURL != "" {
		where = "psql '" + d.cfg.PsqlURL + "'"
	}
	d.write(fmt.Sprintf("\nThe tour took %.1f s: %d jobs, %d delivered (%d after a retry), %d dead.\n"+
		"The worker and the receivers keep running: paste any SQL above into\n  %s\n"+
		"to send it again, or point a job's url at an endpoint of your own. Ctrl-C stops.\n",
		time.Since(began).Seconds(), len(ids), done, retried, dead, where))
	return nil
}

// rotateOnce rotates the signing secret with a minute's overlap and waits
// until the worker signs with the new one.
func (d *demo) rotateOnce(ctx context.Context) error {
	id, err := d.rotate(ctx, time.Minute)
	if err != nil {
		return fmt.Errorf("rotate the signing secret: %w", err)
	}
	for {
		changed := d.keyring.Changed()
		if slices.Contains(d.keyring.IDs(), id) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

// insert runs one step and records when its jobs committed.
func (d *demo) insert(ctx context.Context, conn *pgx.Conn, sql string) ([]int64, error) {
	d.insertMu.Lock()
	defer d.insertMu.Unlock()
	callCtx, cancel := context.WithTimeout(ctx, d.cfg.Worker.StatementTimeout)
	defer cancel()
	rows, err := conn.Query(callCtx, sql)
	if err != nil {
		return nil, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	committed := time.Now()
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		d.committed[id] = committed
	}
	return ids, nil
}
