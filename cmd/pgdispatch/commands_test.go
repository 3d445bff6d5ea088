package main

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/internal/testkit/exampledb"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgbouncertest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/migrations"
)

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
	p := start(t, env("DATABASE_URL="+withParam(dbURL, "pool_max_conns=8")), "bench", "--json", "--scenario", "latency,drain,floor,http,sustained,writers,idle,soak,xmin",
		"--jobs", "20", "--gap", "1ms", "--drain-jobs", "500", "--writers", "2", "--duration", "1s", "--idle-duration", "200ms",
		"--soak-duration", "1s", "--soak-writers", "2", "--latencies", latencies,
		"--xmin-jobs", "300", "--xmin-lone", "3", "--xmin-pairs", "1", "--xmin-dead", "0,1000")
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
	require.Positive(t, got["xmin_drain"]["ratio"])
	// A lone job may start before its INSERT's reply reaches the bench on
	// a loaded machine, and the bench times it from that reply: the few
	// lone jobs here can read a negative median.
	require.NotZero(t, got["xmin_lone"]["held_p50_ms"])
	require.NotZero(t, got["xmin_lone_http"]["held_p50_ms"])
	require.Positive(t, got["xmin_claim"]["dead_1000_claim_p50_ms"])
	require.Positive(t, got["soak"]["table_mb_end"])

	// --latencies: a row per job of the latency, http and sustained scenarios.
	f, err := os.Open(latencies)
	require.NoError(t, err)
	defer f.Close() //nolint:errcheck // read only
	rows, err := csv.NewReader(f).ReadAll()
	require.NoError(t, err)
	require.Equal(t, []string{
		"scenario", "writers", "job_id", "commit_unix_us", "start_unix_us", "latency_us",
		"notified_us", "claim_sent_us", "claim_returned_us", "started_us", "request_written_us", "request_received_us",
	}, rows[0])
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
	require.Equal(t, 20, perScenario["http"])
	require.InDelta(t, got["sustained"]["inserts_per_s"], float64(perScenario["sustained"]), 0.5, "one row per job committed in the 1 s run")
	conn, err := pgx.Connect(context.Background(), dbURL)
	require.NoError(t, err)
	defer func() { _ = conn.Close(context.Background()) }()
	var left int
	require.NoError(t, conn.QueryRow(context.Background(),
		"SELECT count(*) FROM pg_namespace WHERE nspname LIKE 'pgdispatch_bench_%'").Scan(&left))
	require.Zero(t, left, "bench drops its schemas")
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

// route is how the commands reach PostgreSQL: DATABASE_URL, straight to it
// or through a pooler, and LISTEN_DATABASE_URL straight to it, under an
// application_name of its own so that its session shows.
type route struct {
	dbURL  string
	pooled bool
}

// The commands as a user runs them, straight to PostgreSQL.
func TestCommands(t *testing.T) {
	t.Parallel()
	testCommands(t, route{dbURL: pgtest.URL()})
}

// The commands as a user behind a default PgBouncer 1.18 in transaction
// pooling mode runs them: DATABASE_URL through it, LISTEN_DATABASE_URL
// straight to PostgreSQL.
func TestPgBouncerCommands(t *testing.T) {
	t.Parallel()
	bouncer := pgbouncertest.Start(t, pgtest.URL())
	testCommands(t, route{dbURL: bouncer.URL(), pooled: true})
}

// testCommands runs the commands via: migrate and run --migrate take their
// session lock over the direct connection; run, enqueue, stats, jobs and
// triggers work through DATABASE_URL, and the worker listens on
// LISTEN_DATABASE_URL.
func testCommands(t *testing.T, via route) {
	schema := pgtest.EmptySchemaName(t)
	app := "listener-" + schema
	e := dbEnv(schema, "DATABASE_URL="+via.dbURL, "LISTEN_DATABASE_URL="+withParam(pgtest.URL(), "application_name="+app),
		"POLL_INTERVAL=1h", "SYNCHRONOUS_COMMIT=on")
	run := func(args ...string) string {
		t.Helper()
		p := start(t, e, args...)
		require.Equal(t, 0, p.wait(t, time.Minute), p.stderr.String())
		return p.stdout.String()
	}

	require.Contains(t, run("migrate"), "is at version "+strconv.Itoa(int(migrations.Latest())))
	w := pgtest.Watch(t, schema)
	worker := start(t, e, "run", "--migrate")
	worker.stderr.waitFor(t, "listening", 30*time.Second)
	pgtest.WaitSQL(t, 30*time.Second, "the listener on LISTEN_DATABASE_URL",
		"SELECT EXISTS (SELECT FROM pg_stat_activity WHERE application_name = $1 AND query ILIKE 'listen%')", app)

	id, err := strconv.ParseInt(strings.TrimSpace(run("enqueue", "--kind", "noop", "--payload", `{"n": [1, 2]}`)), 10, 64)
	require.NoError(t, err)
	s := w.Status(t, id, "done", 30*time.Second)
	require.Equal(t, 1, s.Attempts)
	require.Regexp(t, `(?m)^\s*default\s+noop\s`, run("stats"))
	require.Regexp(t, `(?m)^status\s+done$`, run("jobs", "show", strconv.FormatInt(id, 10)))

	// A dispatch trigger added via DATABASE_URL, fired by a write the same way.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	table := pgx.Identifier{schema, "orders"}.Sanitize()
	_, err = pgtest.Pool(t).Exec(ctx, "CREATE TABLE "+table+" (id int PRIMARY KEY)")
	require.NoError(t, err)
	require.Contains(t, run("triggers", "add", "--table", table, "--kind", "noop", "--name", "orders_new"), "trigger orders_new added")
	writer, err := pgx.Connect(ctx, withParam(via.dbURL, "default_query_exec_mode=cache_describe"))
	require.NoError(t, err)
	defer func() { require.NoError(t, writer.Close(ctx)) }()
	var fired int64
	_, err = writer.Exec(ctx, "INSERT INTO "+table+" VALUES ($1)", 1)
	require.NoError(t, err)
	w.Until(t, 30*time.Second, "the trigger's job to be done", func(m map[int64]pgtest.JobState) bool {
		for jobID, s := range m {
			if jobID != id && s.Status == "done" {
				fired = jobID
				return true
			}
		}
		return false
	})
	retry := start(t, e, "jobs", "retry", strconv.FormatInt(fired, 10))
	require.Equal(t, 1, retry.wait(t, time.Minute), "a retry that changed nothing fails") // and yet it ran:
	require.Contains(t, retry.stdout.String(), "left as it is: done")

	// bench measures PostgreSQL: it connects past a pooler.
	b := start(t, e, "bench", "--json", "--scenario", "latency", "--jobs", "5", "--gap", "1ms")
	require.Equal(t, 0, b.wait(t, time.Minute), b.stderr.String())
	if via.pooled {
		require.Contains(t, b.stderr.String(), "bench connects to LISTEN_DATABASE_URL")
	}
	require.Contains(t, b.stdout.String(), "latency_p50_ms")

	require.NoError(t, worker.cmd.Process.Signal(syscall.SIGTERM))
	require.Equal(t, 0, worker.wait(t, 30*time.Second), worker.stderr.String())
	require.NotContains(t, worker.stderr.String(), "prepared statement")
}

// With no DATABASE_URL, the AT Worker's DB_* variables name the database,
// the ones left out taking the AT Worker's defaults (DB_SSLMODE disable).
func TestATWorkerDatabaseVariables(t *testing.T) {
	t.Parallel()
	cfg, err := pgx.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	schema := pgtest.Schema(t)
	p := start(t, env("DB_SCHEMA="+schema, "DB_HOST="+cfg.Host, "DB_PORT="+strconv.Itoa(int(cfg.Port)), "DB_USER="+cfg.User,
		"DB_PASSWORD="+cfg.Password, "DB_NAME="+cfg.Database), "migrate")
	require.Equal(t, 0, p.wait(t, time.Minute), p.stderr.String())
	require.Contains(t, p.stdout.String(), `schema "`+schema+`" is at version`)
}
