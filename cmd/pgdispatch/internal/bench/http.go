package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/executors/httpcallback"
)

// receiver is the http scenario's webhook receiver: a real HTTP server on
// loopback that records when each job's request arrived.
type receiver struct {
	mu      sync.Mutex
	arrived map[int64]time.Time
	count   atomic.Int64
	target  int64
	done    chan struct{}
	once    sync.Once
	url     string
	srv     *http.Server
}

func startReceiver(target int64) (*receiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &receiver{arrived: map[int64]time.Time{}, target: target, done: make(chan struct{}), url: "http://" + ln.Addr().String() + "/hook"}
	r.srv = &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = r.srv.Serve(ln) }()
	return r, nil
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	now := time.Now()
	if id, err := strconv.ParseInt(req.Header.Get("Pgdispatch-Job-Id"), 10, 64); err == nil {
		r.mu.Lock()
		r.arrived[id] = now
		r.mu.Unlock()
	}
	if n := r.count.Add(1); r.target > 0 && n >= r.target {
		r.once.Do(func() { close(r.done) })
	}
	w.WriteHeader(http.StatusNoContent)
}

func (r *receiver) close() { _ = r.srv.Close() }

// httpWorker runs a worker whose http_callback executor may reach loopback,
// on a fresh schema, with the hops recorded.
func (b *bench) httpWorker(ctx context.Context, h *hops) (string, func(), error) {
	schema, drop, err := b.schema(ctx)
	if err != nil {
		return "", nil, err
	}
	exec, err := httpcallback.New(httpcallback.Config{AllowNetworks: []string{httpcallback.NetworksLoopback}})
	if err != nil {
		drop()
		return "", nil, err
	}
	p := newCounter(0)
	p.hops = h
	b.lonely = p
	stop, err := b.runWorker(ctx, schema, p, func(c *pgdispatch.Config) {
		c.Registry.Register(httpcallback.Kind, tracedExecutor{exec: exec, hops: h})
		setDeleteDone(c, false)
	})
	if err != nil {
		drop()
		return "", nil, err
	}
	return schema, func() { stop(); drop() }, nil
}

// httpScenario: http_callback jobs to a receiver on loopback. Latency: an
// idle worker, jobs inserted one per transaction, Gap apart, from commit to
// the request's arrival, and where the time went (hops.go). Drain: jobs
// inserted first, then delivered.
func (b *bench) httpScenario(ctx context.Context) ([]*Result, error) {
	rcv, err := startReceiver(0)
	if err != nil {
		return nil, err
	}
	defer rcv.close()
	payload, _ := json.Marshal(map[string]string{"url": rcv.url})

	h := newHops()
	schema, cleanup, err := b.httpWorker(ctx, h)
	if err != nil {
		return nil, err
	}
	insert := "INSERT INTO " + pgx.Identifier{schema, "jobs"}.Sanitize() + " (kind, payload) VALUES ('http_callback', $1) RETURNING id"
	sentAt, committed, err := b.lone(ctx, insert, payload)
	if err != nil {
		cleanup()
		return nil, err
	}
	lat, err := waitArrivals(ctx, rcv, committed, 30*time.Second)
	cleanup()
	if err != nil {
		return nil, err
	}
	jobs := make(map[int64]marks, len(committed))
	rcv.mu.Lock()
	for id, c := range committed {
		m := h.marks(id, sentAt[id])
		m[markCommit], m[markReceived] = c, rcv.arrived[id]
		jobs[id] = m
	}
	rcv.mu.Unlock()
	if err := b.recordLatencies("http", 1, newProbe(0), committed, jobs); err != nil {
		return nil, err
	}
	latency := &Result{Scenario: "http", Conditions: fmt.Sprintf("%d http_callback jobs, one per transaction, %s apart, to a Go receiver on loopback, idle worker",
		b.opts.Jobs, b.opts.Gap)}
	addPercentiles(latency, "commit_to_request_ms", lat)
	addBreakdown(latency, slices.Collect(maps.Values(jobs)))

	n := min(b.opts.DrainJobs, 20000)
	drainRcv, err := startReceiver(int64(n))
	if err != nil {
		return nil, err
	}
	defer drainRcv.close()
	payload, _ = json.Marshal(map[string]string{"url": drainRcv.url})
	schema, drop, err := b.schema(ctx)
	if err != nil {
		return nil, err
	}
	defer drop()
	if _, err := b.pool.Exec(ctx, "INSERT INTO "+pgx.Identifier{schema, "jobs"}.Sanitize()+" (kind, payload) SELECT 'http_callback', $2 FROM generate_series(1, $1)",
		n, payload); err != nil {
		return nil, err
	}
	exec, err := httpcallback.New(httpcallback.Config{AllowNetworks: []string{httpcallback.NetworksLoopback}})
	if err != nil {
		return nil, err
	}
	start := time.Now()
	stop, err := b.runWorker(ctx, schema, newCounter(0), func(c *pgdispatch.Config) { c.Registry.Register(httpcallback.Kind, exec) })
	if err != nil {
		return nil, err
	}
	select {
	case <-drainRcv.done:
	case <-ctx.Done():
		stop()
		return nil, ctx.Err()
	}
	took := time.Since(start)
	stop()
	drain := &Result{Scenario: "http_drain", Conditions: fmt.Sprintf("%d http_callback jobs to a Go receiver on loopback, one worker, CONCURRENCY=%d, done jobs kept (the HTTP client keeps at most %d connections to one host)",
		n, b.base.Concurrency, httpcallback.DefaultMaxConnsPerHost)}
	drain.set("jobs_per_s", float64(n)/took.Seconds())
	return []*Result{latency, drain}, nil
}

// waitArrivals waits until every committed job's request arrived and
// returns the commit-to-arrival delays.
func waitArrivals(ctx context.Context, r *receiver, committed map[int64]time.Time, timeout time.Duration) ([]time.Duration, error) {
	deadline := time.Now().Add(timeout)
	for {
		r.mu.Lock()
		var lat []time.Duration
		for id, c := range committed {
			if at, ok := r.arrived[id]; ok {
				lat = append(lat, at.Sub(c))
			}
		}
		r.mu.Unlock()
		if len(lat) == len(committed) {
			return lat, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d of %d requests never arrived", len(committed)-len(lat), len(committed))
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}
