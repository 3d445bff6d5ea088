// Package bench measures a pgdispatch worker against a real PostgreSQL:
// latency from commit to start, drain throughput and its in-server floor,
// webhook delivery, writers at full speed, the trigger's cost to them, what
// an idle worker sends, the jobs table's size over a long run, flow limits
// by key held across several workers, and webhook delivery while one
// receiver is down, its circuit open.
//
// Each scenario migrates a schema of its own, named pgdispatch_bench_*, runs
// workers built from the caller's pgdispatch.Config with a no-op executor
// that records when each job started (http: a webhook receiver on loopback
// that records when each request arrived), and drops the schema again. Run
// returns the figures, and Print writes them as text. AddFlags gives the
// bench command its flags for the Options.
package bench

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/endpoints"
)

// DefaultScenarios are the scenarios of a run that names none.
var DefaultScenarios = []string{"latency", "drain", "floor", "http", "sustained", "writers", "idle"}

// Scenarios are every scenario, in the order a run lists them. soak, xmin,
// flow and outage are left out of the default set: they run for minutes.
var Scenarios = append(slices.Clone(DefaultScenarios), "soak", "xmin", "flow", "outage")

// Options says which scenarios run, and how big each is. Every count and
// duration must be above 0; DefaultOptions has the sizes of a full run.
type Options struct {
	// Scenarios run in this order; each is one of Scenarios.
	Scenarios []string
	// Jobs is how many jobs the latency and http scenarios insert, one per
	// transaction, Gap apart (0: none; the peers' harnesses space theirs
	// 20 ms apart).
	Jobs int
	Gap  time.Duration
	// Ahead is how many jobs the latency scenario schedules a day ahead in
	// its queue before its lone jobs, once its worker listens (0: none).
	Ahead int
	// DrainJobs is how many jobs the drain and floor scenarios insert
	// before they start (http_drain: at most 20,000 of them).
	DrainJobs int
	// Writers are the writer connection counts of the sustained and
	// writers scenarios, a run each.
	Writers []int
	// Duration is the length of each sustained run, and the time each side
	// of a writers run gets, in four turns.
	Duration time.Duration
	// IdleDuration is how long the idle scenario counts transactions.
	IdleDuration time.Duration
	// SoakDuration and SoakWriters are how long and with how many writer
	// connections the soak scenario runs.
	SoakDuration time.Duration
	SoakWriters  int
	// XminJobs is how many jobs each drain of the xmin scenario inserts,
	// XminLone how many lone jobs follow each drain, 20 ms apart, and
	// XminPairs how many pairs of drains (a transaction held open, and
	// not) it alternates. XminDead are the counts of dead claim-index
	// entries in front of the due jobs at which it times claims, in
	// ascending order.
	XminJobs  int
	XminLone  int
	XminPairs int
	XminDead  []int
	// The flow scenario's parts (FlowParts) and sizes. FlowWorkers workers run each part.
	// concurrency: FlowJobs jobs over FlowKeys keys; strict: FlowStrictKeys
	// keys of FlowStrictJobs jobs each; rate: 10 keys of FlowRate starts a
	// second each, for FlowRateDuration; fair: a key with FlowBacklog due
	// jobs; wakeups: FlowWakeups jobs of one key.
	FlowParts        []string
	FlowJobs         int
	FlowKeys         int
	FlowWorkers      int
	FlowStrictKeys   int
	FlowStrictJobs   int
	FlowRate         int
	FlowRateDuration time.Duration
	FlowBacklog      int
	FlowWakeups      int
	// The outage scenario's sizes: OutageRate http_callback jobs a second
	// to 10 receivers, one of which fails for OutageLength, each request's
	// timeout OutageTimeout, the breaker's cool-down OutageCoolDown;
	// OutageRounds runs with the outage, alternated with as many without.
	OutageLength   time.Duration
	OutageRate     int
	OutageRounds   int
	OutageCoolDown time.Duration
	OutageTimeout  time.Duration
	// Latencies, when set, receives a CSV row per job of the latency, http
	// and sustained scenarios: its commit and start times, and for latency
	// and http, when it passed each mark of its way (hops.go).
	Latencies io.Writer
	// Log, when set, receives a line as each scenario starts, and what a
	// scenario has to say while it runs.
	Log io.Writer
	// asleepFirst, in tests, has each lone job of the latency and http
	// scenarios wait until the worker's claimer has gone to sleep since
	// the one before, so that its writer notifies: on a loaded machine a
	// claimer could still be awake Gap after the last job.
	asleepFirst bool
}

// DefaultOptions are the default scenarios at the sizes of a full run.
func DefaultOptions() Options {
	return Options{
		Scenarios:    slices.Clone(DefaultScenarios),
		Jobs:         500,
		Gap:          20 * time.Millisecond,
		DrainJobs:    100000,
		Writers:      []int{4, 16},
		Duration:     4 * time.Second,
		IdleDuration: 60 * time.Second,
		SoakDuration: 10 * time.Minute,
		SoakWriters:  4,
		XminJobs:     50000,
		XminLone:     200,
		XminPairs:    2,
		XminDead:     []int{0, 100000, 200000, 500000},

		FlowParts:        FlowParts,
		FlowJobs:         100000,
		FlowKeys:         1000,
		FlowWorkers:      3,
		FlowStrictKeys:   100,
		FlowStrictJobs:   1000,
		FlowRate:         50,
		FlowRateDuration: 30 * time.Second,
		FlowBacklog:      100000,
		FlowWakeups:      200,

		OutageLength:   time.Minute,
		OutageRate:     200,
		OutageRounds:   2,
		OutageCoolDown: endpoints.DefaultCoolDown,
		OutageTimeout:  10 * time.Second,
	}
}

func (o Options) validate(worker pgdispatch.Config) error {
	var errs []error
	if worker.Pool == nil {
		errs = append(errs, errors.New("the worker config has no Pool"))
	}
	if worker.Concurrency <= 0 {
		errs = append(errs, errors.New("the worker config's Concurrency must be above 0"))
	}
	for _, s := range o.Scenarios {
		if !slices.Contains(Scenarios, s) {
			errs = append(errs, fmt.Errorf("scenario %q: want some of %v", s, Scenarios))
		}
	}
	if len(o.Writers) == 0 || slices.ContainsFunc(o.Writers, func(n int) bool { return n <= 0 }) {
		errs = append(errs, fmt.Errorf("writers %v: want positive whole numbers", o.Writers))
	}
	if o.Jobs <= 0 || o.DrainJobs <= 0 || o.Duration <= 0 || o.IdleDuration <= 0 || o.SoakDuration <= 0 || o.SoakWriters <= 0 {
		errs = append(errs, errors.New("the options' Jobs, DrainJobs, Duration, IdleDuration, SoakDuration and SoakWriters must be above 0"))
	}
	if o.XminJobs <= 0 || o.XminLone <= 0 || o.XminPairs <= 0 {
		errs = append(errs, errors.New("the options' XminJobs, XminLone and XminPairs must be above 0"))
	}
	if len(o.XminDead) == 0 || slices.ContainsFunc(o.XminDead, func(n int) bool { return n < 0 }) || !slices.IsSorted(o.XminDead) {
		errs = append(errs, fmt.Errorf("xmin dead entries %v: want whole numbers, ascending", o.XminDead))
	}
	if o.FlowJobs <= 0 || o.FlowKeys <= 0 || o.FlowWorkers <= 0 || o.FlowStrictKeys <= 0 || o.FlowStrictJobs <= 0 ||
		o.FlowRate <= 0 || o.FlowRate > 10000 || o.FlowRateDuration < time.Second || o.FlowBacklog <= 0 || o.FlowWakeups < 2 {
		errs = append(errs, errors.New("the options' Flow sizes must be above 0, FlowRate at most 10000, FlowRateDuration at least 1s and FlowWakeups at least 2"))
	}
	if o.OutageLength <= 0 || o.OutageRate <= 0 || o.OutageRate > 10000 || o.OutageRounds <= 0 || o.OutageCoolDown <= 0 || o.OutageTimeout <= 0 {
		errs = append(errs, errors.New("the options' Outage sizes must be above 0, OutageRate at most 10000"))
	}
	if o.Gap < 0 {
		errs = append(errs, errors.New("the options' Gap must not be negative"))
	}
	if o.Ahead < 0 {
		errs = append(errs, errors.New("the options' Ahead must not be negative"))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	return nil
}

// Result is one scenario's figures. Durations are in milliseconds.
type Result struct {
	Scenario   string             `json:"scenario"`
	Conditions string             `json:"conditions"`
	Figures    map[string]float64 `json:"figures"`
	order      []string
}

// Names are the figures' names, in the order the scenario reports them.
func (r *Result) Names() []string { return slices.Clone(r.order) }

func (r *Result) set(name string, v float64) {
	if math.IsInf(v, 0) || math.IsNaN(v) {
		// A rate over nothing (a side that committed nothing on a starved
		// machine): JSON has no such number, so the figure is left out.
		r.Conditions += fmt.Sprintf("; %s not computable", name)
		return
	}
	if r.Figures == nil {
		r.Figures = map[string]float64{}
	}
	if _, ok := r.Figures[name]; !ok {
		r.order = append(r.order, name)
	}
	r.Figures[name] = v
}

// Run runs the scenarios of o, one after another, and returns their
// results. Every worker it starts is worker with a schema, an executor
// registry and a logger of its own; worker.Pool is the database, reached
// directly (not through a transaction pooler), where the scenarios create
// their schemas and, for idle, a database.
func Run(ctx context.Context, worker pgdispatch.Config, o Options) ([]*Result, error) {
	if err := o.validate(worker); err != nil {
		return nil, err
	}
	if worker.ListenConnConfig == nil {
		worker.ListenConnConfig = worker.Pool.Config().ConnConfig.Copy()
	}
	b := &bench{pool: worker.Pool, base: worker, opts: o, log: o.Log}
	if b.log == nil {
		b.log = io.Discard
	}
	if o.Latencies != nil {
		b.latencies = csv.NewWriter(o.Latencies)
		if err := b.latencies.Write(latencyHeader); err != nil {
			return nil, err
		}
	}
	var results []*Result
	for _, s := range o.Scenarios {
		fmt.Fprintf(b.log, "bench: %s...\n", s)
		var (
			rs  []*Result
			err error
		)
		switch s {
		case "latency":
			rs, err = b.latency(ctx)
		case "drain":
			rs, err = b.drain(ctx)
		case "floor":
			rs, err = b.floor(ctx)
		case "http":
			rs, err = b.httpScenario(ctx)
		case "sustained":
			rs, err = b.sustained(ctx)
		case "writers":
			rs, err = b.writers(ctx)
		case "idle":
			rs, err = b.idle(ctx)
		case "soak":
			rs, err = b.soak(ctx)
		case "xmin":
			rs, err = b.xmin(ctx)
		case "flow":
			rs, err = b.flow(ctx)
		case "outage":
			rs, err = b.outage(ctx)
		}
		if err != nil {
			return nil, fmt.Errorf("bench %s: %w", s, err)
		}
		results = append(results, rs...)
	}
	if b.latencies != nil {
		if b.latencies.Flush(); b.latencies.Error() != nil {
			return nil, fmt.Errorf("--latencies: %w", b.latencies.Error())
		}
	}
	return results, nil
}

// bench is one run: the database, the worker config its scenarios start
// from, and its options.
type bench struct {
	pool      *pgxpool.Pool
	base      pgdispatch.Config
	opts      Options
	log       io.Writer
	latencies *csv.Writer // Options.Latencies, or nil
	// lonely is the claimer that takes the lone jobs of the latency and
	// http scenarios, for Options.asleepFirst.
	lonely *probe
}

// latencyHeader is the header of Options.Latencies. The columns after
// latency_us are the job's marks (hops.go) as microseconds after its
// commit, on the process's monotonic clock (started_us is latency_us on
// that clock), empty where unknown, and in every sustained row.
var latencyHeader = []string{
	"scenario", "writers", "job_id", "commit_unix_us", "start_unix_us", "latency_us",
	"notified_us", "claim_sent_us", "claim_returned_us", "started_us", "request_written_us", "request_received_us",
}

// recordLatencies writes each committed job's commit and start times to
// Options.Latencies, in commit order, when it is set, and with jobs, its
// marks.
func (b *bench) recordLatencies(scenario string, writers int, p *probe, committed map[int64]time.Time, jobs map[int64]marks) error {
	if b.latencies == nil {
		return nil
	}
	ids := slices.SortedFunc(maps.Keys(committed), func(x, y int64) int { return committed[x].Compare(committed[y]) })
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, id := range ids {
		commit, started := committed[id], p.started[id]
		m, ok := jobs[id]
		if ok {
			started = m[markStarted]
		}
		c, s := commit.UnixMicro(), started.UnixMicro()
		row := []string{scenario, strconv.Itoa(writers), strconv.FormatInt(id, 10)}
		for _, us := range []int64{c, s, s - c} {
			row = append(row, strconv.FormatInt(us, 10))
		}
		for i := markNotified; i < nMarks; i++ {
			cell := ""
			if ok && !m[i].IsZero() {
				cell = strconv.FormatInt(m[i].Sub(commit).Microseconds(), 10)
			}
			row = append(row, cell)
		}
		if err := b.latencies.Write(row); err != nil {
			return fmt.Errorf("--latencies: %w", err)
		}
	}
	return nil
}
