package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/pgdispatch/pgdispatch/cmd/pgdispatch/internal/demo"
	"github.com/pgdispatch/pgdispatch/cmd/pgdispatch/internal/settings"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgcluster"
)

// The demo's own schema, so that it never touches a real installation's jobs.
const demoSchema = "pgdispatch_demo"

func demoCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo", "Deliver sample jobs for real to receivers inside the process: webhooks to an HTTP\n"+
		"receiver that verifies their signatures, email to an SMTP catcher, and messages to RabbitMQ\n"+
		"when RABBITMQ_URL is set, with a retry and a dead job among them. Each job is inserted with\n"+
		"plain SQL, printed first; each attempt is printed with its latency from commit and what the\n"+
		"receiver got. The worker then runs until Ctrl-C. With no DATABASE_URL it starts a throwaway\n"+
		"PostgreSQL from the installed server binaries and removes it at exit. It uses the schema\n"+
		demoSchema+" unless --schema or DB_SCHEMA names another.", stderr)
	demoConn := settings.WithDefaults(connSettings, map[string]string{"DB_SCHEMA": demoSchema, "LOG_LEVEL": "error", "LOG_FORMAT": "console"})
	// Retries within a reader's attention span.
	demoWorker := settings.WithDefaults(workerSettings, map[string]string{"RETRY_BACKOFF": "1s"})
	v := settings.New(fs, demoConn, demoWorker, settings.Only(executorSettings, "RABBITMQ_URL"))
	count := fs.Int("count", 0, "stop after this many attempts (0: run until Ctrl-C)")
	interval := fs.Duration("interval", 500*time.Millisecond, "pause between the tour's inserts")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *count < 0 || *interval <= 0 {
		return errors.New("--count must not be negative and --interval must be above 0")
	}

	dbURL, psqlURL := databaseURL(v), ""
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
		dbURL, psqlURL = cluster.URL(), cluster.URL()
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
	return demo.Run(ctx, demo.Config{
		Worker: cfg, DatabaseURL: dbURL, PsqlURL: psqlURL, RabbitMQURL: v.Str("RABBITMQ_URL"),
		Out: stdout, Count: *count, Interval: *interval,
	})
}
