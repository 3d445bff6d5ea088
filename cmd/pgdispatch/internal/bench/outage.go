package bench

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/endpoints"
	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/executors/httpcallback"
)

// slowHealthy is the delay past which the outage scenario's log counts a
// healthy endpoint's job, by the second of the run it was committed in.
const slowHealthy = 20 * time.Millisecond

// outageEndpoints is how many receivers the outage scenario's jobs go to,
// each on a port of its own, so an endpoint of its own.
const outageEndpoints = 10

// outage: the circuit breaker per endpoint under load. OutageRate
// http_callback jobs a second, one per transaction, round robin to 10
// receivers on loopback, one worker with the breaker. In the outage run the
// first receiver answers 503 for the first half of OutageLength and hangs
// (no answer until the client gives up) for the second; the load goes on
// until it is healthy again, its circuit closed and its backlog delivered.
// The run without a failing endpoint has the same load for as long, and the
// two alternate OutageRounds times. Figures: the other nine endpoints'
// commit → request received in each, the failing endpoint's requests while
// its circuit was open beside its probes (the breaker's log), and its
// backlog: delivered, in the order of run_at (by the claims that delivered
// them), none lost, none dead.
func (b *bench) outage(ctx context.Context) ([]*Result, error) {
	var out, base []time.Duration
	total := outageRun{}
	for round := range b.opts.OutageRounds {
		o, err := b.outageRun(ctx, true, 0)
		if err != nil {
			return nil, fmt.Errorf("round %d, outage: %w", round+1, err)
		}
		h, err := b.outageRun(ctx, false, o.length)
		if err != nil {
			return nil, fmt.Errorf("round %d, no outage: %w", round+1, err)
		}
		fmt.Fprintf(b.log, "bench: outage: round %d: %s of load; healthy p99 %.1f ms with the outage, %.1f ms without; open %.1fs, %d requests while open, %d probes\n",
			round+1, o.length.Round(time.Millisecond), ms(quantile(o.latencies, 0.99)), ms(quantile(h.latencies, 0.99)),
			o.closed.Sub(o.opened).Seconds(), o.whileOpen, o.probes)
		out, base = append(out, o.latencies...), append(base, h.latencies...)
		total.add(o)
		total.dead += h.dead
		total.lost += h.lost
	}
	r := &Result{Scenario: "outage", Conditions: fmt.Sprintf("%d http_callback jobs a second, one per transaction, round robin to %d receivers on loopback, one worker, CONCURRENCY=%d, the breaker's defaults but a cool-down of %s; one receiver answers 503 for %s then hangs for %s, each request's timeout %s; %d rounds of that run and one as long with no failing receiver, alternated",
		b.opts.OutageRate, outageEndpoints, b.base.Concurrency, b.opts.OutageCoolDown, b.opts.OutageLength/2, b.opts.OutageLength-b.opts.OutageLength/2,
		b.opts.OutageTimeout, b.opts.OutageRounds)}
	addOutagePercentiles(r, "healthy_commit_to_request", "outage", out)
	addOutagePercentiles(r, "healthy_commit_to_request", "none", base)
	if len(out) > 0 && len(base) > 0 {
		for _, q := range []string{"p50", "p99"} {
			f := r.Figures
			r.set("healthy_"+q+"_ratio", f["healthy_commit_to_request_"+q+"_ms_outage"]/f["healthy_commit_to_request_"+q+"_ms_none"])
		}
	}
	r.set("failing_requests_before_open", float64(total.beforeOpen))
	r.set("failing_requests_while_open", float64(total.whileOpen))
	r.set("failing_probes", float64(total.probes))
	r.set("failing_open_s", total.openFor.Seconds())
	r.set("backlog_jobs", float64(total.backlog))
	r.set("backlog_delivered", float64(total.delivered))
	r.set("backlog_retried", float64(total.retried))
	r.set("backlog_out_of_order", float64(total.outOfOrder))
	r.set("later_jobs_before_backlog", float64(total.overtaken))
	r.set("lost", float64(total.lost))
	r.set("dead", float64(total.dead))
	return []*Result{r}, nil
}

// addOutagePercentiles adds the p50 and p99 of ds as base_p50_ms_run and
// base_p99_ms_run.
func addOutagePercentiles(r *Result, base, run string, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	slices.Sort(ds)
	r.set(base+"_p50_ms_"+run, ms(quantile(ds, 0.5)))
	r.set(base+"_p99_ms_"+run, ms(quantile(ds, 0.99)))
}

// quantile is the q quantile of ds, which it sorts; 0 for none.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[min(len(ds)-1, int(q*float64(len(ds))))]
}

// outageRun is what one run of the outage scenario saw.
type outageRun struct {
	latencies []time.Duration // the healthy endpoints' commit → request received
	length    time.Duration   // of the load
	// The failing endpoint's, in an outage run: when its circuit opened
	// and closed again, the breaker's probes, its requests before the
	// circuit opened and while it was open.
	opened, closed        time.Time
	openFor               time.Duration
	probes                int
	beforeOpen, whileOpen int
	backlog, delivered    int // its jobs committed from the outage's start until the circuit closed
	retried               int // backlog jobs with a request refused, retried on their own schedule
	outOfOrder            int // of the others, the fewest that, left out, leave the rest delivered in order
	overtaken             int // of the others, those delivered by a later claim than a job committed after the circuit closed
	lost, dead            int // jobs not delivered in the end, and dead (every endpoint's)
}

func (t *outageRun) add(o *outageRun) {
	t.openFor += o.closed.Sub(o.opened)
	t.probes += o.probes
	t.beforeOpen += o.beforeOpen
	t.whileOpen += o.whileOpen
	t.backlog += o.backlog
	t.delivered += o.delivered
	t.retried += o.retried
	t.outOfOrder += o.outOfOrder
	t.overtaken += o.overtaken
	t.lost += o.lost
	t.dead += o.dead
}

// outageReceiver is one endpoint of the outage scenario: a server on
// loopback that records every request's arrival and each job's delivery
// (its first request answered 204). A failing one answers 503 for the
// first half of its outage and hangs for the second.
type outageReceiver struct {
	url         string
	srv         *http.Server
	outageStart time.Time // zero: never fails
	outage      time.Duration

	mu        sync.Mutex
	requests  []time.Time
	delivered map[int64]time.Time
	refused   map[int64]bool // jobs whose request was refused (503 or no answer)
}

func startOutageReceiver() (*outageReceiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &outageReceiver{url: "http://" + ln.Addr().String() + "/hook", delivered: map[int64]time.Time{}, refused: map[int64]bool{}}
	r.srv = &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = r.srv.Serve(ln) }()
	return r, nil
}

func (r *outageReceiver) fail(start time.Time, length time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.outageStart, r.outage = start, length
}

func (r *outageReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	now := time.Now()
	id, _ := strconv.ParseInt(req.Header.Get("Pgdispatch-Job-Id"), 10, 64)
	r.mu.Lock()
	r.requests = append(r.requests, now)
	since, outage := now.Sub(r.outageStart), r.outage
	failing := !r.outageStart.IsZero() && since < outage
	if failing {
		r.refused[id] = true
	} else {
		if _, ok := r.delivered[id]; !ok {
			r.delivered[id] = now
		}
	}
	r.mu.Unlock()
	switch {
	case failing && since < outage/2:
		http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
	case failing:
		<-req.Context().Done() // hangs until the client gives up
	default:
		w.WriteHeader(http.StatusNoContent)
	}
}

// deliveredAt is when job id was delivered, if it was.
func (r *outageReceiver) deliveredAt(id int64) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	at, ok := r.delivered[id]
	return at, ok
}

// claimedExec is the outage scenario's http_callback executor: it notes the
// claim of each job's attempt that succeeded, as the time that claim was
// sent (hops), the same for every job of one claim.
type claimedExec struct {
	exec executors.Executor
	hops *hops
	mu   sync.Mutex
	by   map[int64]time.Time
}

func (e *claimedExec) Execute(ctx context.Context, job *executors.Job) error {
	err := e.exec.Execute(ctx, job)
	if err == nil {
		e.hops.mu.Lock()
		sent := e.hops.sent[job.ID]
		e.hops.mu.Unlock()
		e.mu.Lock()
		e.by[job.ID] = sent
		e.mu.Unlock()
	}
	return err
}

// breakerEvents are the changes of the failing endpoint's circuit, read
// from the breaker's log.
type breakerEvents struct {
	opened, closed time.Time
	probes         int
}

func readBreakerLog(logs *observer.ObservedLogs, endpoint string) breakerEvents {
	var ev breakerEvents
	for _, e := range logs.All() {
		if e.ContextMap()["endpoint"] != endpoint {
			continue
		}
		// The line of an event (opened, closed) is logged when a worker
		// reads it, after the jobs it let go may have reached the
		// receiver: its at field says when it happened.
		at, ok := e.ContextMap()["at"].(time.Time)
		if !ok {
			at = e.Time
		}
		switch {
		case strings.HasPrefix(e.Message, "probing"):
			ev.probes++
		case strings.HasPrefix(e.Message, "endpoint open") && ev.opened.IsZero():
			ev.opened = at
		case strings.HasPrefix(e.Message, "endpoint closed") && !ev.opened.IsZero() && ev.closed.IsZero():
			ev.closed = at
		}
	}
	return ev
}

// outageJob is a job the outage scenario's producer committed.
type outageJob struct {
	id        int64
	endpoint  int
	committed time.Time
}

// outageRun runs the load on a fresh schema: with failing, until the
// failing endpoint is healthy again, its circuit closed and its backlog
// delivered (or a bound passed); without, for length.
func (b *bench) outageRun(ctx context.Context, failing bool, length time.Duration) (*outageRun, error) {
	schema, drop, err := b.schema(ctx)
	if err != nil {
		return nil, err
	}
	defer drop()
	rcvs := make([]*outageReceiver, outageEndpoints)
	payloads := make([][]byte, outageEndpoints)
	for i := range rcvs {
		if rcvs[i], err = startOutageReceiver(); err != nil {
			return nil, err
		}
		defer func() { _ = rcvs[i].srv.Close() }()
		payloads[i], _ = json.Marshal(map[string]string{"url": rcvs[i].url, "timeout": b.opts.OutageTimeout.String()})
	}
	u, _ := httpcallback.PayloadURL(payloads[0])
	failingEndpoint := endpoints.Of(u)

	core, logs := observer.New(zapcore.InfoLevel)
	br, err := endpoints.New(endpoints.Config{DB: b.pool, Schema: schema, CoolDown: b.opts.OutageCoolDown, Logger: zap.New(core)})
	if err != nil {
		return nil, err
	}
	exec, err := httpcallback.New(httpcallback.Config{AllowNetworks: []string{httpcallback.NetworksLoopback}, Breaker: br})
	if err != nil {
		return nil, err
	}
	p := newCounter(0)
	p.hops = newHops()
	claimed := &claimedExec{exec: exec, hops: p.hops, by: map[int64]time.Time{}}
	stopWorker, err := b.runWorker(ctx, schema, p, func(c *pgdispatch.Config) {
		c.Registry.Register(httpcallback.Kind, claimed)
		c.Endpoints = br
		setDeleteDone(c, false)
	})
	if err != nil {
		return nil, err
	}
	workerStopped := false
	defer func() {
		if !workerStopped {
			stopWorker()
		}
	}()

	conn, err := b.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	insert := "INSERT INTO " + pgx.Identifier{schema, "jobs"}.Sanitize() + " (kind, payload) VALUES ('http_callback', $1) RETURNING id"

	start := time.Now()
	if failing {
		rcvs[0].fail(start, b.opts.OutageLength)
	}
	// bound: the longest the load waits for the failing endpoint to heal
	bound := b.opts.OutageLength + 8*b.opts.OutageCoolDown + 4*b.opts.OutageTimeout + 30*time.Second
	var jobs []outageJob
	var ev breakerEvents
	every := time.Second / time.Duration(b.opts.OutageRate)
	for i := 0; ; i++ {
		if d := time.Until(start.Add(time.Duration(i) * every)); d > 0 {
			time.Sleep(d) // the load's pace, not synchronisation
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		elapsed := time.Since(start)
		if !failing && elapsed >= length {
			break
		}
		if failing && elapsed >= b.opts.OutageLength && i%max(b.opts.OutageRate/20, 1) == 0 {
			if ev = readBreakerLog(logs, failingEndpoint); (!ev.closed.IsZero() && backlogDelivered(jobs, rcvs[0], ev.closed)) || elapsed > bound {
				break
			}
		}
		e := i % outageEndpoints
		var id int64
		if err := conn.QueryRow(ctx, insert, payloads[e]).Scan(&id); err != nil {
			return nil, err
		}
		jobs = append(jobs, outageJob{id: id, endpoint: e, committed: time.Now()})
	}
	run := &outageRun{length: time.Since(start)}

	// The jobs of the last moments, delivered.
	drainBound := time.Now().Add(b.opts.OutageCoolDown + 2*b.opts.OutageTimeout + 10*time.Second)
	for !allDelivered(jobs, rcvs) && time.Now().Before(drainBound) {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	stopWorker()
	workerStopped = true
	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := b.pool.QueryRow(dctx, "SELECT count(*) FROM "+pgx.Identifier{schema, "jobs"}.Sanitize()+" WHERE status = 'dead'").Scan(&run.dead); err != nil {
		return nil, err
	}

	slow := map[int]int{}                 // the healthy jobs slower than slowHealthy, by second of the run
	byWindow := map[int][]time.Duration{} // the healthy jobs' delays, by 10 s of the run
	for _, j := range jobs {
		at, ok := rcvs[j.endpoint].deliveredAt(j.id)
		if !ok {
			run.lost++
			continue
		}
		if j.endpoint != 0 {
			run.latencies = append(run.latencies, at.Sub(j.committed))
			w := int(j.committed.Sub(start) / (10 * time.Second))
			byWindow[w] = append(byWindow[w], at.Sub(j.committed))
			if at.Sub(j.committed) > slowHealthy {
				slow[int(j.committed.Sub(start).Seconds())]++
			}
		}
	}
	if len(slow) > 0 {
		secs := slices.SortedFunc(maps.Keys(slow), func(a, b int) int { return cmp.Compare(slow[b], slow[a]) })
		var parts []string
		for _, s := range secs[:min(len(secs), 6)] {
			parts = append(parts, fmt.Sprintf("%ds: %d", s, slow[s]))
		}
		fmt.Fprintf(b.log, "bench: outage: healthy jobs slower than %s (failing: %v), by second of the run: %s\n", slowHealthy, failing, strings.Join(parts, ", "))
	}
	var medians []string
	for w := range len(byWindow) {
		medians = append(medians, fmt.Sprintf("%.2f", ms(quantile(byWindow[w], 0.5))))
	}
	fmt.Fprintf(b.log, "bench: outage: healthy p50 ms by 10 s of the run (failing: %v): %s\n", failing, strings.Join(medians, " "))
	if !failing {
		return run, nil
	}
	ev = readBreakerLog(logs, failingEndpoint)
	run.opened, run.closed, run.probes = ev.opened, ev.closed, ev.probes
	if ev.closed.IsZero() {
		run.closed = time.Now()
	}
	rcvs[0].mu.Lock()
	for _, at := range rcvs[0].requests {
		switch {
		case ev.opened.IsZero() || at.Before(ev.opened):
			run.beforeOpen++
		case at.Before(run.closed):
			run.whileOpen++
		}
	}
	rcvs[0].mu.Unlock()
	backlogOrder(run, jobs, rcvs[0], claimed, start)
	return run, nil
}

// backlogDelivered says whether every job of the failing endpoint committed
// before closed was delivered.
func backlogDelivered(jobs []outageJob, r *outageReceiver, closed time.Time) bool {
	for _, j := range jobs {
		if j.endpoint != 0 || !j.committed.Before(closed) {
			continue
		}
		if _, ok := r.deliveredAt(j.id); !ok {
			return false
		}
	}
	return true
}

func allDelivered(jobs []outageJob, rcvs []*outageReceiver) bool {
	for _, j := range jobs {
		if _, ok := rcvs[j.endpoint].deliveredAt(j.id); !ok {
			return false
		}
	}
	return true
}

// backlogOrder counts the failing endpoint's backlog (its jobs committed
// from start until the circuit closed), those delivered and those retried
// (a request refused: they wait for their retry, whose run_at is later).
// Of the others, the jobs the breaker alone held, it counts those out of
// order: the fewest that, left out, leave the rest delivered by claims in
// the order the jobs were committed (the jobs of one claim run at once:
// their order among themselves is not counted); and those overtaken:
// delivered by a later claim than a job of the endpoint committed after
// the circuit closed.
func backlogOrder(run *outageRun, jobs []outageJob, r *outageReceiver, e *claimedExec, start time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	var firstAfter time.Time // the first claim of a job committed after the circuit closed
	for _, j := range jobs {
		if c, ok := e.by[j.id]; ok && j.endpoint == 0 && !j.committed.Before(run.closed) && (firstAfter.IsZero() || c.Before(firstAfter)) {
			firstAfter = c
		}
	}
	var claims []time.Time // the held jobs' claims, in commit order: one producer, so id and run_at order too
	for _, j := range jobs {
		if j.endpoint != 0 || j.committed.Before(start) || !j.committed.Before(run.closed) {
			continue
		}
		run.backlog++
		c, claimed := e.by[j.id]
		if _, ok := r.delivered[j.id]; ok && claimed {
			run.delivered++
		}
		if r.refused[j.id] {
			run.retried++
			continue
		}
		if !claimed {
			continue
		}
		claims = append(claims, c)
		if !firstAfter.IsZero() && c.After(firstAfter) {
			run.overtaken++
		}
	}
	run.outOfOrder = len(claims) - longestInOrder(claims)
}

// longestInOrder is the length of the longest subsequence of ts that does
// not go back in time.
func longestInOrder(ts []time.Time) int {
	var tails []time.Time // tails[k]: the least last element of such a subsequence of length k+1
	for _, t := range ts {
		k, _ := slices.BinarySearchFunc(tails, t, func(a, b time.Time) int {
			if a.After(b) {
				return 1
			}
			return -1 // equal times extend a subsequence: search past them
		})
		if k == len(tails) {
			tails = append(tails, t)
		} else {
			tails[k] = t
		}
	}
	return len(tails)
}
