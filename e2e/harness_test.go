package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// scenario is one run: a schema of its own, worker processes on it, and the
// test's connections, named e2e-* so that faults aimed at pgdispatch spare
// them.
type scenario struct {
	t      *testing.T
	name   string
	schema string
	url    string // the cluster's URL, for the workers
	pool   *pgxpool.Pool
	env    map[string]string // the workers' settings
	// serverLogs are the servers' log files, which grepLogs reads.
	serverLogs []string
	// claimsMayBeLost says that the faults can lose a committed claim: the
	// claim commits without waiting for its WAL to be flushed or sent to a
	// standby, so a crash can take it, and its job then runs again under the
	// same attempt number. verify counts those runs as duplicates instead of
	// failing on a delivery that no attempt recorded.
	claimsMayBeLost bool

	mu      sync.Mutex
	workers []*worker
	faults  []time.Time // when each fault ended
}

// newScenario migrates a schema with the binary's own migrate command and
// sets the workers' defaults: quick leases, sweeps and retries, and the
// fallback tick an hour away, so that it cannot hide a lost wake-up.
func newScenario(t *testing.T, name string, env map[string]string) *scenario {
	t.Helper()
	return newScenarioOn(t, name, cluster.URL(), []string{cluster.LogPath()}, env)
}

// newScenarioOn is newScenario on servers other than the suite's cluster:
// url is where the workers and the test connect, serverLogs the servers'
// log files.
func newScenarioOn(t *testing.T, name, url string, serverLogs []string, env map[string]string) *scenario {
	t.Helper()
	s := &scenario{
		t: t, name: name, schema: "e2e_" + name, url: url, serverLogs: serverLogs,
		env: map[string]string{
			"CONCURRENCY":      "8",
			"LEASE":            "2s",
			"SWEEP_INTERVAL":   "500ms",
			"POLL_INTERVAL":    "1h",
			"RETRY_BACKOFF":    "100ms",
			"MAX_ATTEMPTS":     "25",
			"JOB_TIMEOUT":      "5s",
			"SHUTDOWN_TIMEOUT": "5s",
			"LOG_LEVEL":        "info",
			"LOG_FORMAT":       "json",
			// The receivers are httptest servers on this machine.
			"HTTP_ALLOW_NETWORKS": "loopback",
		},
	}
	maps.Copy(s.env, env)
	s.env["DATABASE_URL"] = s.url
	s.env["DB_SCHEMA"] = s.schema

	cfg, err := pgxpool.ParseConfig(s.url)
	require.NoError(t, err)
	cfg.ConnConfig.RuntimeParams["application_name"] = "e2e-test"
	cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	s.pool, err = pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = s.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+s.ident()+" CASCADE")
	require.NoError(t, err)
	out, err := s.command(ctx, "migrate").CombinedOutput()
	require.NoError(t, err, "pgdispatch migrate: %s", out)

	t.Cleanup(func() {
		s.stopAll()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = s.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+s.ident()+" CASCADE")
		s.pool.Close()
	})
	return s
}

func (s *scenario) ident() string { return pgx.Identifier{s.schema}.Sanitize() }

func (s *scenario) jobs() string { return pgx.Identifier{s.schema, "jobs"}.Sanitize() }

// command runs the binary with the scenario's settings and nothing else
// from the test's environment but PATH and HOME.
func (s *scenario) command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, binary, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME")}
	for k, v := range s.env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Dir = s.t.TempDir() // no .env file
	return cmd
}

// fault runs f, the fault, and records when it ended: work should resume
// from then on.
func (s *scenario) fault(f func()) {
	f()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults = append(s.faults, time.Now())
}

// worker is one pgdispatch run process.
type worker struct {
	id   string
	cmd  *exec.Cmd
	log  *syncBuffer
	done chan struct{} // closed when the process has exited
	err  error         // its exit, once done is closed
	// aside: it serves queues of its own, not the scenario's, and
	// checkServing leaves it out.
	aside bool
}

// startWorker starts `pgdispatch run` as id, with env (KEY=value) over the
// scenario's settings.
func (s *scenario) startWorker(id string, env ...string) *worker {
	s.t.Helper()
	cmd := s.command(context.Background(), "run")
	cmd.Env = append(cmd.Env, "WORKER_ID="+id)
	cmd.Env = append(cmd.Env, env...) // the last value of a key wins
	w := &worker{id: id, cmd: cmd, log: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = w.log, w.log
	require.NoError(s.t, cmd.Start())
	go func() { w.err = cmd.Wait(); close(w.done) }()
	s.mu.Lock()
	s.workers = append(s.workers, w)
	s.mu.Unlock()
	return w
}

// startWorkers starts n workers named <scenario>-1 ... and waits until each
// has connected its listener.
func (s *scenario) startWorkers(n int) []*worker {
	s.t.Helper()
	ws := make([]*worker, n)
	for i := range ws {
		ws[i] = s.startWorker(fmt.Sprintf("%s-%d", s.name, i+1))
	}
	for _, w := range ws {
		s.waitListening(w)
	}
	return ws
}

// waitListening waits for the worker's log line that says its listener is
// connected, so that what the test does next is seen by a listening worker.
func (s *scenario) waitListening(w *worker) {
	s.t.Helper()
	require.Eventually(s.t, func() bool {
		select {
		case <-w.done:
			s.t.Fatalf("worker %s exited at start: %v\n%s", w.id, w.err, w.log.tail(4000))
		default:
		}
		return strings.Contains(w.log.String(), `"listening"`)
	}, 30*time.Second, 10*time.Millisecond, "worker %s never said its listener was connected:\n%s", w.id, w.log.tail(4000))
}

// kill9 kills the process at once, as a node failure would.
func (w *worker) kill9() {
	_ = w.cmd.Process.Signal(syscall.SIGKILL)
	<-w.done
}

// stuckGoroutines ends the process with SIGQUIT, on which the Go runtime
// prints every goroutine's stack, and returns the stacks of those that were
// running (a loop that spins) or had been blocked a minute or more (what a
// hang waits on).
func (w *worker) stuckGoroutines() string {
	before := len(w.log.String())
	_ = w.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-w.done:
	case <-time.After(10 * time.Second):
		return ""
	}
	var b strings.Builder
	for _, g := range strings.Split(w.log.String()[before:], "\n\n") {
		if head, _, _ := strings.Cut(g, "\n"); strings.HasPrefix(head, "goroutine ") && stuck(head) {
			b.WriteString(g + "\n\n")
		}
	}
	return b.String()
}

// stuck reports whether a goroutine's header ("goroutine 7 [select, 2
// minutes]:") says it was running or blocked a minute or more.
func stuck(head string) bool {
	return strings.Contains(head, "[running") || strings.Contains(head, "[runnable") || strings.Contains(head, " minutes]")
}

func (w *worker) alive() bool {
	select {
	case <-w.done:
		return false
	default:
		return true
	}
}

// stopAll stops every live worker with SIGTERM and waits for it.
func (s *scenario) stopAll() {
	s.mu.Lock()
	ws := slices.Clone(s.workers)
	s.mu.Unlock()
	for _, w := range ws {
		if w.alive() {
			_ = w.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	for _, w := range ws {
		select {
		case <-w.done:
		case <-time.After(30 * time.Second):
			_ = w.cmd.Process.Kill()
			<-w.done
			s.t.Errorf("worker %s did not stop within 30s of SIGTERM", w.id)
		}
	}
}

// live is the workers still running.
func (s *scenario) live() []*worker {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*worker
	for _, w := range s.workers {
		if w.alive() {
			out = append(out, w)
		}
	}
	return out
}

// logs is every worker's output so far, each under its id.
func (s *scenario) logs() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	for _, w := range s.workers {
		fmt.Fprintf(&b, "=== worker %s (alive %v)\n%s\n", w.id, w.alive(), w.log.String())
	}
	return b.String()
}

// dumpLogsOnFailure prints the tail of every worker's log if the test fails.
func (s *scenario) dumpLogsOnFailure() {
	s.t.Cleanup(func() {
		if s.t.Failed() {
			s.mu.Lock()
			defer s.mu.Unlock()
			for _, w := range s.workers {
				alive := w.alive()
				s.t.Logf("=== worker %s (alive %v, exit %v)\n%s", w.id, alive, w.err, w.log.tail(6000))
				if alive {
					if stuck := w.stuckGoroutines(); stuck != "" {
						s.t.Logf("=== worker %s: goroutines running, or blocked a minute or more\n%s", w.id, stuck)
					}
				}
			}
		}
	})
}

// syncBuffer is a bytes.Buffer safe for a process's writes and the test's reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func (b *syncBuffer) tail(n int) string {
	s := b.String()
	if len(s) > n {
		s = "..." + s[len(s)-n:]
	}
	return s
}

// producer inserts one job per transaction with plain SQL from a
// connection of its own, each under a key of its own that is also the
// job's dedup_key, so that a retry after an insert whose commit went
// unanswered cannot add a second job.
type producer struct {
	mu   sync.Mutex
	keys []string // committed
	done chan struct{}
	err  error
}

// produce inserts jobs every interval until ctx ends; flowKey, if not nil,
// gives the i-th job its flow key; payload builds each job from its key and
// its flow key ("" for none). A failed insert is retried until it commits.
func (s *scenario) produce(ctx context.Context, prefix string, interval time.Duration, kind string, flowKey func(i int) string, payload func(key, flowKey string) any) *producer {
	p := &producer{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.err = s.produceLoop(ctx, p, prefix, interval, kind, flowKey, payload)
	}()
	return p
}

func (s *scenario) produceLoop(ctx context.Context, p *producer, prefix string, interval time.Duration, kind string, flowKey func(int) string, payload func(string, string) any) error {
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			_ = conn.Close(context.Background())
		}
	}()
	tick := time.NewTicker(interval)
	defer tick.Stop()
	insert := "INSERT INTO " + s.jobs() + " (kind, payload, dedup_key, flow_key) VALUES ($1, $2, $3, $4) ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING"
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		key := fmt.Sprintf("%s-%d", prefix, i)
		var (
			fk   string  // "": none
			flow *string // the column: NULL for none
		)
		if flowKey != nil {
			fk = flowKey(i)
			flow = &fk
		}
		raw, err := json.Marshal(payload(key, fk))
		if err != nil {
			return err
		}
		// Once begun, a key is retried until it commits, even past ctx.
		deadline := time.Now().Add(60 * time.Second)
		for {
			if conn == nil || conn.IsClosed() {
				conn, err = s.connect()
			}
			if err == nil {
				callCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err = conn.Exec(callCtx, insert, kind, raw, key, flow)
				cancel()
			}
			if err == nil {
				break
			}
			if conn != nil {
				_ = conn.Close(context.Background())
				conn = nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("producer: %s did not commit within 60s: %w", key, err)
			}
			select {
			case <-time.After(50 * time.Millisecond):
			case <-ctx.Done():
			}
		}
		p.mu.Lock()
		p.keys = append(p.keys, key)
		p.mu.Unlock()
	}
}

// connect opens a connection of the test's own.
func (s *scenario) connect() (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(s.url)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["application_name"] = "e2e-producer"
	cfg.ConnectTimeout = 3 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return pgx.ConnectConfig(ctx, cfg)
}

// wait stops waiting for the producer and returns its committed keys.
func (p *producer) wait(t *testing.T) []string {
	t.Helper()
	<-p.done
	require.NoError(t, p.err)
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.keys)
}

// receiver is an HTTP server that records each job it acknowledged, by the
// key in the body's "k", and can be told to fail or hang.
type receiver struct {
	srv *httptest.Server

	mode atomic.Int32 // recvOK, recvFail or recvHang

	mu       sync.Mutex
	got      map[string]int // key -> 2xx answers
	times    []time.Time    // each 2xx answer
	inflight int            // requests being answered now
	hung     int            // requests that hung until the client gave up
	flaky    int            // requests to /flaky

	// By flow key (the body's "f"), the /hook requests being answered now,
	// and the most there were at once.
	flowInflight, flowMost map[string]int

	barrier struct {
		arrived int
		want    int
		reached chan struct{}
	}

	// The hostile endpoints: how long each trickle went on before the
	// client hung up, and another host, which a redirect points at.
	trickles []time.Duration
	away     *httptest.Server
	stolen   atomic.Int64 // requests that reached away
}

const (
	recvOK int32 = iota
	recvFail
	recvHang
)

func newReceiver(t *testing.T) *receiver {
	r := &receiver{got: map[string]int{}, flowInflight: map[string]int{}, flowMost: map[string]int{}}
	r.barrier.reached = make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("POST /hook", r.hook)
	mux.HandleFunc("POST /barrier", r.barrierHook)
	mux.HandleFunc("POST /flaky", r.flakyHook)
	mux.HandleFunc("/trickle", r.trickle)
	mux.HandleFunc("/huge-headers", hugeHeaders)
	mux.HandleFunc("/redirect-away", r.redirectAway)
	mux.HandleFunc("/ansi", ansi)
	r.srv = httptest.NewServer(mux)
	t.Cleanup(r.srv.Close)
	r.away = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		r.stolen.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(r.away.Close)
	return r
}

func (r *receiver) url(path string) string { return r.srv.URL + path }

// readKey reads the body's key, "k", and its flow key, "f" ("" for none).
func readKey(req *http.Request) (key, flow string, err error) {
	var body struct {
		K string `json:"k"`
		F string `json:"f"`
	}
	raw, err := io.ReadAll(req.Body)
	if err != nil {
		return "", "", err
	}
	if err := json.Unmarshal(raw, &body); err != nil {
		return "", "", err
	}
	return body.K, body.F, nil
}

func (r *receiver) hook(w http.ResponseWriter, req *http.Request) {
	key, flow, err := readKey(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	r.inflight++
	if flow != "" {
		r.flowInflight[flow]++
		r.flowMost[flow] = max(r.flowMost[flow], r.flowInflight[flow])
	}
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.inflight--
		if flow != "" {
			r.flowInflight[flow]--
		}
		r.mu.Unlock()
	}()
	switch r.mode.Load() {
	case recvFail:
		http.Error(w, "receiver failing on purpose", http.StatusInternalServerError)
		return
	case recvHang:
		<-req.Context().Done() // until the worker's job timeout gives up
		r.mu.Lock()
		r.hung++
		r.mu.Unlock()
		return
	}
	// ?delay= makes the receiver slow, so that workers hold jobs in flight
	// when a fault strikes.
	if d, err := time.ParseDuration(req.URL.Query().Get("delay")); err == nil {
		select {
		case <-time.After(d):
		case <-req.Context().Done():
			return
		}
	}
	r.mu.Lock()
	r.got[key]++
	r.times = append(r.times, time.Now())
	r.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// flakyHook fails every third request.
func (r *receiver) flakyHook(w http.ResponseWriter, _ *http.Request) {
	r.mu.Lock()
	r.flaky++
	n := r.flaky
	r.mu.Unlock()
	if n%3 == 0 {
		http.Error(w, "flaky on purpose", http.StatusBadGateway)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (r *receiver) flakyCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.flaky
}

// trickle answers 500 (or ?status=200) and "first bytes" at once, then one
// byte every 50 ms for as long as the client reads, or 30 s at most: a
// worker that reads on fails the test's bound, not its cleanup, which waits
// for the receiver's connections before it stops the workers.
func (r *receiver) trickle(w http.ResponseWriter, req *http.Request) {
	start := time.Now()
	defer func() {
		r.mu.Lock()
		r.trickles = append(r.trickles, time.Since(start))
		r.mu.Unlock()
	}()
	_, _ = io.Copy(io.Discard, req.Body)
	status := http.StatusInternalServerError
	if req.URL.Query().Get("status") == "200" {
		status = http.StatusOK
	}
	w.WriteHeader(status)
	rc := http.NewResponseController(w)
	if _, err := io.WriteString(w, "first bytes"); err != nil || rc.Flush() != nil {
		return
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	end := time.NewTimer(30 * time.Second)
	defer end.Stop()
	for {
		select {
		case <-req.Context().Done():
			return
		case <-end.C:
			return
		case <-tick.C:
			if _, err := io.WriteString(w, "."); err != nil || rc.Flush() != nil {
				return
			}
		}
	}
}

// trickleTimes is how long each trickle lasted.
func (r *receiver) trickleTimes() []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.trickles)
}

// hugeHeaders answers 200 with 32 headers of 256 KiB each, 8 MiB in all.
func hugeHeaders(w http.ResponseWriter, req *http.Request) {
	_, _ = io.Copy(io.Discard, req.Body)
	big := strings.Repeat("b", 256<<10)
	for i := range 32 {
		w.Header().Set(fmt.Sprintf("X-Big-%d", i), big)
	}
	w.WriteHeader(http.StatusOK)
}

// redirectAway answers 307 to another host, the receiver's away server.
func (r *receiver) redirectAway(w http.ResponseWriter, req *http.Request) {
	_, _ = io.Copy(io.Discard, req.Body)
	http.Redirect(w, req, r.away.URL+"/stolen", http.StatusTemporaryRedirect)
}

// ansi answers 500 with a body of terminal escapes: a window title, a
// clear screen, red text and a CR LF.
func ansi(w http.ResponseWriter, req *http.Request) {
	_, _ = io.Copy(io.Discard, req.Body)
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(http.StatusInternalServerError)
	_, _ = io.WriteString(w, ansiBody)
}

const ansiBody = "\x1b]0;owned\x07\x1b[2J\x1b[31mboom\r\n"

// expectBarrier arms the barrier: its requests are answered 200 only once n
// are in flight together, which needs every slot of every worker.
func (r *receiver) expectBarrier(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.barrier.arrived, r.barrier.want = 0, n
	r.barrier.reached = make(chan struct{})
}

func (r *receiver) barrierHook(w http.ResponseWriter, req *http.Request) {
	key, _, err := readKey(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	r.barrier.arrived++
	reached := r.barrier.reached
	if r.barrier.arrived == r.barrier.want {
		close(reached)
	}
	r.mu.Unlock()
	select {
	case <-reached:
		r.mu.Lock()
		r.got[key]++
		r.mu.Unlock()
		w.WriteHeader(http.StatusOK)
	case <-time.After(10 * time.Second):
		http.Error(w, "barrier: not every slot came", http.StatusServiceUnavailable)
	case <-req.Context().Done():
	}
}

// flowMostInflight is, by flow key, the most /hook requests that were
// being answered at once.
func (r *receiver) flowMostInflight() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.flowMost)
}

func (r *receiver) deliveries() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.got)
}

func (r *receiver) deliveryTimes() []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.times)
}

// drain waits until no job of the scenario is pending and due, or running.
func (s *scenario) drain(timeout time.Duration) {
	s.t.Helper()
	ok := assert.Eventually(s.t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var left int
		err := s.pool.QueryRow(ctx, "SELECT count(*) FROM "+s.jobs()+
			" WHERE (status = 'pending' AND run_at < now() + interval '1 hour') OR status = 'running'").Scan(&left)
		return err == nil && left == 0
	}, timeout, 20*time.Millisecond)
	if !ok {
		s.t.Fatalf("jobs still pending or running after %s:\n%s", timeout, s.statusTable())
	}
}

// statusTable is the jobs' count by status, for failure messages.
func (s *scenario) statusTable() string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rows, err := s.pool.Query(ctx, "SELECT status, count(*), max(attempts), max(last_error) FROM "+s.jobs()+" GROUP BY 1 ORDER BY 1")
	if err != nil {
		return err.Error()
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var (
			status  string
			n, att  int64
			lastErr *string
		)
		if rows.Scan(&status, &n, &att, &lastErr) == nil {
			fmt.Fprintf(&b, "  %s: %d (max attempts %d, a last_error: %v)\n", status, n, att, deref(lastErr))
		}
	}
	return b.String()
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

// jobRow is a job's final state, by key.
type jobRow struct {
	id       int64
	status   string
	attempts int
	lastErr  *string
}

func (s *scenario) rowsByKey() map[string]jobRow {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := s.pool.Query(ctx, "SELECT dedup_key, id, status, attempts, last_error FROM "+s.jobs()+" WHERE dedup_key IS NOT NULL")
	require.NoError(s.t, err)
	out := map[string]jobRow{}
	for rows.Next() {
		var (
			key string
			r   jobRow
		)
		require.NoError(s.t, rows.Scan(&key, &r.id, &r.status, &r.attempts, &r.lastErr))
		out[key] = r
	}
	require.NoError(s.t, rows.Err())
	return out
}

// summary is what a scenario reports.
type summary struct {
	jobs, delivered, duplicates, lost int
	maxResume                         time.Duration
	faults                            int
	// sameAttempt is the jobs delivered more often than their attempts
	// say, after a lost claim (claimsMayBeLost).
	sameAttempt int
}

// verify checks deliveries against committed keys in both directions, and
// that every job is done with at least as many attempts as deliveries.
// dupBound is the most duplicates the faults can explain.
func (s *scenario) verify(keys []string, got map[string]int, times []time.Time, dupBound int) summary {
	s.t.Helper()
	rows := s.rowsByKey()
	sum := summary{jobs: len(keys)}
	var lost, notDone []string
	for _, k := range keys {
		n := got[k]
		if n == 0 {
			lost = append(lost, k)
		} else {
			sum.delivered++
			sum.duplicates += n - 1
		}
		r, ok := rows[k]
		switch {
		case !ok:
			notDone = append(notDone, k+": no row")
		case r.status != "done":
			notDone = append(notDone, fmt.Sprintf("%s: %s after %d attempts (%s)", k, r.status, r.attempts, deref(r.lastErr)))
		case n > r.attempts && s.claimsMayBeLost:
			sum.sameAttempt++
		case n > r.attempts:
			s.t.Errorf("%s was delivered %d times in %d attempts: an attempt was not recorded", k, n, r.attempts)
		}
	}
	committed := map[string]bool{}
	for _, k := range keys {
		committed[k] = true
	}
	for k := range got {
		if !committed[k] && strings.HasPrefix(k, s.name) {
			s.t.Errorf("%s was delivered but its insert was never seen to commit", k)
		}
	}
	sum.lost = len(lost)
	s.mu.Lock()
	sum.faults = len(s.faults)
	sum.maxResume = maxResume(s.faults, times)
	s.mu.Unlock()
	s.t.Logf("summary %s: jobs=%d delivered=%d duplicates=%d lost=%d faults=%d max_resume=%s",
		s.name, sum.jobs, sum.delivered, sum.duplicates, sum.lost, sum.faults, sum.maxResume.Round(time.Millisecond))
	require.Empty(s.t, lost, "committed jobs never delivered")
	require.Empty(s.t, notDone, "jobs not done")
	require.LessOrEqual(s.t, sum.duplicates, dupBound, "more duplicates than jobs in flight at the faults")
	require.Positive(s.t, sum.jobs)
	return sum
}

// maxResume is, over the faults, the longest time from a fault's end to
// the first delivery after it.
func maxResume(faults, times []time.Time) time.Duration {
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	var worst time.Duration
	for _, f := range faults {
		i, _ := slices.BinarySearchFunc(times, f, func(a, b time.Time) int { return a.Compare(b) })
		if i < len(times) {
			worst = max(worst, times[i].Sub(f))
		}
	}
	return worst
}

// checkServing proves that every live worker still serves with every slot:
// it inserts one job per slot of every live worker, in one transaction, to
// the barrier, which answers only once all of them are in flight together.
// A stuck slot, or a worker that no longer claims, leaves the barrier short
// and its jobs retrying, which this reports.
func (s *scenario) checkServing(r *receiver, slotsPerWorker int) {
	s.t.Helper()
	live := slices.DeleteFunc(s.live(), func(w *worker) bool { return w.aside })
	require.NotEmpty(s.t, live, "no worker is running")
	n := len(live) * slotsPerWorker
	r.expectBarrier(n)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := s.pool.Exec(ctx, "INSERT INTO "+s.jobs()+" (kind, payload, dedup_key) "+
		"SELECT 'http_callback', jsonb_build_object('url', $1::text, 'data', jsonb_build_object('k', 'barrier-' || i), 'timeout', '30s'), 'barrier-' || i "+
		"FROM generate_series(1, $2::int) i", r.url("/barrier"), n)
	require.NoError(s.t, err)
	s.drain(60 * time.Second)
	var retried int
	require.NoError(s.t, s.pool.QueryRow(ctx, "SELECT count(*) FROM "+s.jobs()+
		" WHERE dedup_key LIKE 'barrier-%' AND (status <> 'done' OR attempts <> 1)").Scan(&retried))
	require.Zero(s.t, retried, "%d of %d barrier jobs needed more than one attempt: not every slot of the %d live workers served at once", retried, n, len(live))
	for _, w := range live {
		require.True(s.t, w.alive(), "worker %s exited: %v", w.id, w.err)
	}
}

// grepLogs fails the test if any worker's log or the server's log holds a
// deadlock, a panic or a data race.
func (s *scenario) grepLogs() {
	s.t.Helper()
	logs := s.logs()
	for _, bad := range []string{"40P01", "deadlock detected", "panic:", "DATA RACE"} {
		require.NotContains(s.t, logs, bad, "a worker logged %q", bad)
	}
	for _, path := range s.serverLogs {
		server, err := os.ReadFile(path)
		require.NoError(s.t, err)
		if i := strings.Index(string(server), "deadlock detected"); i >= 0 {
			// The lines after it name the processes and their statements.
			s.t.Fatalf("the server logged a deadlock:\n%s", string(server)[max(0, i-200):min(len(server), i+3000)])
		}
	}
}
