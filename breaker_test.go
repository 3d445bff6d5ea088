package pgdispatch_test

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/claimer"
	"github.com/pgdispatch/pgdispatch/endpoints"
	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/executors/httpcallback"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/wait"
	"github.com/pgdispatch/pgdispatch/internal/testkit/workertest"
)

// receiver answers 503 while down, else 204, counts the requests of each
// job and all of them, and notes the jobs it answered 204, in order.
type receiver struct {
	*httptest.Server
	down      atomic.Bool
	total     atomic.Int64
	mu        sync.Mutex
	seen      map[int64]int
	delivered []int64
}

func newReceiver(t *testing.T, down bool) *receiver {
	rc := &receiver{seen: map[int64]int{}}
	rc.down.Store(down)
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, _ := strconv.ParseInt(r.Header.Get("Pgdispatch-Job-Id"), 10, 64)
		rc.total.Add(1)
		rc.mu.Lock()
		defer rc.mu.Unlock()
		rc.seen[id]++
		if rc.down.Load() {
			http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
			return
		}
		rc.delivered = append(rc.delivered, id)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *receiver) requests(id int64) int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.seen[id]
}

// outcomes is an Observer that notes each job's outcomes.
type outcomes struct {
	mu      sync.Mutex
	of      map[int64][]claimer.Outcome
	changed chan struct{}
}

func newOutcomes() *outcomes {
	return &outcomes{of: map[int64][]claimer.Outcome{}, changed: make(chan struct{})}
}

func (o *outcomes) JobStarted(*executors.Job) {}

func (o *outcomes) JobFinished(job *executors.Job, outcome claimer.Outcome, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.of[job.ID] = append(o.of[job.ID], outcome)
	close(o.changed)
	o.changed = make(chan struct{})
}

// snoozed is how many of ids were snoozed at least once, and a channel
// closed at the next outcome.
func (o *outcomes) snoozed(ids []int64) (int, <-chan struct{}) {
	o.mu.Lock()
	defer o.mu.Unlock()
	n := 0
	for _, id := range ids {
		for _, out := range o.of[id] {
			if out == claimer.OutcomeSnoozed {
				n++
				break
			}
		}
	}
	return n, o.changed
}

// breakerWorker runs a worker whose http_callback executor keeps the
// circuits with a breaker of its own, as every worker process does. Each
// of tune, a func(*endpoints.Config) or a func(*pgdispatch.Config),
// changes the breaker's settings or the worker's.
func breakerWorker(t *testing.T, schema, id string, obs claimer.Observer, coolDown time.Duration, tune ...any) (*endpoints.Breaker, func()) {
	t.Helper()
	pool := pgtest.Pool(t)
	bcfg := endpoints.Config{
		DB: pool, Schema: schema, Window: time.Hour, MinAttempts: 5, FailureRatio: 0.5, CoolDown: coolDown, MaxCoolDown: time.Hour,
		FlushInterval: 20 * time.Millisecond, RefreshInterval: time.Hour, // the notifications alone tell the changes
		Logger: zaptest.NewLogger(t).Named(id),
	}
	for _, f := range tune {
		if f, ok := f.(func(*endpoints.Config)); ok {
			f(&bcfg)
		}
	}
	br, err := endpoints.New(bcfg)
	require.NoError(t, err)
	exec, err := httpcallback.New(httpcallback.Config{AllowNetworks: []string{httpcallback.NetworksLoopback}, Breaker: br})
	require.NoError(t, err)
	registry := executors.NewRegistry()
	registry.Register(httpcallback.Kind, exec)
	cfg := pgdispatch.Config{
		Pool: pool, Schema: schema, WorkerID: id, Registry: registry, Endpoints: br, Observer: obs,
		Logger: zaptest.NewLogger(t).Named(id),
	}
	cfg.Concurrency = 4
	cfg.PollInterval = time.Hour
	cfg.JobTimeout = 10 * time.Second
	cfg.RetryBackoff = func(int) time.Duration { return 50 * time.Millisecond }
	for _, f := range tune {
		if f, ok := f.(func(*pgdispatch.Config)); ok {
			f(&cfg)
		}
	}
	_, stop := workertest.Run(context.Background(), t, cfg)
	return br, stop
}

func enqueueTo(t *testing.T, schema, url string, n int) []int64 {
	t.Helper()
	ids := make([]int64, n)
	for i := range ids {
		ids[i] = workertest.Enqueue(t, schema, httpcallback.Kind, map[string]any{"url": url + "/hook?token=s3cret", "data": i}, 50)
	}
	return ids
}

func waitState(t *testing.T, br *endpoints.Breaker, endpoint, state, who string) {
	t.Helper()
	wait.On(t, time.Minute, fmt.Sprintf("%s to see %s %s", who, endpoint, state), func() (bool, <-chan struct{}) {
		changed := br.Changed()
		return br.State(endpoint) == state, changed
	})
}

func endpointOf(t *testing.T, rawURL string) string {
	t.Helper()
	u, err := httpcallback.PayloadURL([]byte(`{"url":"` + rawURL + `"}`))
	require.NoError(t, err)
	return endpoints.Of(u)
}

// An endpoint that answers 503 opens once its failures pass the threshold,
// and both workers see it open. Its later jobs wait, pending, their
// attempts given back, while another endpoint's jobs are delivered. After
// the cool-down one probe goes; it fails and the endpoint opens again
// for twice as long; once the receiver is healthy the next probe closes
// it and the backlog is delivered, no job dead, each job's attempts
// exactly its requests.
func TestBreakerOpensAndHeals(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	table := pgx.Identifier{schema, "endpoints"}.Sanitize()
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	failing, healthy := newReceiver(t, true), newReceiver(t, false)
	obs := newOutcomes()
	a, _ := breakerWorker(t, schema, "breaker-a", obs, time.Second)
	b, _ := breakerWorker(t, schema, "breaker-b", obs, time.Second)
	ep := endpointOf(t, failing.URL)

	first := enqueueTo(t, schema, failing.URL, 5)
	waitState(t, a, ep, "open", "worker a")
	waitState(t, b, ep, "open", "worker b")
	var reason string
	require.NoError(t, pgtest.Pool(t).QueryRow(context.Background(), "SELECT reason FROM "+table+" WHERE endpoint = $1", ep).Scan(&reason))
	require.Contains(t, reason, "HTTP 503")
	require.NotContains(t, reason, "s3cret")

	later := enqueueTo(t, schema, failing.URL, 10)
	others := enqueueTo(t, schema, healthy.URL, 10)
	pgtest.WaitSQL(t, time.Minute, "the other endpoint's jobs done",
		"SELECT count(*) = $2 FROM "+jobs+" WHERE id = ANY($1) AND status = 'done'", others, len(others))
	wait.On(t, time.Minute, "the later jobs to wait", func() (bool, <-chan struct{}) {
		n, changed := obs.snoozed(later)
		return n >= len(later)-2, changed // the probes of the two rounds may be later jobs
	})

	// A probe went and failed: the cool-down doubled.
	pgtest.WaitSQL(t, time.Minute, "a failed probe",
		"SELECT state = 'open' AND cool_down = interval '2 seconds' FROM "+table+" WHERE endpoint = $1", ep)
	failing.down.Store(false)

	all := append(append(append([]int64{}, first...), later...), others...)
	pgtest.WaitSQL(t, time.Minute, "every job done",
		"SELECT count(*) = $2 FROM "+jobs+" WHERE id = ANY($1) AND status = 'done'", all, len(all))
	waitState(t, a, ep, "closed", "worker a")
	waitState(t, b, ep, "closed", "worker b")
	// The outage is two events, opened and closed, by the breaker: the
	// failed probe between them is none.
	rows, _ := pgtest.Pool(t).Query(context.Background(), "SELECT event || ' by ' || actor FROM "+
		pgx.Identifier{schema, "endpoint_events"}.Sanitize()+" WHERE endpoint = $1 ORDER BY id", ep)
	events, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"opened by breaker", "closed by breaker"}, events)

	rows, _ = pgtest.Pool(t).Query(context.Background(), "SELECT id, attempts FROM "+jobs+" WHERE id = ANY($1)", all)
	attempts, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct {
		ID       int64
		Attempts int
	}])
	require.NoError(t, err)
	for _, j := range attempts {
		rc := failing
		if j.ID >= others[0] {
			rc = healthy
		}
		require.Equal(t, rc.requests(j.ID), j.Attempts, "job %d: its attempts are its requests", j.ID)
	}
}

// The state is in the table: a worker started after the one that saw the
// endpoint open knows it open before it claims, and its jobs wait without
// a request or an attempt.
func TestBreakerStateSurvivesRestart(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	failing := newReceiver(t, true)
	obs := newOutcomes()
	a, stop := breakerWorker(t, schema, "before", obs, time.Hour)
	ep := endpointOf(t, failing.URL)
	enqueueTo(t, schema, failing.URL, 5)
	waitState(t, a, ep, "open", "the first worker")
	stop()

	b, _ := breakerWorker(t, schema, "after", obs, time.Hour)
	waitState(t, b, ep, "open", "the worker started after")
	ids := enqueueTo(t, schema, failing.URL, 3)
	pgtest.WaitSQL(t, time.Minute, "the new jobs to wait, pending, for the cool-down",
		"SELECT count(*) = $2 FROM "+jobs+" WHERE id = ANY($1) AND status = 'pending' AND attempts = 0 "+
			"AND run_at > now() + interval '30 minutes'", ids, len(ids))
	n, _ := obs.snoozed(ids)
	require.Equal(t, len(ids), n)
	for _, id := range ids {
		require.Zero(t, failing.requests(id), "job %d sent while its endpoint is open", id)
	}
}

// The jobs an open endpoint holds are due at one instant, the end of its
// cool-down, whenever each was held, so that once it heals they go in
// their order (priority, then id), as they would have gone.
func TestBreakerHeldJobsKeepTheirOrder(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	table := pgx.Identifier{schema, "endpoints"}.Sanitize()
	failing := newReceiver(t, true)
	obs := newOutcomes()
	a, _ := breakerWorker(t, schema, "order", obs, 5*time.Second, func(c *pgdispatch.Config) { c.Concurrency = 1 })
	ep := endpointOf(t, failing.URL)
	first := enqueueTo(t, schema, failing.URL, 5)
	waitState(t, a, ep, "open", "the worker")
	held := enqueueTo(t, schema, failing.URL, 20)
	all := append(append([]int64{}, first...), held...)
	wait.On(t, time.Minute, "every job held", func() (bool, <-chan struct{}) {
		n, changed := obs.snoozed(all)
		return n == len(all), changed
	})
	// The outcomes are written after the observer hears of them.
	pgtest.WaitSQL(t, time.Minute, "every job pending while the endpoint is open",
		"SELECT count(*) = $2 FROM "+jobs+" WHERE id = ANY($1) AND status = 'pending'", all, len(all))
	var runAts int
	var sameAsOpenUntil bool
	require.NoError(t, pgtest.Pool(t).QueryRow(context.Background(), "SELECT count(DISTINCT j.run_at), "+
		"bool_and(j.run_at = e.open_until) FROM "+jobs+" j, "+table+" e WHERE j.id = ANY($1) AND e.endpoint = $2", all, ep).Scan(&runAts, &sameAsOpenUntil))
	require.Equal(t, 1, runAts, "the held jobs are due at one instant")
	require.True(t, sameAsOpenUntil, "the end of the endpoint's cool-down")

	failing.down.Store(false)
	pgtest.WaitSQL(t, time.Minute, "every job done",
		"SELECT count(*) = $2 FROM "+jobs+" WHERE id = ANY($1) AND status = 'done'", all, len(all))
	failing.mu.Lock()
	defer failing.mu.Unlock()
	require.Equal(t, all, failing.delivered, "one job at a time, in their order")
}

// Three workers share one endpoint's circuit: once it opens, the receiver
// sees no request but the probes, one per cool-down in all, and after every
// worker is stopped and others started, the endpoint is still open and
// they hold its jobs back too.
func TestBreakerSharedByThreeWorkersAndKeptAcrossRestarts(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	table := pgx.Identifier{schema, "endpoints"}.Sanitize()
	const coolDown = time.Second
	failing := newReceiver(t, true)
	ep := endpointOf(t, failing.URL)
	obs := newOutcomes()
	// start runs three workers, and waits until each knows the endpoint
	// is not closed.
	start := func(generation string, enqueue func()) (stop func()) {
		var stops []func()
		var brs []*endpoints.Breaker
		for i := range 3 {
			br, stop := breakerWorker(t, schema, fmt.Sprintf("%s-%d", generation, i+1), obs, coolDown)
			brs, stops = append(brs, br), append(stops, stop)
		}
		enqueue()
		for i, br := range brs {
			wait.On(t, time.Minute, fmt.Sprintf("%s worker %d to know the endpoint not closed", generation, i+1), func() (bool, <-chan struct{}) {
				changed := br.Changed()
				return br.State(ep) != "closed", changed
			})
		}
		return func() {
			for _, stop := range stops {
				stop()
			}
		}
	}
	// probes is how many probes went: each that failed doubled the
	// cool-down, and one may have been cut short by a stop.
	probes := func() int64 {
		var (
			secs  float64
			state string
		)
		require.NoError(t, pgtest.Pool(t).QueryRow(context.Background(),
			"SELECT extract(epoch FROM cool_down), state FROM "+table+" WHERE endpoint = $1", ep).Scan(&secs, &state))
		require.NotEqual(t, "closed", state)
		n := int64(math.Round(math.Log2(secs / coolDown.Seconds())))
		if state == "half_open" {
			n++
		}
		return n
	}
	held := func(what string, ids []int64) {
		wait.On(t, time.Minute, what, func() (bool, <-chan struct{}) {
			n, changed := obs.snoozed(ids)
			return n == len(ids), changed
		})
	}

	var first []int64
	stop := start("first", func() { first = enqueueTo(t, schema, failing.URL, 5) })
	before := failing.total.Load()
	more := enqueueTo(t, schema, failing.URL, 10)
	held("the jobs held", append(append([]int64{}, first...), more...))
	pgtest.WaitSQL(t, time.Minute, "a probe failed", "SELECT cool_down >= interval '2 seconds' FROM "+table+" WHERE endpoint = $1", ep)
	stop()
	failed := probes()
	require.LessOrEqual(t, failing.total.Load()-before, failed, "while the endpoint was open, only its probes went, one per cool-down")

	before = failing.total.Load()
	stop = start("second", func() {})
	after := enqueueTo(t, schema, failing.URL, 6)
	held("the jobs enqueued after the restart held", after)
	stop()
	require.LessOrEqual(t, failing.total.Load()-before, probes()-failed, "after the restart, only probes went")
	var pending int
	all := append(append(append([]int64{}, first...), more...), after...)
	require.NoError(t, pgtest.Pool(t).QueryRow(context.Background(), "SELECT count(*) FROM "+jobs+" WHERE id = ANY($1) AND status = 'pending'",
		all).Scan(&pending))
	require.Equal(t, len(all), pending, "no job is dead or done: the receiver is down")
}
