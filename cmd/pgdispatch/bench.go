package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/cmd/pgdispatch/internal/bench"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgcluster"
)

func benchCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench", "Measure latency, throughput, writer overhead and idle cost with no-op jobs, in a schema\n"+
		"of its own that it creates and drops. With no DATABASE_URL it starts a throwaway PostgreSQL\n"+
		"(fsync and synchronous_commit on). The idle scenario reads pg_stat_database, so run it on a\n"+
		"database nothing else uses.", stderr)
	benchConn := withDefaults(connSettings, map[string]string{"LOG_LEVEL": "error", "LOG_FORMAT": "console"})
	v := newValues(fs, benchConn, workerSettings)
	o := bench.DefaultOptions()
	scenarios := fs.String("scenario", strings.Join(o.Scenarios, ","), "comma-separated scenarios: "+strings.Join(bench.Scenarios, ", ")+
		" (soak and xmin are not in the default set)")
	fs.IntVar(&o.Jobs, "jobs", o.Jobs, "latency: jobs inserted one per transaction")
	fs.DurationVar(&o.Spacing, "spacing", o.Spacing, "latency: pause between those inserts")
	fs.IntVar(&o.DrainJobs, "drain-jobs", o.DrainJobs, "drain: jobs inserted before the worker starts")
	writers := fs.String("writers", joinInts(o.Writers), "sustained and writers: writer connection counts, comma-separated")
	fs.DurationVar(&o.Duration, "duration", o.Duration, "sustained: length of each run; writers: the time each side gets, in four turns")
	fs.DurationVar(&o.IdleDuration, "idle-duration", o.IdleDuration, "idle: how long to count transactions")
	fs.DurationVar(&o.SoakDuration, "soak-duration", o.SoakDuration, "soak: how long writers and the worker run")
	fs.IntVar(&o.SoakWriters, "soak-writers", o.SoakWriters, "soak: writer connections")
	fs.IntVar(&o.XminJobs, "xmin-jobs", o.XminJobs, "xmin: jobs of each drain, with a transaction held open and without")
	fs.IntVar(&o.XminLone, "xmin-lone", o.XminLone, "xmin: lone jobs inserted 20 ms apart after each drain")
	fs.IntVar(&o.XminPairs, "xmin-pairs", o.XminPairs, "xmin: pairs of drains, held and free, alternated")
	xminDead := fs.String("xmin-dead", joinInts(o.XminDead), "xmin: dead claim-index entries in front of the due jobs at which claims are timed, ascending, comma-separated")
	asJSON := fs.Bool("json", false, "print the results as JSON")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	latencies := fs.String("latencies", "", "latency and sustained: write each job's commit and start times to this CSV file, to see when the slowest ones ran")
	if err := parse(fs, args); err != nil {
		return err
	}
	o.Scenarios, o.Writers = nil, nil
	for _, s := range strings.Split(*scenarios, ",") {
		s = strings.TrimSpace(s)
		if !slices.Contains(bench.Scenarios, s) {
			return fmt.Errorf("--scenario %q: want some of %s", s, strings.Join(bench.Scenarios, ", "))
		}
		o.Scenarios = append(o.Scenarios, s)
	}
	for _, w := range strings.Split(*writers, ",") {
		var n int
		if _, err := fmt.Sscan(strings.TrimSpace(w), &n); err != nil || n <= 0 {
			return fmt.Errorf("--writers %q: want positive whole numbers", *writers)
		}
		o.Writers = append(o.Writers, n)
	}
	o.XminDead = nil
	for _, w := range strings.Split(*xminDead, ",") {
		var n int
		if _, err := fmt.Sscan(strings.TrimSpace(w), &n); err != nil || n < 0 {
			return fmt.Errorf("--xmin-dead %q: want whole numbers, ascending", *xminDead)
		}
		o.XminDead = append(o.XminDead, n)
	}
	if !slices.IsSorted(o.XminDead) {
		return fmt.Errorf("--xmin-dead %q: want whole numbers, ascending", *xminDead)
	}
	if o.Jobs <= 0 || o.DrainJobs <= 0 || o.Duration <= 0 || o.IdleDuration <= 0 || o.SoakDuration <= 0 || o.SoakWriters <= 0 ||
		o.XminJobs <= 0 || o.XminLone <= 0 || o.XminPairs <= 0 {
		return errors.New("--jobs, --drain-jobs, --duration, --idle-duration, --soak-duration, --soak-writers, --xmin-jobs, --xmin-lone and --xmin-pairs must be above 0")
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
	dbURL := v.databaseURL()
	if direct := v.str("LISTEN_DATABASE_URL"); pgdispatch.BehindPooler(dbURL, direct) {
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
	fmt.Fprintf(stdout, "pgdispatch bench on %d CPUs, %s\n", runtime.NumCPU(), serverVersion(ctx, c.pool))
	for _, r := range results {
		fmt.Fprintf(stdout, "\n%s (%s)\n", r.Scenario, r.Conditions)
		for _, name := range r.Names() {
			fmt.Fprintf(stdout, "  %-24s %12.3f\n", name, r.Figures[name])
		}
	}
	return nil
}

func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

func serverVersion(ctx context.Context, pool *pgxpool.Pool) string {
	var v, sc string
	_ = pool.QueryRow(ctx, "SELECT current_setting('server_version'), current_setting('synchronous_commit')").Scan(&v, &sc)
	return "PostgreSQL " + v + ", synchronous_commit=" + sc
}
