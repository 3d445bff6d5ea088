package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/cmd/pgdispatch/internal/settings"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/timing"
	"github.com/pgdispatch/pgdispatch/internal/testkit/wait"
	"github.com/pgdispatch/pgdispatch/migrations"
)

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

func TestBadConfigurationIsAClearError(t *testing.T) {
	t.Parallel()
	schema := pgtest.Schema(t)
	for _, tc := range []struct{ env, want string }{
		{"POLL_INTERVAL=soon", `invalid POLL_INTERVAL "soon"`},
		{"CONCURRENCY=0", `invalid CONCURRENCY "0"`},
		{"QUEUES=a,a", `"a" is listed twice`},
		{"LOG_LEVEL=loud", `invalid LOG_LEVEL "loud"`},
		{"LEASE=-1s", `invalid LEASE "-1s": must not be negative`},
		{"SYNCHRONOUS_COMMIT=maybe", `invalid synchronous_commit "maybe"`},
		{"HTTP_BREAKER=maybe", `invalid HTTP_BREAKER "maybe"`},
		{"HTTP_BREAKER_FAILURE_PERCENT=150", `invalid HTTP_BREAKER_FAILURE_PERCENT 150: at most 100`},
		{"HTTP_BREAKER_MAX_COOL_DOWN=1s", `HTTP_BREAKER_MAX_COOL_DOWN (1s) must not be less than HTTP_BREAKER_COOL_DOWN (30s)`},
		{"HTTP_BREAKER_DISABLE_AFTER=-1h", `invalid HTTP_BREAKER_DISABLE_AFTER "-1h"`},
		{"HTTP_BREAKER_EVENT_PAYLOAD=[1]", `invalid HTTP_BREAKER_EVENT_PAYLOAD: want a JSON object`},
		// The event's job would be dead at the first outage.
		{"HTTP_BREAKER_EVENT_KIND=http_callback", `invalid HTTP_BREAKER_EVENT_PAYLOAD for http_callback jobs: payload.url: is required`},
		{"HTTP_BREAKER_EVENT_KIND=rabbitmq", `invalid HTTP_BREAKER_EVENT_PAYLOAD for rabbitmq jobs`},
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

// LISTEN_DATABASE_URL gives the listener a connection of its own choosing,
// for a pool behind a transaction-pooling proxy.
// RETAIN_DONE=0 deletes each job as soon as it is done.
func TestRetainDoneZeroDeletesAtOnce(t *testing.T) {
	t.Parallel()
	for retain, deleteDone := range map[string]bool{"0": true, "0s": true, "1h": false} {
		fs := newFlagSet("run", "", io.Discard)
		v := settings.New(fs, connSettings, workerSettings)
		require.NoError(t, fs.Parse([]string{"--retain-done", retain}))
		cfg, err := workerConfig(v, &conn{pool: pgtest.Pool(t), schema: "s", timeout: time.Second, logger: zap.NewNop()})
		require.NoError(t, err)
		require.Equal(t, deleteDone, cfg.RetainDone == pgdispatch.RetainDoneNone, "RETAIN_DONE=%s", retain)
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
		pool, err := newPool(ctx, url, "DATABASE_URL", pgdispatch.PoolConfig{StatementTimeout: 5 * time.Second})
		require.NoError(t, err)
		require.Equal(t, want, pool.Config().MaxConns, url)
		pool.Close()
	}
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

// The events' jobs of the documented settings, and of kinds pgdispatch
// does not run itself, are taken as they are.
func TestEventJobSettings(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--http-breaker-event-kind", "http_callback", "--http-breaker-event-payload", `{"url": "https://alerts.example.com/pgdispatch"}`},
		{"--http-breaker-event-kind", "http_callback", "--http-breaker-event-payload", `{"url": "https://alerts.example.com/x", "data": "replaced"}`},
		{"--http-breaker-event-kind", "tell_ops"},
		{},
	} {
		fs := newFlagSet("run", "", io.Discard)
		v := settings.New(fs, eventSettings)
		require.NoError(t, fs.Parse(args))
		_, err := eventJob(v)
		require.NoError(t, err, args)
	}
}
