package bench

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Flags are the bench command's flags for the scenarios and their sizes.
type Flags struct {
	o                                       Options
	scenarios, writers, xminDead, flowParts string
}

// AddFlags registers the flags on fs, with DefaultOptions as their
// defaults.
func AddFlags(fs *flag.FlagSet) *Flags {
	f := &Flags{o: DefaultOptions()}
	o := &f.o
	fs.StringVar(&f.scenarios, "scenario", strings.Join(o.Scenarios, ","), "comma-separated scenarios: "+strings.Join(Scenarios, ", ")+
		" (soak, xmin, flow and outage are not in the default set)")
	fs.IntVar(&o.Jobs, "jobs", o.Jobs, "latency and http: jobs inserted one per transaction")
	fs.DurationVar(&o.Gap, "gap", o.Gap, "latency and http: pause between those inserts")
	fs.IntVar(&o.Ahead, "ahead", o.Ahead, "latency: jobs scheduled a day ahead in the queue before the lone jobs")
	fs.IntVar(&o.DrainJobs, "drain-jobs", o.DrainJobs, "drain: jobs inserted before the worker starts")
	fs.StringVar(&f.writers, "writers", joinInts(o.Writers), "sustained and writers: writer connection counts, comma-separated")
	fs.DurationVar(&o.Duration, "duration", o.Duration, "sustained: length of each run; writers: the time each side gets, in four turns")
	fs.DurationVar(&o.IdleDuration, "idle-duration", o.IdleDuration, "idle: how long to count transactions")
	fs.DurationVar(&o.SoakDuration, "soak-duration", o.SoakDuration, "soak: how long writers and the worker run")
	fs.IntVar(&o.SoakWriters, "soak-writers", o.SoakWriters, "soak: writer connections")
	fs.IntVar(&o.XminJobs, "xmin-jobs", o.XminJobs, "xmin: jobs of each drain, with a transaction held open and without")
	fs.IntVar(&o.XminLone, "xmin-lone", o.XminLone, "xmin: lone jobs inserted 20 ms apart after each drain")
	fs.IntVar(&o.XminPairs, "xmin-pairs", o.XminPairs, "xmin: pairs of drains, held and free, alternated")
	fs.StringVar(&f.xminDead, "xmin-dead", joinInts(o.XminDead), "xmin: dead claim-index entries in front of the due jobs at which claims are timed, ascending, comma-separated")
	fs.StringVar(&f.flowParts, "flow-parts", strings.Join(o.FlowParts, ","), "flow: comma-separated parts to run: "+strings.Join(FlowParts, ", "))
	fs.IntVar(&o.FlowJobs, "flow-jobs", o.FlowJobs, "flow: jobs of the concurrency drains, limited and not")
	fs.IntVar(&o.FlowKeys, "flow-keys", o.FlowKeys, "flow: keys of the concurrency drains' jobs")
	fs.IntVar(&o.FlowWorkers, "flow-workers", o.FlowWorkers, "flow: workers in this process, each with a pool of its own")
	fs.IntVar(&o.FlowStrictKeys, "flow-strict-keys", o.FlowStrictKeys, "flow: keys of the strict order part")
	fs.IntVar(&o.FlowStrictJobs, "flow-strict-jobs", o.FlowStrictJobs, "flow: jobs of each key of the strict order part")
	fs.IntVar(&o.FlowRate, "flow-rate", o.FlowRate, "flow: starts a second of each of the rate part's 10 keys")
	fs.DurationVar(&o.FlowRateDuration, "flow-rate-duration", o.FlowRateDuration, "flow: length of the rate part")
	fs.IntVar(&o.FlowBacklog, "flow-backlog", o.FlowBacklog, "flow: due jobs of the fair part's first key")
	fs.IntVar(&o.FlowWakeups, "flow-wakeups", o.FlowWakeups, "flow: jobs of the wake-ups part's key")
	fs.DurationVar(&o.OutageLength, "outage-length", o.OutageLength, "outage: how long the failing receiver fails: 503 for the first half, no answer for the second")
	fs.IntVar(&o.OutageRate, "outage-rate", o.OutageRate, "outage: http_callback jobs a second, to all 10 receivers")
	fs.IntVar(&o.OutageRounds, "outage-rounds", o.OutageRounds, "outage: runs with the outage, alternated with as many without")
	fs.DurationVar(&o.OutageCoolDown, "outage-cool-down", o.OutageCoolDown, "outage: the breaker's cool-down")
	fs.DurationVar(&o.OutageTimeout, "outage-timeout", o.OutageTimeout, "outage: each request's timeout (the payload's)")
	return f
}

// Options are the options the parsed flags give, checked, with errors
// that name the flags.
func (f *Flags) Options() (Options, error) {
	o := f.o
	o.Scenarios, o.Writers = nil, nil
	for _, s := range strings.Split(f.scenarios, ",") {
		s = strings.TrimSpace(s)
		if !slices.Contains(Scenarios, s) {
			return Options{}, fmt.Errorf("--scenario %q: want some of %s", s, strings.Join(Scenarios, ", "))
		}
		o.Scenarios = append(o.Scenarios, s)
	}
	for _, w := range strings.Split(f.writers, ",") {
		var n int
		if _, err := fmt.Sscan(strings.TrimSpace(w), &n); err != nil || n <= 0 {
			return Options{}, fmt.Errorf("--writers %q: want positive whole numbers", f.writers)
		}
		o.Writers = append(o.Writers, n)
	}
	o.FlowParts = nil
	for _, s := range strings.Split(f.flowParts, ",") {
		s = strings.TrimSpace(s)
		if !slices.Contains(FlowParts, s) {
			return Options{}, fmt.Errorf("--flow-parts %q: want some of %s", s, strings.Join(FlowParts, ", "))
		}
		o.FlowParts = append(o.FlowParts, s)
	}
	o.XminDead = nil
	for _, w := range strings.Split(f.xminDead, ",") {
		var n int
		if _, err := fmt.Sscan(strings.TrimSpace(w), &n); err != nil || n < 0 {
			return Options{}, fmt.Errorf("--xmin-dead %q: want whole numbers, ascending", f.xminDead)
		}
		o.XminDead = append(o.XminDead, n)
	}
	if !slices.IsSorted(o.XminDead) {
		return Options{}, fmt.Errorf("--xmin-dead %q: want whole numbers, ascending", f.xminDead)
	}
	if o.Jobs <= 0 || o.DrainJobs <= 0 || o.Duration <= 0 || o.IdleDuration <= 0 || o.SoakDuration <= 0 || o.SoakWriters <= 0 ||
		o.XminJobs <= 0 || o.XminLone <= 0 || o.XminPairs <= 0 {
		return Options{}, errors.New("--jobs, --drain-jobs, --duration, --idle-duration, --soak-duration, --soak-writers, --xmin-jobs, --xmin-lone and --xmin-pairs must be above 0")
	}
	if o.FlowJobs <= 0 || o.FlowKeys <= 0 || o.FlowWorkers <= 0 || o.FlowStrictKeys <= 0 || o.FlowStrictJobs <= 0 || o.FlowBacklog <= 0 {
		return Options{}, errors.New("--flow-jobs, --flow-keys, --flow-workers, --flow-strict-keys, --flow-strict-jobs and --flow-backlog must be above 0")
	}
	if o.FlowRate <= 0 || o.FlowRate > 10000 || o.FlowRateDuration < time.Second || o.FlowWakeups < 2 {
		return Options{}, errors.New("--flow-rate must be from 1 to 10000, --flow-rate-duration at least 1s and --flow-wakeups at least 2")
	}
	if o.OutageLength <= 0 || o.OutageRate <= 0 || o.OutageRate > 10000 || o.OutageRounds <= 0 || o.OutageCoolDown <= 0 || o.OutageTimeout <= 0 {
		return Options{}, errors.New("--outage-length, --outage-rounds, --outage-cool-down and --outage-timeout must be above 0, --outage-rate from 1 to 10000")
	}
	return o, nil
}

func joinInts(ns []int) string {
	s := make([]string, len(ns))
	for i, n := range ns {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

// Print writes results as text: a line on the machine and on pool's
// server, then each scenario's conditions and figures.
func Print(ctx context.Context, w io.Writer, pool *pgxpool.Pool, results []*Result) {
	var version, syncCommit string
	_ = pool.QueryRow(ctx, "SELECT current_setting('server_version'), current_setting('synchronous_commit')").Scan(&version, &syncCommit)
	fmt.Fprintf(w, "pgdispatch bench on %d CPUs, PostgreSQL %s, synchronous_commit=%s\n", runtime.NumCPU(), version, syncCommit)
	for _, r := range results {
		fmt.Fprintf(w, "\n%s (%s)\n", r.Scenario, r.Conditions)
		for _, name := range r.Names() {
			fmt.Fprintf(w, "  %-30s %12.3f\n", name, r.Figures[name])
		}
	}
}
