package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime/pprof"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/cmd/pgdispatch/internal/bench"
	"github.com/pgdispatch/pgdispatch/cmd/pgdispatch/internal/settings"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgcluster"
)

func benchCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench", "Measure latency, throughput, writer overhead and idle cost with no-op jobs, in a schema\n"+
		"of its own that it creates and drops. With no DATABASE_URL it starts a throwaway PostgreSQL\n"+
		"(fsync and synchronous_commit on). The idle scenario reads pg_stat_database, so run it on a\n"+
		"database nothing else uses.", stderr)
	benchConn := settings.WithDefaults(connSettings, map[string]string{"LOG_LEVEL": "error", "LOG_FORMAT": "console"})
	v := settings.New(fs, benchConn, workerSettings)
	sizes := bench.AddFlags(fs)
	asJSON := fs.Bool("json", false, "print the results as JSON")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	latencies := fs.String("latencies", "", "latency, http and sustained: write each job's commit and start times to this CSV file, to see when the slowest ones ran (latency and http: and where their time went)")
	if err := parse(fs, args); err != nil {
		return err
	}
	o, err := sizes.Options()
	if err != nil {
		return err
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer func() { _ = f.Close() }()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	dbURL := databaseURL(v)
	if direct := v.Str("LISTEN_DATABASE_URL"); pgdispatch.BehindPooler(dbURL, direct) {
		// The scenarios create databases, prepare statements and measure
		// PostgreSQL: past the pooler.
		fmt.Fprintln(stderr, "bench connects to LISTEN_DATABASE_URL, past the pooler of DATABASE_URL")
		dbURL = direct
	}
	if dbURL == "" {
		fmt.Fprintln(stderr, "No DATABASE_URL: starting a throwaway PostgreSQL (fsync on)...")
		cluster, err := pgcluster.Start(ctx, pgcluster.Options{Durable: true})
		if err != nil {
			return err
		}
		defer func() { _ = cluster.Stop() }()
		dbURL = cluster.URL()
	}
	c, err := openConn(ctx, v, dbURL)
	if err != nil {
		return err
	}
	defer c.pool.Close()
	base, err := workerConfig(v, c)
	if err != nil {
		return err
	}
	o.Log = stderr
	if *latencies != "" {
		f, err := os.Create(*latencies)
		if err != nil {
			return err
		}
		defer func() { _ = f.Close() }()
		o.Latencies = f
	}
	results, err := bench.Run(ctx, base, o)
	if err != nil {
		return err
	}
	if *asJSON {
		return printJSON(stdout, results)
	}
	bench.Print(ctx, stdout, c.pool, results)
	return nil
}
