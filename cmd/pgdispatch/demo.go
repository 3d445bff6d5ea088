package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sync/errgroup"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/claimer"
	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/pgcluster"
)

// The demo's own schema, so that it never touches a real installation's jobs.
const demoSchema = "pgdispatch_demo"

func demoCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo", "Run a worker and a producer that inserts sample jobs with plain SQL, printing each\n"+
		"dispatch with its latency, until Ctrl-C. With no DATABASE_URL it starts a throwaway PostgreSQL\n"+
		"from the installed server binaries and removes it at exit. It uses the schema "+demoSchema+"\n"+
		"unless --schema or DB_SCHEMA names another.", stderr)
	demoConn := withDefaults(connSettings, map[string]string{"DB_SCHEMA": demoSchema, "LOG_LEVEL": "warn", "LOG_FORMAT": "console"})
	v := newValues(fs, demoConn, workerSettings)
	count := fs.Int("count", 0, "stop after this many dispatches (0: run until Ctrl-C)")
	interval := fs.Duration("interval", 500*time.Millisecond, "pause between the producer's inserts")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *count < 0 || *interval <= 0 {
		return errors.New("--count must not be negative and --interval must be above 0")
	}

	dbURL := v.databaseURL()
	if dbURL == "" {
		fmt.Fprintln(stdout, "No DATABASE_URL: starting a throwaway PostgreSQL from the installed server binaries...")
		cluster, err := pgcluster.Start(ctx, pgcluster.Options{Durable: true})
		if err != nil {
			return err
		}
		defer func() {
			if err := cluster.Stop(); err != nil {
				fmt.Fprintln(stderr, "pgdispatch demo:", err)
			}
			fmt.Fprintln(stdout, "Throwaway PostgreSQL stopped and removed.")
		}()
		dbURL = cluster.URL()
		fmt.Fprintf(stdout, "PostgreSQL is up at %s\n", dbURL)
	}

	c, err := openConn(ctx, v, dbURL)
	if err != nil {
		return err
	}
	defer c.pool.Close()
	if err := runMigrate(ctx, c); err != nil {
		return err
	}
	cfg, err := workerConfig(v, c)
	if err != nil {
		return err
	}
	cfg.RetryBackoff = claimer.ExponentialBackoff(time.Second) // retries within the demo's attention span

	d := &demo{out: stdout, committed: map[int64]time.Time{}, limit: int64(*count)}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	d.stop = cancel
	cfg.Registry = executors.NewRegistry()
	cfg.Registry.Register(executors.KindNoop, d.wrap(executors.Noop{}))
	cfg.Registry.Register("demo_flaky", d.wrap(executors.Func(func(_ context.Context, job *executors.Job) error {
		if job.Attempt == 1 {
			return errors.New("the first attempt fails on purpose")
		}
		return nil
	})))
	w, err := pgdispatch.NewWorker(cfg)
	if err != nil {
		return err
	}

	fmt.Fprintf(stdout, "Worker %q serving schema %q. Inserting a sample job every %s with plain SQL; Ctrl-C stops.\n\n",
		w.ID(), c.schema, *interval)
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return w.Run(gctx) })
	g.Go(func() error { return d.produce(gctx, dbURL, c.schema, *interval) })
	err = g.Wait()
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	d.summary(context.WithoutCancel(ctx), c)
	return explainSchema(err, c.schema)
}

type demo struct {
	out   io.Writer
	stop  func()
	limit int64
	seen  atomic.Int64

	mu        sync.Mutex
	committed map[int64]time.Time
}

// wrap prints each dispatch before running the executor.
func (d *demo) wrap(e executors.Executor) executors.Executor {
	return executors.Func(func(ctx context.Context, job *executors.Job) error {
		now := time.Now()
		d.mu.Lock()
		commit, ok := d.committed[job.ID]
		d.mu.Unlock()
		var latency string
		switch {
		case now.Before(job.RunAt.Add(-time.Second)) || !ok:
			latency = "inserted elsewhere"
		case job.RunAt.After(commit):
			latency = fmt.Sprintf("%.1f ms after its run_at", float64(now.Sub(job.RunAt).Microseconds())/1000)
		default:
			latency = fmt.Sprintf("%.2f ms after commit", float64(now.Sub(commit).Microseconds())/1000)
		}
		err := e.Execute(ctx, job)
		result := "done"
		if err != nil {
			result = "failed: " + err.Error()
		}
		fmt.Fprintf(d.out, "job %-5d %-11s attempt %d  started %-28s %s\n", job.ID, job.Kind, job.Attempt, latency, result)
		if n := d.seen.Add(1); d.limit > 0 && n >= d.limit {
			d.stop()
		}
		return err
	})
}

// produce inserts sample jobs through its own connection, the way any
// application would, and records when each insert committed.
func (d *demo) produce(ctx context.Context, dbURL, schema string, interval time.Duration) error {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("producer: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	enqueue := pgx.Identifier{schema, "enqueue"}.Sanitize()
	samples := []string{
		`INSERT INTO ` + jobs + ` (kind, payload) VALUES ('noop', '{"hello": "world"}') RETURNING id`,
		`INSERT INTO ` + jobs + ` (kind, payload) VALUES ('noop', '{"sleep": "50ms"}') RETURNING id`,
		`INSERT INTO ` + jobs + ` (kind) VALUES ('noop'), ('noop'), ('noop') RETURNING id`,
		`SELECT ` + enqueue + `('noop', '{"scheduled": true}', run_at => now() + interval '2 seconds')`,
		`INSERT INTO ` + jobs + ` (kind, priority) VALUES ('noop', -1) RETURNING id`,
		`INSERT INTO ` + jobs + ` (kind, payload) VALUES ('demo_flaky', '{}') RETURNING id`,
		`INSERT INTO ` + jobs + ` (kind) VALUES ('no_such_kind') RETURNING id`,
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		callCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		rows, err := conn.Query(callCtx, samples[i%len(samples)])
		var ids []int64
		if err == nil {
			ids, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		}
		committed := time.Now()
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("producer: %w", err)
		}
		d.mu.Lock()
		for _, id := range ids {
			d.committed[id] = committed
		}
		d.mu.Unlock()
	}
}

func (d *demo) summary(ctx context.Context, c *conn) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	rows, err := c.pool.Query(ctx, "SELECT status, count(*) FROM "+pgx.Identifier{c.schema, "jobs"}.Sanitize()+" GROUP BY 1 ORDER BY 1")
	if err != nil {
		return
	}
	type row struct {
		Status string
		Count  int64
	}
	counts, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		return
	}
	fmt.Fprintf(d.out, "\n%d dispatches. Jobs by status:", d.seen.Load())
	for _, r := range counts {
		fmt.Fprintf(d.out, " %s=%d", r.Status, r.Count)
	}
	fmt.Fprintln(d.out)
}
