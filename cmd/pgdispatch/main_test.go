package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/internal/testkit/amqptest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/exampledb"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/timing"
	"github.com/pgdispatch/pgdispatch/internal/testkit/wait"
	"github.com/pgdispatch/pgdispatch/migrations"
)

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "pgdispatch-bin-")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "pgdispatch")
	if out, err := exec.Command("go", "build", "-race", "-o", binary, ".").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build pgdispatch: %v\n%s", err, out)
		os.Exit(1)
	}
	pgtest.Main(cleanup{m, dir})
}

// cleanup removes the built binary after the tests (pgtest.Main exits).
type cleanup struct {
	m   *testing.M
	dir string
}

func (c cleanup) Run() int {
	defer func() { _ = os.RemoveAll(c.dir) }()
	return c.m.Run()
}

// proc is a pgdispatch subprocess.
type proc struct {
	cmd            *exec.Cmd
	stdout, stderr *syncBuffer
	done           chan struct{}
	err            error
}

// syncBuffer collects a process's output and tells waiters about each write.
type syncBuffer struct {
	mu      sync.Mutex
	b       bytes.Buffer
	written chan struct{} // closed and replaced on every write
}

func newSyncBuffer() *syncBuffer { return &syncBuffer{written: make(chan struct{})} }

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	close(s.written)
	s.written = make(chan struct{})
	return s.b.Write(p)
}

// waitFor waits until the output contains substr.
func (s *syncBuffer) waitFor(t *testing.T, substr string, timeout time.Duration) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		s.mu.Lock()
		found, written := strings.Contains(s.b.String(), substr), s.written
		s.mu.Unlock()
		if found {
			return
		}
		select {
		case <-written:
		case <-deadline:
			t.Fatalf("output did not show %q within %s:\n%s", substr, timeout, s.String())
		}
	}
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// env is the environment of a subprocess: this one's, less every pgdispatch
// setting, plus the test's.
func env(extra ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if isSetting(name) {
			continue
		}
		out = append(out, kv)
	}
	return append(out, extra...)
}

func isSetting(name string) bool {
	for _, g := range [][]setting{connSettings, workerSettings, executorSettings, serveSettings, atWorkerSettings} {
		for _, s := range g {
			if s.env == name {
				return true
			}
		}
	}
	return strings.HasPrefix(name, "DB_")
}

func start(t *testing.T, environ []string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(binary, args...), stdout: newSyncBuffer(), stderr: newSyncBuffer(), done: make(chan struct{})}
	p.cmd.Env = environ
	p.cmd.Dir = t.TempDir() // no stray .env
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	require.NoError(t, p.cmd.Start())
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("%s stderr:\n%s", args[0], p.stderr.String())
		}
	})
	return p
}

// wait waits for the process to exit and returns its exit code.
func (p *proc) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("process did not exit within %s; stderr:\n%s", timeout, p.stderr.String())
	}
	return p.cmd.ProcessState.ExitCode()
}

func dbEnv(schema string, extra ...string) []string {
	return env(append([]string{"DATABASE_URL=" + pgtest.URL(), "DB_SCHEMA=" + schema, "LOG_FORMAT=console", "LOG_LEVEL=debug"}, extra...)...)
}

func insert(t *testing.T, schema, sql string) int64 {
	t.Helper()
	var id int64
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx,
		strings.ReplaceAll(sql, "{jobs}", pgx.Identifier{schema, "jobs"}.Sanitize())).Scan(&id))
	return id
}

// Acceptance 9: three processes migrating at once all succeed.
func TestMigrateFromThreeProcesses(t *testing.T) {
	t.Parallel()
	schema := pgtest.EmptySchemaName(t)
	var procs []*proc
	for range 3 {
		procs = append(procs, start(t, dbEnv(schema), "migrate"))
	}
	for _, p := range procs {
		require.Equal(t, 0, p.wait(t, time.Minute), p.stderr.String())
		require.Contains(t, p.stdout.String(), fmt.Sprintf("is at version %d", migrations.Latest()))
	}
	v, err := migrations.Check(context.Background(), pgtest.Pool(t), schema)
	require.NoError(t, err)
	require.Equal(t, migrations.Latest(), v)
}

// Acceptance 9: run against a database without the schema exits non-zero
// with one clear line.
func TestRunWithoutSchema(t *testing.T) {
	t.Parallel()
	schema := pgtest.EmptySchemaName(t)
	p := start(t, dbEnv(schema), "run")
	require.Equal(t, 1, p.wait(t, 30*time.Second))
	lines := strings.Split(strings.TrimSpace(p.stderr.String()), "\n")
	require.Len(t, lines, 1, p.stderr.String())
	require.Contains(t, lines[0], "pgdispatch migrate")
	require.Contains(t, lines[0], schema)

	// --migrate makes the same command work.
	p = start(t, dbEnv(schema), "run", "--migrate")
	p.stderr.waitFor(t, "worker started", 30*time.Second)
	w := pgtest.Watch(t, schema)
	id := insert(t, schema, "INSERT INTO {jobs} (kind) VALUES ('noop') RETURNING id")
	w.Status(t, id, "done", 30*time.Second)
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 0, p.wait(t, 30*time.Second))
}

// Acceptance 8: SIGTERM during a long job. Finished jobs are done, the
// unfinished one is pending at once, and the process exits 0 within
// SHUTDOWN_TIMEOUT plus a margin.
func TestSIGTERMDuringLongJob(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	w := pgtest.Watch(t, schema)
	p := start(t, dbEnv(schema, "SHUTDOWN_TIMEOUT=1s", "POLL_INTERVAL=1h", "WORKER_ID=sigterm"), "run")
	quick := insert(t, schema, "INSERT INTO {jobs} (kind) VALUES ('noop') RETURNING id")
	long := insert(t, schema, `INSERT INTO {jobs} (kind, payload) VALUES ('noop', '{"sleep": "1h"}') RETURNING id`)
	w.Status(t, quick, "done", 30*time.Second)
	w.Status(t, long, "running", 30*time.Second)

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	sent := time.Now()
	require.Equal(t, 0, p.wait(t, 30*time.Second), p.stderr.String())
	timing.Below(t, "the exit after SIGTERM (SHUTDOWN_TIMEOUT=1s)", time.Since(sent), 1*time.Second+3*time.Second)

	var status string
	var attempts int
	require.NoError(t, pgtest.Pool(t).QueryRow(context.Background(),
		"SELECT status, attempts FROM "+pgx.Identifier{schema, "jobs"}.Sanitize()+" WHERE id = $1", long).Scan(&status, &attempts))
	require.Equal(t, "pending", status)
	require.Equal(t, 0, attempts)
	require.Equal(t, "done", w.Status(t, quick, "done", time.Second).Status)
}

// Acceptance 3 with a real crash: kill -9 a worker mid-job; another worker
// runs the job again once the lease expires, and it ends done with attempts 2.
func TestKilledWorkersJobIsRescued(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	w := pgtest.Watch(t, schema)
	a := start(t, dbEnv(schema, "LEASE=1s", "WORKER_ID=victim"), "run")
	id := insert(t, schema, `INSERT INTO {jobs} (kind, payload) VALUES ('noop', '{"sleep": "1s"}') RETURNING id`)
	w.Status(t, id, "running", 30*time.Second)
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGKILL))
	a.wait(t, 10*time.Second)

	start(t, dbEnv(schema, "LEASE=1s", "SWEEP_INTERVAL=200ms", "WORKER_ID=rescuer"), "run")
	s := w.Status(t, id, "done", 30*time.Second)
	require.Equal(t, 2, s.Attempts)
	var lockedBy []string
	for _, h := range w.History(id) {
		if h.Error != nil && strings.Contains(*h.Error, "lease expired") {
			lockedBy = append(lockedBy, *h.Error)
		}
	}
	require.NotEmpty(t, lockedBy)
	require.Contains(t, lockedBy[0], "worker victim")
}

func TestEnqueueCommand(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	run := func(args ...string) (string, string, int) {
		p := start(t, dbEnv(schema), append([]string{"enqueue"}, args...)...)
		code := p.wait(t, 30*time.Second)
		return strings.TrimSpace(p.stdout.String()), p.stderr.String(), code
	}
	id1, _, code := run("--kind", "noop", "--payload", `{"a": 1}`, "--dedup-key", "k1", "--run-at", "1h", "--priority", "3")
	require.Equal(t, 0, code)
	id2, stderr, code := run("--kind", "noop", "--dedup-key", "k1")
	require.Equal(t, 0, code)
	require.Equal(t, id1, id2)
	require.Contains(t, stderr, "warning: job "+id1+" holds the dedup key and differs from this job", "another payload and priority")
	id2, stderr, code = run("--kind", "noop", "--payload", `{"a": 1}`, "--dedup-key", "k1", "--run-at", "2h", "--priority", "3")
	require.Equal(t, 0, code)
	require.Equal(t, id1, id2)
	require.NotContains(t, stderr, "warning", "the same job, asked for again")

	var kind, queue string
	var priority int
	var due bool
	require.NoError(t, pgtest.Pool(t).QueryRow(context.Background(),
		"SELECT kind, queue, priority, run_at > now() + interval '50 minutes' FROM "+pgx.Identifier{schema, "jobs"}.Sanitize()+" WHERE id = $1",
		id1).Scan(&kind, &queue, &priority, &due))
	require.Equal(t, []any{"noop", "default", 3, true}, []any{kind, queue, priority, due})

	_, stderr, code = run("--kind", "noop", "--payload", "{not json")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "--payload is not valid JSON")

	p := start(t, dbEnv(pgtest.EmptySchemaName(t)), "enqueue", "--kind", "noop")
	require.Equal(t, 1, p.wait(t, 30*time.Second))
	require.Contains(t, p.stderr.String(), "pgdispatch migrate")
}

func TestBadConfigurationIsAClearError(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	for _, tc := range []struct{ env, want string }{
		{"POLL_INTERVAL=soon", `invalid POLL_INTERVAL "soon"`},
		{"CONCURRENCY=0", `invalid CONCURRENCY "0"`},
		{"QUEUES=a,a", `"a" is listed twice`},
		{"LOG_LEVEL=loud", `invalid LOG_LEVEL "loud"`},
		{"LEASE=-1s", `invalid LEASE "-1s": must not be negative`},
		{"SYNCHRONOUS_COMMIT=maybe", `invalid SYNCHRONOUS_COMMIT "maybe"`},
	} {
		p := start(t, dbEnv(schema, tc.env), "run")
		require.Equal(t, 1, p.wait(t, 30*time.Second), tc.env)
		require.Contains(t, p.stderr.String(), tc.want)
	}
	// Flags win over the environment.
	p := start(t, dbEnv(schema, "POLL_INTERVAL=soon"), "run", "--poll-interval", "also-soon")
	require.Equal(t, 1, p.wait(t, 30*time.Second))
	require.Contains(t, p.stderr.String(), `invalid POLL_INTERVAL "also-soon"`)

	p = start(t, env("DATABASE_URL=postgres://nobody:s3cret-pass@127.0.0.1:1/none?connect_timeout=2"), "run")
	require.Equal(t, 1, p.wait(t, 30*time.Second))
	require.Contains(t, p.stderr.String(), "connect to database")
	require.NotContains(t, p.stderr.String(), "s3cret-pass")
}

// The README's first command, as a user runs it: no DATABASE_URL, so the demo
// starts and removes a throwaway PostgreSQL of its own. Within 10 s of its
// start it has delivered webhooks and mail to its own receivers, the
// webhooks' signatures verified, retried a job and given up on another.
// It runs before the package's parallel tests, as a user's demo runs alone.
func TestDemoOnThrowawayCluster(t *testing.T) {
	began := time.Now()
	p := start(t, env(), "demo")
	p.stdout.waitFor(t, "The tour took", 10*time.Second)
	t.Logf("the tour was over %s after the demo started", time.Since(began).Round(time.Millisecond))
	out := p.stdout.String()
	require.Contains(t, out, "starting a throwaway PostgreSQL")
	require.Contains(t, out, "after commit")
	require.Contains(t, out, "HTTP_ALLOW_NETWORKS=public,loopback")
	require.Regexp(t, `INSERT INTO "pgdispatch_demo"."jobs" \(kind, payload\)\nVALUES \('http_callback', '\{"url": "http://127\.0\.0\.1:\d+/orders"`, out, "the SQL is printed")
	for what, re := range map[string]string{
		"a webhook delivered, its signature verified": `(?m)^job \d+ +http_callback +attempt 1 .* done\n +receiver: POST /orders, signature verified, body \{.*"order_id":1042`,
		"an email received":                           `(?m)^job \d+ +email +attempt 1 .* done\n +receiver: mail "Order 1042 has shipped" from .* to alice@example\.com`,
		"a retry":                                     `(?m)^job (\d+) +http_callback +attempt 1 .* retry\n +receiver: POST /flaky, signature verified; answered 503`,
		"the retried job delivered":                   `(?m)^job \d+ +http_callback +attempt 2 .* after its run_at +done\n +receiver: POST /flaky, signature verified`,
		"a dead job":                                  `(?m)^job \d+ +email +attempt 1 .* dead\n +error: .*550`,
		"a scheduled job":                             `(?m)^job \d+ +email +attempt 1 .* after its run_at +done\n +receiver: mail "How was order 1042\?"`,
	} {
		require.Regexp(t, re, out, what)
	}
	require.Contains(t, out, "8 jobs, 7 delivered (1 after a retry), 1 dead")
	require.Contains(t, out, "rabbitmq  none: set RABBITMQ_URL")

	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 0, p.wait(t, time.Minute), p.stderr.String())
	out = p.stdout.String()
	m := regexp.MustCompile(`(\d+) dispatches. Jobs by status: dead=1 done=7\n`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	n, _ := strconv.Atoi(m[1])
	require.Equal(t, 9, n, "an attempt per job, and two for the retried one")
	require.Contains(t, out, "Throwaway PostgreSQL stopped and removed.")
	require.NotContains(t, out+p.stderr.String(), "whsec_", "the signing secret is never printed")
}

// With DATABASE_URL the demo uses that server, and --count stops it after
// so many attempts.
func TestDemoCountOnDatabaseURL(t *testing.T) {
	t.Parallel()
	schema := pgtest.EmptySchemaName(t)
	p := start(t, dbEnv(schema), "demo", "--count", "4", "--interval", "50ms")
	require.Equal(t, 0, p.wait(t, 2*time.Minute), p.stderr.String())
	out := p.stdout.String()
	require.NotContains(t, out, "throwaway")
	require.Contains(t, out, `serves schema "`+schema+`"`)
	require.Contains(t, out, "after commit")
	m := regexp.MustCompile(`(\d+) dispatches`).FindStringSubmatch(out)
	require.NotNil(t, m, out)
	n, _ := strconv.Atoi(m[1])
	require.GreaterOrEqual(t, n, 4)
}

// With RABBITMQ_URL the tour publishes a message too, which the demo's own
// consumer receives.
func TestDemoPublishesToRabbitMQ(t *testing.T) {
	t.Parallel()
	schema := pgtest.EmptySchemaName(t)
	p := start(t, dbEnv(schema, "RABBITMQ_URL="+amqptest.URL(t)), "demo", "--interval", "50ms")
	p.stdout.waitFor(t, "The tour took", time.Minute)
	out := p.stdout.String()
	require.Regexp(t, `(?m)^job (\d+) +rabbitmq +attempt 1 .* done\n +receiver: queue amq\.gen-\S+ got message_id \d+, body \{"event":"shipped","order_id":1042\}`, out)
	require.Contains(t, out, "9 jobs, 8 delivered (1 after a retry), 1 dead")
	require.NotContains(t, out, "guest:guest", "RABBITMQ_URL's password is never printed")
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 0, p.wait(t, time.Minute), p.stderr.String())
}

// `pgdispatch demo | head`: when the reader of its output goes, demo shuts
// down as on SIGTERM, and its throwaway cluster is stopped, not left running.
func TestDemoStopsWhenItsOutputCloses(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(binary, "demo", "--interval", "50ms")
	cmd.Env = env()
	cmd.Dir = t.TempDir()
	stderr := newSyncBuffer()
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	var waitErr error
	done := make(chan struct{})
	go func() { waitErr = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})

	// Read up to the cluster's address and the first dispatch, as head would.
	// A demo that hangs is killed, which ends the read.
	hung := time.AfterFunc(2*time.Minute, func() { _ = cmd.Process.Kill() })
	defer hung.Stop()
	var read bytes.Buffer
	buf := make([]byte, 4096)
	upAt := regexp.MustCompile(`PostgreSQL is up at (\S+)`)
	for !strings.Contains(read.String(), "after commit") {
		n, err := out.Read(buf)
		require.NoError(t, err, "stdout so far:\n%s\nstderr:\n%s", read.String(), stderr.String())
		read.Write(buf[:n])
	}
	m := upAt.FindStringSubmatch(read.String())
	require.NotNil(t, m, read.String())
	url := m[1]
	require.NoError(t, out.Close())

	select {
	case <-done:
		require.NoError(t, waitErr, stderr.String())
	case <-time.After(time.Minute):
		t.Fatalf("demo went on after its output closed; stderr:\n%s", stderr.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err == nil {
		_ = conn.Close(ctx)
	}
	require.Error(t, err, "the throwaway cluster at %s is still running", url)
}

func TestHelp(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{"run", "migrate", "enqueue", "demo"} {
		p := start(t, env(), cmd, "--help")
		require.Equal(t, 0, p.wait(t, 30*time.Second), cmd)
		require.Contains(t, p.stderr.String(), "Usage: pgdispatch "+cmd)
	}
}

// bench runs end to end with tiny sizes: it proves the harness works, not
// how fast anything is. The URL sets the pool's size, as docs/reference.md tells
// users to: the producers' connections must not send it to the server.
func TestBenchRuns(t *testing.T) {
	t.Parallel()
	latencies := filepath.Join(t.TempDir(), "latencies.csv")
	// A database of the run's own, so that another bench on the server
	// (another package's tests) cannot pass for this one's leftovers.
	dbURL, drop := exampledb.New()
	t.Cleanup(drop)
	p := start(t, env("DATABASE_URL="+withParam(dbURL, "pool_max_conns=8")), "bench", "--json", "--scenario", "latency,drain,floor,http,sustained,writers,idle,soak",
		"--jobs", "20", "--spacing", "1ms", "--drain-jobs", "500", "--writers", "2", "--duration", "1s", "--idle-duration", "200ms",
		"--soak-duration", "1s", "--soak-writers", "2", "--latencies", latencies)
	require.Equal(t, 0, p.wait(t, 2*time.Minute), p.stderr.String())
	var results []struct {
		Scenario   string             `json:"scenario"`
		Conditions string             `json:"conditions"`
		Figures    map[string]float64 `json:"figures"`
	}
	require.NoError(t, json.Unmarshal([]byte(p.stdout.String()), &results), p.stdout.String())
	got := map[string]map[string]float64{}
	for _, r := range results {
		got[r.Scenario] = r.Figures
		require.NotEmpty(t, r.Conditions)
	}
	require.Positive(t, got["latency"]["latency_p50_ms"])
	require.GreaterOrEqual(t, got["latency"]["latency_max_ms"], got["latency"]["latency_p99_ms"])
	require.Positive(t, got["drain"]["jobs_per_s"])
	require.Zero(t, got["drain"]["not_done_after"])
	require.Positive(t, got["sustained"]["inserts_per_s"])
	require.Positive(t, got["sustained"]["round_trip_p50_ms"], "SELECT 1 was timed beside the writers")
	require.GreaterOrEqual(t, got["sustained"]["round_trip_max_ms"], got["sustained"]["round_trip_p99_ms"])
	require.Positive(t, got["writers"]["ratio"])
	require.Contains(t, got, "idle")
	require.Contains(t, got["idle"], "worker_transactions_per_min")
	require.Positive(t, got["floor"]["jobs_per_s"])
	require.Positive(t, got["http"]["commit_to_request_p50_ms"])
	require.Positive(t, got["http_drain"]["jobs_per_s"])
	require.Positive(t, got["drain"]["jobs_per_claim"])
	require.GreaterOrEqual(t, got["writers"]["notified_share"], 0.0)
	require.Positive(t, got["soak"]["jobs_written"])
	require.Positive(t, got["soak"]["table_mb_end"])

	// --latencies: a row per job of the latency and sustained scenarios.
	f, err := os.Open(latencies)
	require.NoError(t, err)
	defer f.Close() //nolint:errcheck // read only
	rows, err := csv.NewReader(f).ReadAll()
	require.NoError(t, err)
	require.Equal(t, []string{"scenario", "writers", "job_id", "commit_unix_us", "start_unix_us", "latency_us"}, rows[0])
	perScenario := map[string]int{}
	for _, row := range rows[1:] {
		perScenario[row[0]]++
		commit, err := strconv.ParseInt(row[3], 10, 64)
		require.NoError(t, err)
		started, err := strconv.ParseInt(row[4], 10, 64)
		require.NoError(t, err)
		require.Equal(t, strconv.FormatInt(started-commit, 10), row[5], "row %v", row)
	}
	require.Equal(t, 20, perScenario["latency"])
	require.InDelta(t, got["sustained"]["inserts_per_s"], float64(perScenario["sustained"]), 0.5, "one row per job committed in the 1 s run")
	conn, err := pgx.Connect(context.Background(), dbURL)
	require.NoError(t, err)
	defer func() { _ = conn.Close(context.Background()) }()
	var left int
	require.NoError(t, conn.QueryRow(context.Background(),
		"SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'pgdispatch_bench_%'").Scan(&left))
	require.Zero(t, left, "bench drops its schemas")
}

// LISTEN_DATABASE_URL gives the listener a connection of its own choosing,
// for a pool behind a transaction-pooling proxy.
// RETAIN_DONE=0 deletes each job as soon as it is done.
func TestRetainDoneZeroDeletesAtOnce(t *testing.T) {
	t.Parallel()
	for retain, deleteDone := range map[string]bool{"0": true, "0s": true, "1h": false} {
		fs := newFlagSet("run", "", io.Discard)
		v := newValues(fs, connSettings, workerSettings)
		require.NoError(t, fs.Parse([]string{"--retain-done", retain}))
		cfg, err := workerConfig(v, &conn{pool: pgtest.Pool(t), schema: "s", timeout: time.Second, logger: zap.NewNop()})
		require.NoError(t, err)
		require.Equal(t, deleteDone, cfg.DeleteDone, "RETAIN_DONE=%s", retain)
	}
}

// A pool's size is pgdispatch's default unless the URL sets pool_max_conns.
func TestPoolSize(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for url, want := range map[string]int32{
		pgtest.URL(): pgdispatch.DefaultMaxConns,
		withParam(pgtest.URL(), "pool_max_conns=3"): 3,
	} {
		pool, err := newPool(ctx, poolOptions{url: url, timeout: 5 * time.Second})
		require.NoError(t, err)
		require.Equal(t, want, pool.Config().MaxConns, url)
		pool.Close()
	}
}

func withParam(url, param string) string {
	if strings.Contains(url, "?") {
		return url + "&" + param
	}
	return url + "?" + param
}

// METRICS_ADDR serves /metrics, /healthz and /readyz from run; a port in use
// is an error at start.
func TestRunServesMetrics(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	w := pgtest.Watch(t, schema)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()

	busy := start(t, dbEnv(schema, "METRICS_ADDR="+addr), "run")
	require.Equal(t, 1, busy.wait(t, 30*time.Second))
	require.Contains(t, busy.stderr.String(), "METRICS_ADDR \""+addr+"\"")
	require.NoError(t, l.Close())

	p := start(t, dbEnv(schema, "METRICS_ADDR="+addr), "run")
	p.stderr.waitFor(t, "listening", 30*time.Second)
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		require.NoError(t, err)
		defer func() { _ = resp.Body.Close() }()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(body)
	}
	code, _ := get("/healthz")
	require.Equal(t, http.StatusOK, code)
	code, _ = get("/readyz")
	require.Equal(t, http.StatusOK, code)

	id := insert(t, schema, `INSERT INTO {jobs} (kind) VALUES ('noop') RETURNING id`)
	w.Status(t, id, "done", 30*time.Second)
	wait.For(t, 30*time.Second, "the completed job in the metrics", func() bool {
		_, body := get("/metrics")
		return strings.Contains(body, `pgdispatch_jobs_completed_total{kind="noop",outcome="done",queue="default"} 1`)
	})
	_, body := get("/metrics")
	require.Contains(t, body, `pgdispatch_listener_connected 1`)
	require.Contains(t, body, `pgdispatch_jobs_claimed_total{queue="default"} 1`)
}

// The admin commands as a user runs them: stats, list, show, retry, cancel.
func TestAdminCommands(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	e := dbEnv(schema)
	dead := insert(t, schema, `INSERT INTO {jobs} (kind, status, attempts, max_attempts, last_error, finished_at, payload)
		VALUES ('noop', 'dead', 3, 3, 'boom: it broke', now(), '{"sleep": "1ms"}') RETURNING id`)
	insert(t, schema, `INSERT INTO {jobs} (kind, queue, status, attempts, max_attempts, finished_at)
		SELECT 'noop', 'other', 'dead', 1, 1, now() FROM generate_series(1, 3) RETURNING 1`)
	scheduled := insert(t, schema, `INSERT INTO {jobs} (kind, run_at) VALUES ('email', now() + interval '1 day') RETURNING id`)

	run := func(args ...string) string {
		t.Helper()
		p := start(t, e, args...)
		require.Equal(t, 0, p.wait(t, 30*time.Second), p.stderr.String())
		return p.stdout.String()
	}
	out := run("stats")
	require.Regexp(t, `(?m)^\s*default\s+email\s+1\s+0\s+0\s+0\s+0\s+0\s+-\s+0\s+0\s*$`, out)
	require.Regexp(t, `(?m)^\s*default\s+noop\s+0\s+0\s+0\s+0\s+1\s+0\s+-\s+0\s+1\s*$`, out)
	require.Regexp(t, `(?m)^\s*other\s+noop\s+0\s+0\s+0\s+0\s+3\s+0\s+-\s+0\s+3\s*$`, out)
	var stats []map[string]any
	require.NoError(t, json.Unmarshal([]byte(run("stats", "--json")), &stats))
	require.Len(t, stats, 3)

	out = run("jobs", "list", "--status", "dead", "--queue", "default")
	require.Contains(t, out, "boom: it broke")
	require.Contains(t, out, "3/3")
	require.Equal(t, 2, strings.Count(out, "\n"), out)
	out = run("jobs", "show", strconv.FormatInt(dead, 10))
	require.Contains(t, out, `"sleep": "1ms"`)
	require.Regexp(t, `(?m)^status\s+dead$`, out)

	partly := start(t, e, "jobs", "cancel", strconv.FormatInt(scheduled, 10), strconv.FormatInt(dead, 10), "999999")
	require.Equal(t, 1, partly.wait(t, 30*time.Second), "an id that matches no job fails the command")
	require.Contains(t, partly.stderr.String(), "not found: job 999999")
	out = partly.stdout.String()
	require.Contains(t, out, fmt.Sprintf("job %d: cancelled (was pending)", scheduled))
	require.Contains(t, out, fmt.Sprintf("job %d: left as it is: dead, not pending or running", dead))
	require.Contains(t, out, "job 999999: not found")

	out = run("jobs", "retry", "--all-dead", "--queue", "other")
	require.Contains(t, out, "3 dead jobs match: ")
	out = run("jobs", "retry", "--all-dead", "--queue", "other", "--yes")
	require.Equal(t, "3 dead jobs retried\n", out)
	out = run("jobs", "retry", strconv.FormatInt(dead, 10))
	require.Contains(t, out, fmt.Sprintf("job %d: retried (was dead)", dead))
	out = run("jobs", "list", "--status", "pending", "--json")
	var pending []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &pending))
	require.Len(t, pending, 4)

	// A worker then runs them.
	w := start(t, append(e, "QUEUES=default,other"), "run")
	w.stderr.waitFor(t, "listening", 30*time.Second)
	pgtest.WaitSQL(t, 30*time.Second, "the four jobs to be done",
		"SELECT count(*) = 4 FROM "+pgx.Identifier{schema, "jobs"}.Sanitize()+" WHERE status = 'done'")

	bad := start(t, e, "jobs", "retry", "12", "--all-dead")
	require.Equal(t, 1, bad.wait(t, 30*time.Second))
	require.Contains(t, bad.stderr.String(), "give job ids or --all-dead, not both")
	bad = start(t, e, "stats", "--finished-budget", "0s")
	require.Equal(t, 2, bad.wait(t, 30*time.Second))
	require.Contains(t, bad.stderr.String(), "--finished-budget must be positive")
	missing := start(t, dbEnv("no_such_schema"), "stats")
	require.Equal(t, 1, missing.wait(t, 30*time.Second))
	require.Contains(t, missing.stderr.String(), `schema "no_such_schema" is not installed`)
}
