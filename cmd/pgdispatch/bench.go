package main

import (
	"context"
	"crypto/rand"
	"encoding/csv"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/pgcluster"
	"github.com/pgdispatch/pgdispatch/migrations"
)

var benchScenarios = []string{"latency", "drain", "floor", "http", "sustained", "writers", "idle"}

// soak is a scenario of its own, left out of the default set: it runs for
// minutes.
var allScenarios = append(slices.Clone(benchScenarios), "soak")

type benchOptions struct {
	scenarios    []string
	jobs         int           // latency: jobs inserted one by one
	spacing      time.Duration // latency: pause between them
	drainJobs    int
	writers      []int
	duration     time.Duration // sustained and writers: per run
	idleDuration time.Duration
	soakDuration time.Duration
	soakWriters  int
	concurrency  int
	json         bool
}

// benchResult is one scenario's figures. Durations are in milliseconds.
type benchResult struct {
	Scenario   string             `json:"scenario"`
	Conditions string             `json:"conditions"`
	Figures    map[string]float64 `json:"figures"`
	order      []string
}

func (r *benchResult) set(name string, v float64) {
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

func benchCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench", "Measure latency, throughput, writer overhead and idle cost with no-op jobs, in a schema\n"+
		"of its own that it creates and drops. With no DATABASE_URL it starts a throwaway PostgreSQL\n"+
		"(fsync and synchronous_commit on). The idle scenario reads pg_stat_database, so run it on a\n"+
		"database nothing else uses.", stderr)
	benchConn := withDefaults(connSettings, map[string]string{"LOG_LEVEL": "error", "LOG_FORMAT": "console"})
	v := newValues(fs, benchConn, workerSettings)
	scenarios := fs.String("scenario", strings.Join(benchScenarios, ","), "comma-separated scenarios: "+strings.Join(allScenarios, ", ")+
		" (soak is not in the default set)")
	var o benchOptions
	fs.IntVar(&o.jobs, "jobs", 500, "latency: jobs inserted one per transaction")
	fs.DurationVar(&o.spacing, "spacing", 5*time.Millisecond, "latency: pause between those inserts")
	fs.IntVar(&o.drainJobs, "drain-jobs", 100000, "drain: jobs inserted before the worker starts")
	writers := fs.String("writers", "4,16", "sustained and writers: writer connection counts, comma-separated")
	fs.DurationVar(&o.duration, "duration", 4*time.Second, "sustained: length of each run; writers: the time each side gets, in four turns")
	fs.DurationVar(&o.idleDuration, "idle-duration", 60*time.Second, "idle: how long to count transactions")
	fs.DurationVar(&o.soakDuration, "soak-duration", 10*time.Minute, "soak: how long writers and the worker run")
	fs.IntVar(&o.soakWriters, "soak-writers", 4, "soak: writer connections")
	fs.BoolVar(&o.json, "json", false, "print the results as JSON")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	latencies := fs.String("latencies", "", "latency and sustained: write each job's commit and start times to this CSV file, to see when the slowest ones ran")
	if err := parse(fs, args); err != nil {
		return err
	}
	for _, s := range strings.Split(*scenarios, ",") {
		s = strings.TrimSpace(s)
		if !slices.Contains(allScenarios, s) {
			return fmt.Errorf("--scenario %q: want some of %s", s, strings.Join(allScenarios, ", "))
		}
		o.scenarios = append(o.scenarios, s)
	}
	for _, w := range strings.Split(*writers, ",") {
		var n int
		if _, err := fmt.Sscan(strings.TrimSpace(w), &n); err != nil || n <= 0 {
			return fmt.Errorf("--writers %q: want positive whole numbers", *writers)
		}
		o.writers = append(o.writers, n)
	}
	if o.jobs <= 0 || o.drainJobs <= 0 || o.duration <= 0 || o.idleDuration <= 0 || o.soakDuration <= 0 || o.soakWriters <= 0 {
		return errors.New("--jobs, --drain-jobs, --duration, --idle-duration, --soak-duration and --soak-writers must be above 0")
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
	if direct := v.str("LISTEN_DATABASE_URL"); behindPooler(dbURL, direct) {
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
	o.concurrency = base.Concurrency
	b := &bench{pool: c.pool, base: base, opts: o, log: stderr}
	if *latencies != "" {
		f, err := os.Create(*latencies)
		if err != nil {
			return err
		}
		defer func() { _ = f.Close() }()
		b.latencies = csv.NewWriter(f)
		if err := b.latencies.Write([]string{"scenario", "writers", "job_id", "commit_unix_us", "start_unix_us", "latency_us"}); err != nil {
			return err
		}
	}

	var results []*benchResult
	for _, s := range o.scenarios {
		fmt.Fprintf(stderr, "bench: %s...\n", s)
		var rs []*benchResult
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
		}
		if err != nil {
			return fmt.Errorf("bench %s: %w", s, err)
		}
		results = append(results, rs...)
	}
	if b.latencies != nil {
		if b.latencies.Flush(); b.latencies.Error() != nil {
			return fmt.Errorf("--latencies: %w", b.latencies.Error())
		}
	}
	if o.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(results)
	}
	fmt.Fprintf(stdout, "pgdispatch bench on %d CPUs, %s\n", runtime.NumCPU(), b.serverVersion(ctx))
	for _, r := range results {
		fmt.Fprintf(stdout, "\n%s (%s)\n", r.Scenario, r.Conditions)
		for _, name := range r.order {
			fmt.Fprintf(stdout, "  %-24s %12.3f\n", name, r.Figures[name])
		}
	}
	return nil
}

type bench struct {
	pool      *pgxpool.Pool
	base      pgdispatch.Config
	opts      benchOptions
	log       io.Writer
	latencies *csv.Writer // --latencies, or nil
}

// recordLatencies writes each committed job's commit and start times to
// --latencies, in commit order, when it is set.
func (b *bench) recordLatencies(scenario string, writers int, p *probe, committed map[int64]time.Time) error {
	if b.latencies == nil {
		return nil
	}
	ids := slices.SortedFunc(maps.Keys(committed), func(x, y int64) int { return committed[x].Compare(committed[y]) })
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, id := range ids {
		c, s := committed[id].UnixMicro(), p.started[id].UnixMicro()
		row := []string{scenario, strconv.Itoa(writers), strconv.FormatInt(id, 10)}
		for _, us := range []int64{c, s, s - c} {
			row = append(row, strconv.FormatInt(us, 10))
		}
		if err := b.latencies.Write(row); err != nil {
			return fmt.Errorf("--latencies: %w", err)
		}
	}
	return nil
}

func (b *bench) serverVersion(ctx context.Context) string {
	var v, sc string
	_ = b.pool.QueryRow(ctx, "SELECT current_setting('server_version'), current_setting('synchronous_commit')").Scan(&v, &sc)
	return "PostgreSQL " + v + ", synchronous_commit=" + sc
}

// schema creates and migrates a fresh schema, dropped by the returned func.
func (b *bench) schema(ctx context.Context) (string, func(), error) {
	buf := make([]byte, 4)
	_, _ = rand.Read(buf)
	schema := "pgdispatch_bench_" + hex.EncodeToString(buf)
	if _, _, err := migrations.Migrate(ctx, b.pool, migrations.Config{Schema: schema}); err != nil {
		return "", nil, err
	}
	return schema, func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		_, _ = b.pool.Exec(dctx, "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	}, nil
}

// probe is the benchmark's executor: a no-op that records when each job
// started, on the same monotonic clock as the producers' commits. The drain's
// probe only counts: a map of 200,000 start times was 6.7 % of the process's
// CPU in a drain (pprof), work no worker of a real no-op job does.
type probe struct {
	mu      sync.Mutex
	started map[int64]time.Time
	count   atomic.Int64
	target  int64
	done    chan struct{}
	once    sync.Once
	worker  *pgdispatch.Worker // set once the worker runs
}

func newProbe(target int64) *probe {
	return &probe{started: map[int64]time.Time{}, target: target, done: make(chan struct{})}
}

// newCounter is a probe that records no start times.
func newCounter(target int64) *probe {
	return &probe{target: target, done: make(chan struct{})}
}

func (p *probe) Execute(_ context.Context, job *executors.Job) error {
	if p.started != nil {
		now := time.Now()
		p.mu.Lock()
		p.started[job.ID] = now
		p.mu.Unlock()
	}
	if n := p.count.Add(1); p.target > 0 && n >= p.target {
		p.once.Do(func() { close(p.done) })
	}
	return nil
}

// runWorker starts a worker on schema with the probe as noop and returns
// its stop function, which waits for the graceful shutdown.
func (b *bench) runWorker(ctx context.Context, schema string, p *probe, tune func(*pgdispatch.Config)) (stop func(), err error) {
	cfg := b.base
	cfg.Schema = schema
	cfg.Registry = executors.NewRegistry()
	cfg.Registry.Register(executors.KindNoop, p)
	cfg.Logger = zap.NewNop()
	listening := make(chan struct{}, 1)
	cfg.OnListen = func() {
		select {
		case listening <- struct{}{}:
		default:
		}
	}
	if tune != nil {
		tune(&cfg)
	}
	w, err := pgdispatch.NewWorker(cfg)
	if err != nil {
		return nil, err
	}
	p.worker = w
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	select {
	case <-listening:
	case err := <-done:
		cancel()
		return nil, err
	case <-time.After(30 * time.Second):
		cancel()
		return nil, errors.New("the worker's listener did not connect")
	}
	return func() {
		cancel()
		if err := <-done; err != nil {
			fmt.Fprintln(b.log, "bench: worker stopped with:", err)
		}
	}, nil
}

// connect opens a connection of its own, for a producer, configured as the
// pool's: the URL may hold pool settings (pool_max_conns), which pgx.Connect
// would send to the server as parameters it does not know.
func (b *bench) connect(ctx context.Context) (*pgx.Conn, error) {
	return pgx.ConnectConfig(ctx, b.pool.Config().ConnConfig.Copy())
}

// worker makes a schema and runs a worker on it with a probe; cleanup stops
// the worker and drops the schema.
func (b *bench) worker(ctx context.Context, target int64, tune func(*pgdispatch.Config)) (schema string, p *probe, cleanup func(), err error) {
	schema, drop, err := b.schema(ctx)
	if err != nil {
		return "", nil, nil, err
	}
	p = newProbe(target)
	stop, err := b.runWorker(ctx, schema, p, tune)
	if err != nil {
		drop()
		return "", nil, nil, err
	}
	return schema, p, func() { stop(); drop() }, nil
}

// latency: an idle worker; jobs inserted one per transaction from another
// connection, spaced apart; commit-return to executor start.
func (b *bench) latency(ctx context.Context) ([]*benchResult, error) {
	schema, p, cleanup, err := b.worker(ctx, 0, nil)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	conn, err := b.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	insert := "INSERT INTO " + pgx.Identifier{schema, "jobs"}.Sanitize() + " (kind) VALUES ('noop') RETURNING id"
	committed := make(map[int64]time.Time, b.opts.jobs)
	for range b.opts.jobs {
		var id int64
		if err := conn.QueryRow(ctx, insert).Scan(&id); err != nil {
			return nil, err
		}
		committed[id] = time.Now()
		time.Sleep(b.opts.spacing) // the scenario's pacing, not synchronisation
	}
	lat, err := waitLatencies(ctx, p, committed, 30*time.Second)
	if err != nil {
		return nil, err
	}
	if err := b.recordLatencies("latency", 1, p, committed); err != nil {
		return nil, err
	}
	r := &benchResult{Scenario: "latency", Conditions: fmt.Sprintf("%d jobs, one per transaction, %s apart, idle worker, CONCURRENCY=%d, worker's synchronous_commit=%s",
		b.opts.jobs, b.opts.spacing, b.opts.concurrency, b.pool.Config().ConnConfig.RuntimeParams["synchronous_commit"])}
	addPercentiles(r, "latency_ms", lat)
	return []*benchResult{r}, nil
}

// waitLatencies waits until every committed job started and returns the
// commit-to-start delays.
func waitLatencies(ctx context.Context, p *probe, committed map[int64]time.Time, timeout time.Duration) ([]time.Duration, error) {
	deadline := time.Now().Add(timeout)
	for {
		p.mu.Lock()
		var lat []time.Duration
		missing := 0
		for id, c := range committed {
			s, ok := p.started[id]
			if !ok {
				missing++
				continue
			}
			lat = append(lat, s.Sub(c))
		}
		p.mu.Unlock()
		if missing == 0 {
			return lat, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d of %d jobs never started", missing, len(committed))
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func addPercentiles(r *benchResult, name string, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	pick := func(q float64) time.Duration { return ds[min(len(ds)-1, int(q*float64(len(ds))))] }
	base := strings.TrimSuffix(name, "_ms")
	r.set(base+"_p50_ms", ms(pick(0.50)))
	r.set(base+"_p90_ms", ms(pick(0.90)))
	r.set(base+"_p99_ms", ms(pick(0.99)))
	r.set(base+"_max_ms", ms(ds[len(ds)-1]))
}

// drain: N jobs inserted first, then one worker, timed until all are done;
// with done jobs deleted at once (RETAIN_DONE=0) and kept (RETAIN_DONE=24h).
func (b *bench) drain(ctx context.Context) ([]*benchResult, error) {
	var out []*benchResult
	for _, deleteDone := range []bool{true, false} {
		schema, drop, err := b.schema(ctx)
		if err != nil {
			return nil, err
		}
		jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
		if _, err := b.pool.Exec(ctx, "INSERT INTO "+jobs+" (kind) SELECT 'noop' FROM generate_series(1, $1)", b.opts.drainJobs); err != nil {
			drop()
			return nil, err
		}
		if _, err := b.pool.Exec(ctx, "VACUUM ANALYZE "+jobs); err != nil {
			drop()
			return nil, err
		}
		p := newCounter(int64(b.opts.drainJobs))
		start := time.Now()
		stop, err := b.runWorker(ctx, schema, p, func(c *pgdispatch.Config) { c.DeleteDone = deleteDone })
		if err != nil {
			drop()
			return nil, err
		}
		select {
		case <-p.done:
		case <-ctx.Done():
			stop()
			drop()
			return nil, ctx.Err()
		}
		executed := time.Since(start)
		stats := p.worker.Claimer(pgdispatch.DefaultQueue).Stats()
		stop() // writes the last outcomes
		recorded := time.Since(start)
		var left int64
		_ = b.pool.QueryRow(ctx, "SELECT count(*) FROM "+jobs+" WHERE status <> 'done'").Scan(&left)
		drop()
		retain := "RETAIN_DONE=24h (done jobs kept)"
		if deleteDone {
			retain = "RETAIN_DONE=0 (done jobs deleted)"
		}
		r := &benchResult{Scenario: "drain", Conditions: fmt.Sprintf("%d jobs, one worker, CONCURRENCY=%d, %s", b.opts.drainJobs, b.opts.concurrency, retain)}
		r.set("jobs_per_s", float64(b.opts.drainJobs)/executed.Seconds())
		r.set("jobs_per_s_recorded", float64(b.opts.drainJobs)/recorded.Seconds())
		r.set("seconds", executed.Seconds())
		r.set("jobs_per_claim", float64(stats.Claimed)/float64(max(stats.Claims, 1)))
		r.set("not_done_after", float64(left))
		out = append(out, r)
	}
	return out, nil
}

// roundTripEvery is how often the sustained scenario's extra connection
// sends a bare SELECT 1 while the writers run.
const roundTripEvery = 2 * time.Millisecond

// writerLoad runs k connections inserting one job per transaction for d and
// returns the commit times by id. If withRoundTrips, one more connection
// sends SELECT 1 every roundTripEvery during the same window and the round
// trips' durations are returned: what one round trip to the server costs on
// the machine the writers load, the least a claim can take.
func (b *bench) writerLoad(ctx context.Context, schema string, k int, d time.Duration, withRoundTrips bool) (map[int64]time.Time, []time.Duration, error) {
	insert := "INSERT INTO " + pgx.Identifier{schema, "jobs"}.Sanitize() + " (kind) VALUES ('noop') RETURNING id"
	// Connect and prepare first, then start every writer at once: the
	// writers' time is spent inserting, not connecting and warming caches,
	// which a loaded machine makes slower in one turn than in the next.
	conns := make([]*pgx.Conn, k)
	defer func() {
		for _, conn := range conns {
			if conn != nil {
				_ = conn.Close(context.WithoutCancel(ctx))
			}
		}
	}()
	for i := range conns {
		conn, err := b.connect(ctx)
		if err != nil {
			return nil, nil, err
		}
		conns[i] = conn
		if _, err := conn.Prepare(ctx, "insert", insert); err != nil {
			return nil, nil, err
		}
	}
	var pinger *pgx.Conn
	if withRoundTrips {
		var err error
		if pinger, err = b.connect(ctx); err != nil {
			return nil, nil, err
		}
		defer pinger.Close(context.WithoutCancel(ctx)) //nolint:errcheck // nothing to do about it
	}
	var (
		mu        sync.Mutex
		committed = map[int64]time.Time{}
		wg        sync.WaitGroup
		firstErr  error
	)
	start := make(chan struct{})
	var end time.Time // set before start closes
	for _, conn := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			local := map[int64]time.Time{}
			for time.Now().Before(end) && ctx.Err() == nil {
				var id int64
				if err := conn.QueryRow(ctx, "insert").Scan(&id); err != nil {
					mu.Lock()
					firstErr = cmpErr(firstErr, err)
					mu.Unlock()
					return
				}
				local[id] = time.Now()
			}
			mu.Lock()
			for id, t := range local {
				committed[id] = t
			}
			mu.Unlock()
		}()
	}
	var roundTrips []time.Duration
	if pinger != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			var err error
			roundTrips, err = timeRoundTrips(ctx, pinger, end)
			mu.Lock()
			firstErr = cmpErr(firstErr, err)
			mu.Unlock()
		}()
	}
	end = time.Now().Add(d)
	close(start)
	wg.Wait()
	return committed, roundTrips, firstErr
}

// timeRoundTrips sends SELECT 1 on conn every roundTripEvery until end and
// returns how long each took.
func timeRoundTrips(ctx context.Context, conn *pgx.Conn, end time.Time) ([]time.Duration, error) {
	tick := time.NewTicker(roundTripEvery)
	defer tick.Stop()
	var out []time.Duration
	for time.Now().Before(end) {
		select {
		case <-ctx.Done():
			return out, ctx.Err()
		case <-tick.C:
		}
		sent := time.Now()
		if err := conn.PgConn().Exec(ctx, "SELECT 1").Close(); err != nil {
			return out, err
		}
		out = append(out, time.Since(sent))
	}
	return out, nil
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// sustained: K writers at full speed while a worker runs.
func (b *bench) sustained(ctx context.Context) ([]*benchResult, error) {
	var out []*benchResult
	for _, k := range b.opts.writers {
		schema, p, cleanup, err := b.worker(ctx, 0, nil)
		if err != nil {
			return nil, err
		}
		startCount := p.count.Load()
		heard := b.notifications(p)
		committed, roundTrips, err := b.writerLoad(ctx, schema, k, b.opts.duration, true)
		completedInWindow := p.count.Load() - startCount
		heard = b.notifications(p) - heard
		if err != nil {
			cleanup()
			return nil, err
		}
		lat, err := waitLatencies(ctx, p, committed, 60*time.Second)
		cleanup()
		if err != nil {
			return nil, err
		}
		if err := b.recordLatencies("sustained", k, p, committed); err != nil {
			return nil, err
		}
		r := &benchResult{Scenario: "sustained", Conditions: fmt.Sprintf("%d writers for %s, one job per transaction, CONCURRENCY=%d", k, b.opts.duration, b.opts.concurrency)}
		r.set("inserts_per_s", float64(len(committed))/b.opts.duration.Seconds())
		r.set("completed_per_s", float64(completedInWindow)/b.opts.duration.Seconds())
		r.set("notified_share", float64(heard)/float64(max(len(committed), 1)))
		addPercentiles(r, "latency_ms", lat)
		addPercentiles(r, "round_trip_ms", roundTrips)
		out = append(out, r)
	}
	return out, nil
}

// writers: the same K writers with the NOTIFY triggers enabled and disabled,
// with a worker running; the ratio is the writers' cost of the trigger. So
// that the worker does the same work in both runs, the worker of the run
// without triggers never sleeps: it polls its queue every few milliseconds,
// which is what finds jobs when nothing notifies. Each side runs four
// times, for a quarter of the duration, in the order with, without, without,
// with, then without, with, with, without, so that a drift in the machine's
// speed weighs on both alike.
func (b *bench) writers(ctx context.Context) ([]*benchResult, error) {
	var out []*benchResult
	turns := []bool{true, false, false, true, false, true, true, false}
	turn := b.opts.duration / time.Duration(len(turns)/2)
	for _, k := range b.opts.writers {
		r := &benchResult{Scenario: "writers", Conditions: fmt.Sprintf("%d writers, %s with the trigger and %s without (the worker then claims every 1 ms), in %d turns each",
			k, b.opts.duration, b.opts.duration, len(turns)/2)}
		inserts := map[bool]int{}
		var heardAll int64
		for _, trigger := range turns {
			// Without the trigger, the worker finds the jobs by its tick.
			tune := func(c *pgdispatch.Config) { c.PollInterval = time.Millisecond }
			if trigger {
				tune = nil
			}
			schema, p, cleanup, err := b.worker(ctx, 0, tune)
			if err != nil {
				return nil, err
			}
			if !trigger {
				jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
				if _, err := b.pool.Exec(ctx, "ALTER TABLE "+jobs+" DISABLE TRIGGER jobs_notify_insert"); err != nil {
					cleanup()
					return nil, err
				}
			}
			heard := b.notifications(p)
			committed, _, err := b.writerLoad(ctx, schema, k, turn, false)
			heard = b.notifications(p) - heard
			usage := b.queueUsage(ctx)
			cleanup()
			if err != nil {
				return nil, err
			}
			inserts[trigger] += len(committed)
			if trigger {
				heardAll += heard
				r.set("notify_queue_usage", max(usage, r.Figures["notify_queue_usage"]))
			}
		}
		side := b.opts.duration.Seconds()
		with, without := float64(inserts[true])/side, float64(inserts[false])/side
		r.set("notified_share", float64(heardAll)/float64(max(inserts[true], 1)))
		r.set("inserts_per_s_trigger", with)
		r.set("inserts_per_s_no_trigger", without)
		r.set("ratio", with/without)
		out = append(out, r)
	}
	return out, nil
}

// notifications is how many notifications the probe's worker has heard:
// with one worker, the writer transactions that sent NOTIFY.
func (b *bench) notifications(p *probe) int64 {
	if p.worker == nil {
		return 0
	}
	return p.worker.Listener().Notifications()
}

// queueUsage is pg_notification_queue_usage(): the share of the NOTIFY queue
// in use, which must stay near 0.
func (b *bench) queueUsage(ctx context.Context) float64 {
	var u float64
	_ = b.pool.QueryRow(ctx, "SELECT pg_notification_queue_usage()").Scan(&u)
	return u
}

// idle: what a worker with nothing to do sends: the transactions and
// statements of its pool (a tracer counts them), and the transactions its
// database commits, autovacuum's included.
func (b *bench) idle(ctx context.Context) ([]*benchResult, error) {
	// In a database of its own when the role may create one, so that the
	// commit count is the worker's alone and not also autovacuum's work on
	// the tables the other scenarios dropped.
	counter := &statementCounter{}
	ib, database, dropDB, err := b.idleBench(ctx, counter)
	if err != nil {
		return nil, err
	}
	defer dropDB()
	_, _, cleanup, err := ib.worker(ctx, 0, nil)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	// Statistics reach pg_stat_database within about 10 s of a backend
	// going idle: let the worker's start-up settle first (less on a short
	// run, whose figure is then only indicative).
	time.Sleep(min(12*time.Second, b.opts.idleDuration))
	before, err := b.xactCommit(ctx, database)
	if err != nil {
		return nil, err
	}
	tx, st := counter.transactions.Load(), counter.statements.Load()
	time.Sleep(b.opts.idleDuration)
	after, err := b.xactCommit(ctx, database)
	if err != nil {
		return nil, err
	}
	perMinute := float64(time.Minute) / float64(b.opts.idleDuration)
	r := &benchResult{Scenario: "idle", Conditions: fmt.Sprintf("one idle worker for %s, POLL_INTERVAL=%s, SWEEP_INTERVAL=%s, one queue, database %s",
		b.opts.idleDuration, b.base.PollInterval, b.base.SweepInterval, database)}
	r.set("worker_transactions_per_min", float64(counter.transactions.Load()-tx)*perMinute)
	r.set("worker_statements_per_min", float64(counter.statements.Load()-st)*perMinute)
	r.set("transactions", float64(after-before))
	return []*benchResult{r}, nil
}

// idleBench returns a bench whose pool counts what it sends with counter,
// on a fresh database when the role may create one (else on b's), the
// database's name, and a func that closes the pool and drops the database.
func (b *bench) idleBench(ctx context.Context, counter *statementCounter) (*bench, string, func(), error) {
	buf := make([]byte, 4)
	_, _ = rand.Read(buf)
	name := "pgdispatch_bench_idle_" + hex.EncodeToString(buf)
	cfg := b.pool.Config().Copy()
	cfg.ConnConfig.Tracer = counter
	drop := func() {}
	if _, err := b.pool.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		name = cfg.ConnConfig.Database
		fmt.Fprintf(b.log, "bench: idle: counting commits in %s, shared with the other scenarios (CREATE DATABASE: %v)\n", name, err)
	} else {
		drop = func() {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			_, _ = b.pool.Exec(dctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
		}
		cfg.ConnConfig.Database = name
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		drop()
		return nil, "", nil, err
	}
	ib := *b
	ib.pool = pool
	ib.base.Pool = pool
	ib.base.ListenConnConfig = b.base.ListenConnConfig.Copy()
	ib.base.ListenConnConfig.Database = name
	return &ib, name, func() { pool.Close(); drop() }, nil
}

// xactCommit reads pg_stat_database.xact_commit of database, from a
// connection to b's own database so that reading it adds nothing to it.
func (b *bench) xactCommit(ctx context.Context, database string) (int64, error) {
	var n int64
	err := b.pool.QueryRow(ctx, "SELECT xact_commit FROM pg_stat_database WHERE datname = $1", database).Scan(&n)
	return n, err
}
