package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/admin"
	"github.com/pgdispatch/pgdispatch/internal/testkit/amqptest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/smtptest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/timing"
	"github.com/pgdispatch/pgdispatch/internal/testkit/wait"
)

// atWorkerDDL is the AT Worker's table as its README implies (the columns
// its queries use, the statuses it names), with a column of the
// application's own: tenant.
const atWorkerDDL = `
CREATE TABLE scheduled_tasks (
    id            bigserial PRIMARY KEY,
    task_type     varchar(50) NOT NULL,
    payload       jsonb NOT NULL,
    status        varchar(20) NOT NULL DEFAULT 'pending'
                  CHECK (status IN ('pending', 'processing', 'completed', 'failed')),
    attempts      integer NOT NULL DEFAULT 0,
    max_attempts  integer NOT NULL DEFAULT 3,
    execute_at    timestamptz NOT NULL DEFAULT now(),
    created_at    timestamptz NOT NULL DEFAULT now(),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    completed_at  timestamptz,
    error_message text,
    tenant        text NOT NULL DEFAULT 'acme'
)`

// The AT Worker README's diagnostic and monitoring queries, verbatim.
const (
	readmePendingSQL = `SELECT id, execute_at, status, task_type
FROM scheduled_tasks
WHERE status = 'pending'
ORDER BY execute_at;`
	readmeLocksSQL = `SELECT * FROM pg_locks WHERE relation = 'scheduled_tasks'::regclass;`
	readmeStuckSQL = `SELECT id, task_type, status, attempts, max_attempts, updated_at,
       NOW() - updated_at as stuck_duration
FROM scheduled_tasks
WHERE status = 'processing'
  AND updated_at < NOW() - INTERVAL '5 minutes'
ORDER BY updated_at;`
	readmeFailedHTTPSQL = `SELECT id, task_type, payload, error_message
FROM scheduled_tasks
WHERE task_type = 'http_callback'
  AND status = 'failed';`
	readmeQueueSQL = `SELECT status, COUNT(*)
FROM scheduled_tasks
GROUP BY status;`
	readmeAvgSQL = `SELECT task_type,
       AVG(EXTRACT(EPOCH FROM (completed_at - execute_at))) as avg_seconds
FROM scheduled_tasks
WHERE status = 'completed'
  AND completed_at IS NOT NULL
GROUP BY task_type;`
	readmeByStatusSQL   = `SELECT status, COUNT(*) FROM scheduled_tasks GROUP BY status;`
	readmeStuckCountSQL = `SELECT COUNT(*) FROM scheduled_tasks
WHERE status = 'processing'
  AND updated_at < NOW() - INTERVAL '5 minutes';`
	readmeSuccessRateSQL = `SELECT
  ROUND(100.0 * SUM(CASE WHEN status = 'completed' THEN 1 ELSE 0 END) / COUNT(*), 2) as success_rate
FROM scheduled_tasks
WHERE status IN ('completed', 'failed');`
	readmeNearMaxSQL = `SELECT id, task_type, attempts, max_attempts, error_message
FROM scheduled_tasks
WHERE attempts >= max_attempts - 1
  AND status != 'completed'
ORDER BY updated_at DESC
LIMIT 10;`
)

// delivery is one task that reached a receiver.
type delivery struct {
	n  int
	at time.Time
}

// TestATWorkerSwitch is issue 25's acceptance: the AT Worker's table,
// switched while a producer inserts, runs every row on pgdispatch exactly
// once, answers the README's queries as pgdispatch stats does, and reverts
// with every row's state and the application's column.
func TestATWorkerSwitch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	brokerURL := amqptest.URL(t)
	pgd := pgtest.FreshSchema(t)
	pool := pgtest.Pool(t)
	// The application's session: scheduled_tasks on its search_path, the
	// statement cache of pgx's default.
	app, db := atWorkerApp(t)

	// The receivers.
	rabbitQueue := "pgdispatch-at-worker-" + pgd
	amqptest.Queue(t, brokerURL, rabbitQueue)
	mail := smtptest.Start(t, "", "")
	var (
		mu   sync.Mutex
		hits = map[int][]delivery{}
	)
	got := func(n int) {
		mu.Lock()
		defer mu.Unlock()
		hits[n] = append(hits[n], delivery{n, time.Now()})
	}
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/task/"))
		if err == nil {
			got(n)
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(receiver.Close)
	payload := func(kind string, n int) string {
		switch kind {
		case "http_callback":
			return fmt.Sprintf(`{"url": "%s/task/%d", "data": {"n": %d}}`, receiver.URL, n, n)
		case "rabbitmq":
			return fmt.Sprintf(`{"routing_key": %q, "body": {"n": %d}}`, rabbitQueue, n)
		}
		return fmt.Sprintf(`{"to": ["task%d@example.test"], "subject": "task %d", "text": "n=%d"}`, n, n, n)
	}
	kinds := []string{"http_callback", "rabbitmq", "email"}

	// 1. Rows in every status, due and in the future. n is the row's
	// number in its payload; id follows it.
	type row struct {
		n                    int
		kind, status         string
		attempts, maxAttempt int
		executeAt, updatedAt string
		errorMessage         *string
	}
	smtpDown, http500 := "smtp: connection refused", "HTTP 500"
	before := []row{
		{1, "http_callback", "pending", 0, 3, "now()", "now()", nil},
		{2, "rabbitmq", "pending", 0, 3, "now() - interval '1 minute'", "now()", nil},
		{3, "email", "pending", 1, 3, "now()", "now()", &smtpDown},
		{4, "http_callback", "pending", 0, 3, "now() + interval '4 seconds'", "now()", nil},                         // runs at its execute_at
		{5, "email", "pending", 0, 3, "now() + interval '1 hour'", "now()", nil},                                    // still pending at the end
		{6, "rabbitmq", "processing", 0, 3, "now() - interval '20 minutes'", "now() - interval '10 minutes'", nil},  // its AT Worker died
		{7, "http_callback", "processing", 0, 3, "now() - interval '1 minute'", "now() - interval '1 minute'", nil}, // its AT Worker finishes it
		{8, "rabbitmq", "completed", 1, 3, "now() - interval '1 hour'", "now() - interval '59 minutes'", nil},
		{9, "email", "failed", 3, 3, "now() - interval '1 hour'", "now() - interval '30 minutes'", &smtpDown},
		{10, "http_callback", "failed", 2, 3, "now() - interval '1 hour'", "now() - interval '20 minutes'", &http500},
	}
	for _, r := range before {
		completedAt := "NULL"
		if r.status == "completed" {
			completedAt = r.updatedAt
		}
		_, err := db.Exec(ctx, fmt.Sprintf(`INSERT INTO scheduled_tasks (id, task_type, payload, status, attempts, max_attempts, execute_at, updated_at, completed_at, error_message, tenant)
			VALUES ($1, $2, $3, $4, $5, $6, %s, %s, %s, $7, $8)`, r.executeAt, r.updatedAt, completedAt),
			r.n, r.kind, payload(r.kind, r.n), r.status, r.attempts, r.maxAttempt, r.errorMessage, fmt.Sprintf("tenant-%d", r.n))
		require.NoError(t, err)
	}
	_, err := db.Exec(ctx, "SELECT setval('scheduled_tasks_id_seq', 100)")
	require.NoError(t, err)
	var futureAt time.Time
	require.NoError(t, db.QueryRow(ctx, "SELECT execute_at FROM scheduled_tasks WHERE id = 4").Scan(&futureAt))

	// A worker configured with the AT Worker's settings where pgdispatch's are unset.
	table := pgx.Identifier{app, "scheduled_tasks"}.Sanitize()
	e := dbEnv(pgd, "WORKER_ID=at-worker-test", "HTTP_ALLOW_NETWORKS=loopback", "RABBITMQ_URL="+brokerURL,
		"SMTP_HOST="+mail.Host, "SMTP_PORT="+strconv.Itoa(mail.Port), "SMTP_TLS=none", "SMTP_FROM=at@example.test",
		"WORKER_POLLING_INTERVAL=2", "WORKER_BATCH_SIZE=4", "WORKER_CLEANER_INTERVAL=1", "SWEEP_INTERVAL=200ms")
	w := start(t, e, "run")
	w.stderr.waitFor(t, "listening", 30*time.Second)
	w.stderr.waitFor(t, "WORKER_POLLING_INTERVAL=2", time.Second)
	require.Regexp(t, `AT Worker's setting stands in for pgdispatch's.*"at_worker": "WORKER_POLLING_INTERVAL=2", "pgdispatch": "POLL_INTERVAL=2s"`, w.stderr.String())
	require.Regexp(t, `"at_worker": "WORKER_BATCH_SIZE=4", "pgdispatch": "CONCURRENCY=4"`, w.stderr.String())
	require.NotContains(t, w.stderr.String(), "SWEEP_INTERVAL=", "SWEEP_INTERVAL is set: WORKER_CLEANER_INTERVAL is not read")

	// 2. A producer inserts through the AT Worker's INSERT, before, during
	// and after the switch.
	producer := appConn(t, app)
	var (
		produced   = map[int64]int{} // id -> n
		producedMu sync.Mutex
		stop       = make(chan struct{})
		stopped    = make(chan error, 1)
		counted    = make(chan int, 1000)
	)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				stopped <- nil
				return
			default:
			}
			n := 1000 + i
			kind := kinds[i%len(kinds)]
			var id int64
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err := producer.QueryRow(cctx, `INSERT INTO scheduled_tasks (task_type, payload, execute_at, tenant)
				VALUES ($1, $2, NOW(), $3) RETURNING id`, kind, payload(kind, n), fmt.Sprintf("tenant-%d", n)).Scan(&id)
			cancel()
			if err != nil {
				stopped <- err
				return
			}
			producedMu.Lock()
			produced[id] = n
			producedMu.Unlock()
			counted <- i
		}
	}()
	waitProduced := func(atLeast int) {
		t.Helper()
		for {
			select {
			case i := <-counted:
				if i+1 >= atLeast {
					return
				}
			case err := <-stopped:
				t.Fatalf("the producer stopped: %v", err)
			case <-time.After(30 * time.Second):
				t.Fatalf("the producer made fewer than %d rows", atLeast)
			}
		}
	}
	waitProduced(5)
	sw := start(t, e, "at-worker", "switch", "--table", table)
	require.Equal(t, 0, sw.wait(t, 60*time.Second), sw.stderr.String())
	require.Contains(t, sw.stdout.String(), "switched "+table+" to pgdispatch: ")
	waitProduced(30)
	close(stop)
	require.NoError(t, <-stopped)
	var inserted int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{app, "scheduled_tasks_at_worker"}.Sanitize()+" WHERE id > 100").Scan(&inserted))
	require.Equal(t, int64(len(produced)), inserted, "every RETURNING id is a row")

	// 5. The switch again: a no-op that says so.
	again := start(t, e, "at-worker", "switch", "--table", table)
	require.Equal(t, 0, again.wait(t, 30*time.Second), again.stderr.String())
	require.Equal(t, table+` is already switched to pgdispatch (schema "`+pgd+`"; its rows are in `+
		pgx.Identifier{app, "scheduled_tasks_at_worker"}.Sanitize()+"): nothing changed\n", again.stdout.String())

	// The AT Worker that held row 7 finishes it, as it would: pgdispatch
	// never runs it.
	tag, err := db.Exec(ctx, "UPDATE scheduled_tasks SET status = 'completed', completed_at = NOW(), updated_at = NOW() WHERE id = $1", 7)
	require.NoError(t, err)
	require.Equal(t, int64(1), tag.RowsAffected())

	// Every due row is delivered, exactly once, as its task_type says; the
	// future one at its execute_at.
	want := map[int]string{1: "http_callback", 2: "rabbitmq", 3: "email", 4: "http_callback", 6: "rabbitmq"}
	for _, n := range produced {
		want[n] = kinds[(n-1000)%len(kinds)]
	}
	rabbit := map[int]int{}
	var progress string
	wait.On(t, 60*time.Second, "every due row to be delivered", func() (bool, <-chan time.Time) {
		for _, d := range amqptest.Drain(t, brokerURL, rabbitQueue) {
			var body struct{ N int }
			require.NoError(t, json.Unmarshal(d.Body, &body))
			rabbit[body.N]++
		}
		var left int
		require.NoError(t, db.QueryRow(ctx, "SELECT count(*) FROM scheduled_tasks WHERE status IN ('pending', 'processing') AND execute_at < now() + interval '1 minute'").Scan(&left))
		if p := fmt.Sprintf("%d rows due, %d messages, %d mails", left, len(rabbit), len(mail.Messages())); p != progress {
			progress = p
			t.Log(p)
		}
		return left == 0 && len(rabbit) == countKind(want, "rabbitmq") && len(mail.Messages()) == countKind(want, "email"), time.After(50 * time.Millisecond)
	})
	mails := map[int]int{}
	for _, m := range mail.Messages() {
		n, err := strconv.Atoi(strings.TrimPrefix(m.Header.Get("Subject"), "task "))
		require.NoError(t, err)
		mails[n]++
	}
	mu.Lock()
	for n, kind := range want {
		switch kind {
		case "http_callback":
			require.Len(t, hits[n], 1, "task %d over HTTP", n)
		case "rabbitmq":
			require.Equal(t, 1, rabbit[n], "task %d to RabbitMQ", n)
		case "email":
			require.Equal(t, 1, mails[n], "task %d by mail", n)
		}
	}
	require.Len(t, keys(hits), countKind(want, "http_callback"), "no other HTTP delivery (7 was the AT Worker's, 10 failed)")
	require.Len(t, keys(rabbit), countKind(want, "rabbitmq"), "no other message (8 was completed)")
	require.Len(t, keys(mails), countKind(want, "email"), "no other mail (5 is due in an hour, 9 failed)")
	require.False(t, hits[4][0].at.Before(futureAt), "task 4 ran before its execute_at")
	timing.Below(t, "task 4's run after its execute_at", hits[4][0].at.Sub(futureAt), 3*time.Second)
	mu.Unlock()

	// 3. The README's queries, verbatim, against pgdispatch stats.
	stats, counted2, err := admin.New(pool, pgd, 10*time.Second).Stats(ctx, 10*time.Second)
	require.NoError(t, err)
	require.True(t, counted2)
	var total admin.QueueStats
	total.Done, total.Dead, total.Cancelled = new(int64), new(int64), new(int64)
	doneByKind, failedByKind := map[string]int64{}, map[string]int64{}
	for _, s := range stats {
		total.Pending += s.Pending
		total.Running += s.Running
		*total.Done += *s.Done
		*total.Dead += *s.Dead
		*total.Cancelled += *s.Cancelled
		doneByKind[s.Kind] += *s.Done
		failedByKind[s.Kind] += *s.Dead + *s.Cancelled
	}
	wantByStatus := map[string]int64{"pending": total.Pending, "processing": total.Running, "completed": *total.Done, "failed": *total.Dead + *total.Cancelled}
	for k, v := range wantByStatus {
		if v == 0 {
			delete(wantByStatus, k)
		}
	}
	require.Equal(t, int64(1), total.Pending) // task 5
	for _, sql := range []string{readmeQueueSQL, readmeByStatusSQL} {
		rows, err := db.Query(ctx, sql)
		require.NoError(t, err)
		byStatus := map[string]int64{}
		var (
			s string
			n int64
		)
		_, err = pgx.ForEachRow(rows, []any{&s, &n}, func() error { byStatus[s] = n; return nil })
		require.NoError(t, err)
		require.Equal(t, wantByStatus, byStatus, sql)
	}
	require.Equal(t, int64(len(want)+2), wantByStatus["completed"]) // 7 and 8 besides the delivered ones
	require.Equal(t, total.Pending, countRows(t, db, readmePendingSQL))
	countRows(t, db, readmeLocksSQL)
	require.Equal(t, int64(0), countRows(t, db, readmeStuckSQL))
	var stuck int64
	require.NoError(t, db.QueryRow(ctx, readmeStuckCountSQL).Scan(&stuck))
	require.Equal(t, total.Running, stuck) // nothing runs longer than 5 minutes
	require.Equal(t, failedByKind["http_callback"], countRows(t, db, readmeFailedHTTPSQL))
	var rate float64
	require.NoError(t, db.QueryRow(ctx, readmeSuccessRateSQL).Scan(&rate))
	finished := *total.Done + *total.Dead + *total.Cancelled
	require.InDelta(t, math.Round(10000*float64(*total.Done)/float64(finished))/100, rate, 0.001)
	rows, err := db.Query(ctx, readmeAvgSQL)
	require.NoError(t, err)
	avgKinds := map[string]bool{}
	var (
		kind string
		avg  float64
	)
	_, err = pgx.ForEachRow(rows, []any{&kind, &avg}, func() error { avgKinds[kind] = true; return nil })
	require.NoError(t, err)
	for _, k := range kinds {
		require.Equal(t, doneByKind[k] > 0, avgKinds[k], k)
	}
	rows, err = db.Query(ctx, readmeNearMaxSQL)
	require.NoError(t, err)
	var nearMax []int64
	var id int64
	_, err = pgx.ForEachRow(rows, []any{&id, nil, nil, nil, nil}, func() error { nearMax = append(nearMax, id); return nil })
	require.NoError(t, err)
	sort.Slice(nearMax, func(i, j int) bool { return nearMax[i] < nearMax[j] })
	require.Equal(t, []int64{9, 10}, nearMax)
	require.Equal(t, *total.Dead+*total.Cancelled, int64(len(nearMax)))

	// run writes the finished jobs' states into their rows, for when the
	// sweeper purges the jobs.
	store0 := pgx.Identifier{app, "scheduled_tasks_at_worker"}.Sanitize()
	var unsettled, settled int64
	wait.For(t, 30*time.Second, "the rows of done jobs to be written back", func() bool {
		err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE s.status NOT IN ('completed', 'failed')),
			count(*) FILTER (WHERE s.status = 'completed') FROM `+store0+` s JOIN `+pgx.Identifier{pgd, "jobs"}.Sanitize()+` j
			ON j.id = s.pgdispatch_job_id WHERE j.status = 'done'`).Scan(&unsettled, &settled)
		return err == nil && unsettled == 0
	})
	require.Equal(t, *total.Done, settled)
	require.NotContains(t, w.stderr.String(), "writing finished jobs into scheduled_tasks failed")

	// 4. The revert: a table whose rows match their jobs' states, and the
	// application's column as it was.
	type state struct {
		Status, Tenant string
		Attempts       int
		Error          *string
	}
	read := func(q string) map[int64]state {
		rows, err := pool.Query(ctx, q)
		require.NoError(t, err)
		out := map[int64]state{}
		var (
			id int64
			s  state
		)
		_, err = pgx.ForEachRow(rows, []any{&id, &s.Status, &s.Tenant, &s.Attempts, &s.Error}, func() error { out[id] = s; return nil })
		require.NoError(t, err)
		return out
	}
	store := pgx.Identifier{app, "scheduled_tasks_at_worker"}.Sanitize()
	fromJobs := read(`SELECT s.id, CASE j.status WHEN 'done' THEN 'completed' WHEN 'running' THEN 'processing'
		WHEN 'pending' THEN 'pending' ELSE 'failed' END, s.tenant, j.attempts, j.last_error
		FROM ` + store + ` s JOIN ` + pgx.Identifier{pgd, "jobs"}.Sanitize() + ` j ON j.id = s.pgdispatch_job_id`)
	require.Len(t, fromJobs, len(before)+len(produced))
	var job5 int64
	require.NoError(t, pool.QueryRow(ctx, "SELECT pgdispatch_job_id FROM "+store+" WHERE id = 5").Scan(&job5))
	rv := start(t, e, "at-worker", "revert", "--table", table)
	require.Equal(t, 0, rv.wait(t, 60*time.Second), rv.stderr.String())
	require.Contains(t, rv.stdout.String(), "reverted "+table+" to a table")
	var relkind string
	require.NoError(t, pool.QueryRow(ctx, "SELECT relkind::text FROM pg_class WHERE oid = $1::regclass", table).Scan(&relkind))
	require.Equal(t, "r", relkind)
	restored := read(`SELECT id, status, tenant, attempts, error_message FROM ` + table)
	require.Equal(t, fromJobs, restored)
	for id, s := range restored {
		n := int(id)
		if id > 100 {
			n = produced[id]
		}
		require.Equal(t, fmt.Sprintf("tenant-%d", n), s.Tenant, "row %d", id)
	}
	// The pending job is cancelled: the AT Worker runs its row now.
	var status string
	require.NoError(t, pool.QueryRow(ctx, `SELECT j.status FROM `+pgx.Identifier{pgd, "jobs"}.Sanitize()+` j WHERE j.id = $1`, job5).Scan(&status))
	require.Equal(t, "cancelled", status)
	require.Equal(t, "pending", restored[5].Status)

	// 5. A database without the table: one clear line.
	missing := start(t, e, "at-worker", "switch", "--table", pgx.Identifier{app, "no_such_table"}.Sanitize())
	require.Equal(t, 1, missing.wait(t, 30*time.Second))
	require.Equal(t, fmt.Sprintf("pgdispatch at-worker: no table %s in this database (nor on its search_path): nothing to switch\n",
		pgx.Identifier{app, "no_such_table"}.Sanitize()), missing.stderr.String())
}

// atWorkerApp makes a schema of the application's own with the AT
// Worker's table in it, and a session of the application's on it.
func atWorkerApp(t *testing.T) (schema string, db *pgx.Conn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	schema = pgtest.EmptySchemaName(t)
	_, err := pgtest.Pool(t).Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
	require.NoError(t, err)
	db = appConn(t, schema)
	_, err = db.Exec(ctx, atWorkerDDL)
	require.NoError(t, err)
	return schema, db
}

// appConn is a session of the application's own, with schema on its
// search_path.
func appConn(t *testing.T, schema string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	cfg.RuntimeParams["search_path"] = schema
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func countRows(t *testing.T, db *pgx.Conn, sql string) int64 {
	t.Helper()
	rows, err := db.Query(context.Background(), sql)
	require.NoError(t, err)
	var n int64
	for rows.Next() {
		n++
	}
	require.NoError(t, rows.Err())
	return n
}

func countKind(m map[int]string, kind string) int {
	n := 0
	for _, k := range m {
		if k == kind {
			n++
		}
	}
	return n
}

// keys are m's keys, in order.
func keys[T any](m map[int]T) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}

// A revert that cuts jobs still running names their rows by the table's
// ids, which the operator knows, not by the jobs' ids.
func TestATWorkerRevertNamesRowsByTheTablesIDs(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pgd := pgtest.FreshSchema(t)
	pool := pgtest.Pool(t)
	app, db := atWorkerApp(t)
	_, err := db.Exec(ctx, `INSERT INTO scheduled_tasks (id, task_type, payload) VALUES (501, 'noop', '{}'), (502, 'noop', '{}')`)
	require.NoError(t, err)
	jobs := pgx.Identifier{pgd, "jobs"}.Sanitize()
	_, err = pool.Exec(ctx, `INSERT INTO `+jobs+` (kind) SELECT 'noop' FROM generate_series(1, 10)`)
	require.NoError(t, err)

	table := pgx.Identifier{app, "scheduled_tasks"}.Sanitize()
	e := dbEnv(pgd)
	sw := start(t, e, "at-worker", "switch", "--table", table)
	require.Equal(t, 0, sw.wait(t, 30*time.Second), sw.stderr.String())
	// A worker runs both rows' jobs, and goes on past the wait.
	tag, err := pool.Exec(ctx, `UPDATE `+jobs+` SET status = 'running', attempts = 1, locked_by = 'w1', locked_until = now() + interval '1 minute'
		WHERE id IN (SELECT pgdispatch_job_id FROM `+pgx.Identifier{app, "scheduled_tasks_at_worker"}.Sanitize()+`)`)
	require.NoError(t, err)
	require.Equal(t, int64(2), tag.RowsAffected())

	// The guide's query in place of the README's pg_locks one names the
	// rows and the worker that holds them.
	guide, err := os.ReadFile("../../docs/migrating-from-at-worker.md")
	require.NoError(t, err)
	const held = `SELECT s.id, j.locked_by AS worker, j.updated_at AS started_at, j.locked_until AS lease_until
FROM scheduled_tasks_at_worker s
JOIN pgdispatch.jobs j ON j.id = s.pgdispatch_job_id
WHERE j.status = 'running'
ORDER BY s.id;`
	require.Contains(t, string(guide), held)
	rows, err := db.Query(ctx, strings.Replace(held, "pgdispatch.jobs", jobs, 1))
	require.NoError(t, err)
	var holders []string
	var (
		id     int64
		worker string
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &worker, nil, nil}, func() error {
		holders = append(holders, fmt.Sprintf("%d:%s", id, worker))
		return nil
	})
	require.NoError(t, err)
	require.Equal(t, []string{"501:w1", "502:w1"}, holders)

	rv := start(t, e, "at-worker", "revert", "--table", table, "--wait", "0s")
	require.Equal(t, 0, rv.wait(t, 30*time.Second), rv.stderr.String())
	out := rv.stdout.String()
	require.Contains(t, out, "2 still running were cancelled")
	require.Contains(t, out, "ids 501, 502 of "+table, out)
}
