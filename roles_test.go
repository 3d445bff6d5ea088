package pgdispatch_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/admin"
	"github.com/pgdispatch/pgdispatch/endpoints"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/schedule"
	"github.com/pgdispatch/pgdispatch/signing"
	"github.com/pgdispatch/pgdispatch/sweeper"
	"github.com/pgdispatch/pgdispatch/triggers"
)

// roles are three roles of the test's own, named uniquely (roles belong to
// the whole cluster), and dropped when the test ends.
type roles struct{ writer, worker, operator string }

func createRoles(t *testing.T) roles {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	prefix := "pgdt_" + hex.EncodeToString(b) + "_"
	r := roles{writer: prefix + "writer", worker: prefix + "worker", operator: prefix + "operator"}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, name := range []string{r.writer, r.worker, r.operator} {
		role := pgx.Identifier{name}.Sanitize()
		_, err := pgtest.Pool(t).Exec(ctx, "CREATE ROLE "+role+" NOLOGIN")
		require.NoError(t, err)
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_, err := pgtest.Pool(t).Exec(ctx, "DROP OWNED BY "+role+"; DROP ROLE "+role)
			require.NoError(t, err)
		})
	}
	return r
}

// applyRolesScript runs docs/roles.sql as psql would with the -v variables
// schema, writer, worker and operator: its meta-commands, which only set
// defaults, are left out, and :"name" is the variable quoted as an identifier.
func applyRolesScript(t *testing.T, schema string, r roles) {
	t.Helper()
	raw, err := os.ReadFile("docs/roles.sql")
	require.NoError(t, err)
	vars := map[string]string{"schema": schema, "writer": r.writer, "worker": r.worker, "operator": r.operator}
	var lines []string
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(line, `\`) {
			lines = append(lines, line)
		}
	}
	script := regexp.MustCompile(`:"(\w+)"`).ReplaceAllStringFunc(strings.Join(lines, "\n"), func(m string) string {
		name := m[2 : len(m)-1]
		v, ok := vars[name]
		require.True(t, ok, "docs/roles.sql uses an unknown variable %s", name)
		return pgx.Identifier{v}.Sanitize()
	})
	require.NotContains(t, script, ":'", "only :\"identifier\" variables are expected")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = pgtest.Pool(t).Exec(ctx, script)
	require.NoError(t, err)
}

// rolePool is a pool whose sessions act as role (the server's role setting,
// sent at connection), closed when the test ends.
func rolePool(t *testing.T, role string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	cfg.MaxConns = 10
	cfg.ConnConfig.RuntimeParams["role"] = role
	cfg.ConnConfig.RuntimeParams["statement_timeout"] = "30s"
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

func requireDenied(t *testing.T, db *pgxpool.Pool, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := db.Exec(ctx, sql)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, sql)
	require.Equal(t, "42501", pgErr.Code, "%s: %v", sql, err) // insufficient_privilege
}

func requireAllowed(t *testing.T, db *pgxpool.Pool, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := db.Exec(ctx, sql)
	require.NoError(t, err, sql)
}

// docs/roles.sql gives each role what it needs and no more: the writer
// enqueues (enqueue() runs with its owner's rights, so the writer needs no
// SELECT) and reads nothing; a worker running as the worker role runs the
// writer's jobs; the operator runs every admin operation and dispatch
// triggers; each is refused what belongs to the others.
func TestRolesScript(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := setup(t)
	r := createRoles(t)
	applyRolesScript(t, b.schema, r)
	applyRolesScript(t, b.schema, r) // again: nothing changes, nothing fails
	jobs := b.jobs
	enqueue := pgx.Identifier{b.schema, "enqueue"}.Sanitize()
	writer, worker, operator := rolePool(t, r.writer), rolePool(t, r.worker), rolePool(t, r.operator)

	// The writer.
	var id int64
	require.NoError(t, writer.QueryRow(ctx, "SELECT "+enqueue+"('record', '{\"n\": 1}')").Scan(&id))
	var e struct {
		id                int64
		created, conflict bool
	}
	require.NoError(t, writer.QueryRow(ctx, "SELECT * FROM "+pgx.Identifier{b.schema, "enqueue_checked"}.Sanitize()+
		"('record', dedup_key => 'k')").Scan(&e.id, &e.created, &e.conflict))
	require.True(t, e.created)
	requireAllowed(t, writer, "INSERT INTO "+jobs+" (kind, payload, queue, run_at, priority, dedup_key, max_attempts) "+
		"VALUES ('record', '{}', 'default', now(), 0, NULL, 3)")
	// ON CONFLICT with no target: naming the index's column would need SELECT on it.
	requireAllowed(t, writer, "INSERT INTO "+jobs+" (kind, dedup_key) VALUES ('record', 'k') ON CONFLICT DO NOTHING")
	for _, sql := range []string{
		"SELECT payload FROM " + jobs,
		"SELECT count(*) FROM " + jobs,
		"INSERT INTO " + jobs + " (kind, dedup_key) VALUES ('record', 'k') ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING",
		"INSERT INTO " + jobs + " (kind) VALUES ('record') RETURNING id",
		"INSERT INTO " + jobs + " (kind, attempts) VALUES ('record', 5)",
		"INSERT INTO " + jobs + " (kind, status) VALUES ('record', 'dead')",
		"INSERT INTO " + jobs + " (id, kind) OVERRIDING SYSTEM VALUE VALUES (1000000000, 'record')",
		"INSERT INTO " + jobs + " (kind, created_at) VALUES ('record', now())",
		"UPDATE " + jobs + " SET run_at = now()",
		"DELETE FROM " + jobs,
		"SELECT * FROM " + pgx.Identifier{b.schema, "event_triggers"}.Sanitize(),
	} {
		requireDenied(t, writer, sql)
	}

	// The worker runs them, as its own role, and claims a queue with flow
	// limits (claim_flow, and the state of a strict, rate-limited key).
	_, err := pgtest.Pool(t).Exec(ctx, "SELECT "+pgx.Identifier{b.schema, "set_flow_limit"}.Sanitize()+
		"('limited', 'acme', strict => true, rate => 100, per => '1 hour')")
	require.NoError(t, err)
	var limited int64
	require.NoError(t, writer.QueryRow(ctx, "SELECT "+enqueue+"('record', queue => 'limited', flow_key => 'acme')").Scan(&limited))
	cfg := b.config(t, "w-role")
	cfg.Pool = worker
	cfg.SigningKeys = signing.NewKeyring()
	cfg.Queues = []pgdispatch.Queue{{Name: pgdispatch.DefaultQueue}, {Name: "limited"}}
	start(t, cfg)
	b.watch.Status(t, id, "done", waitFor)
	b.watch.Status(t, e.id, "done", waitFor)
	b.watch.Status(t, limited, "done", waitFor)
	for _, sql := range []string{
		"INSERT INTO " + jobs + " (kind) VALUES ('record')",
		"SELECT " + enqueue + "('record')",
		"SELECT * FROM " + pgx.Identifier{b.schema, "event_triggers"}.Sanitize(),
	} {
		requireDenied(t, worker, sql)
	}

	// The operator: the admin commands and dispatch triggers.
	a := admin.New(operator, b.schema, 10*time.Second)
	_, _, err = a.Stats(ctx, 0)
	require.NoError(t, err)
	list, err := a.List(ctx, admin.Filter{})
	require.NoError(t, err)
	require.NotEmpty(t, list)
	_, err = a.Get(ctx, id)
	require.NoError(t, err)
	changes, err := a.Retry(ctx, []int64{id})
	require.NoError(t, err)
	require.False(t, changes[0].Changed, "a done job is not retried")
	_, err = a.RetryDead(ctx, "", "")
	require.NoError(t, err)
	var pending int64
	require.NoError(t, writer.QueryRow(ctx, "SELECT "+enqueue+"('record', run_at => now() + interval '1 hour')").Scan(&pending))
	changes, err = a.Snooze(ctx, []int64{pending}, time.Hour)
	require.NoError(t, err)
	require.True(t, changes[0].Changed)
	changes, err = a.Cancel(ctx, []int64{pending})
	require.NoError(t, err)
	require.True(t, changes[0].Changed)
	for _, pause := range []bool{true, false} {
		f := a.Resume
		if pause {
			f = a.Pause
		}
		changed, err := f(ctx, "roles")
		require.NoError(t, err)
		require.True(t, changed)
	}
	_, err = a.Queues(ctx)
	require.NoError(t, err)

	// The operator declares, lists and clears flow limits, and reads why a
	// job waits; the worker's sweeper keeps the keys' state, and the
	// writer's dispatch triggers and enqueue give jobs a key.
	require.NoError(t, a.SetFlowLimit(ctx, admin.FlowLimit{Queue: "roles", Concurrency: 1, Rate: 5, Per: time.Second}))
	limits, err := a.FlowLimits(ctx, "roles")
	require.NoError(t, err)
	require.Len(t, limits, 1)
	var keyed int64
	require.NoError(t, writer.QueryRow(ctx, "SELECT "+enqueue+"('record', queue => 'roles', run_at => now() + interval '1 hour', flow_key => 'acme')").Scan(&keyed))
	j, err := a.Get(ctx, keyed)
	require.NoError(t, err)
	_, err = a.FlowWait(ctx, j)
	require.NoError(t, err)
	removed, err := a.ClearFlowLimit(ctx, "roles", "")
	require.NoError(t, err)
	require.True(t, removed)
	// By hand too: the table's trigger keeps the queue's row, which the
	// operator may not write.
	requireAllowed(t, operator, "INSERT INTO "+pgx.Identifier{b.schema, "flow_limits"}.Sanitize()+" (queue, concurrency) VALUES ('roles-hand', 1)")
	var handLimited bool
	require.NoError(t, operator.QueryRow(ctx, "SELECT limited FROM "+pgx.Identifier{b.schema, "queues"}.Sanitize()+" WHERE name = 'roles-hand'").Scan(&handLimited))
	require.True(t, handLimited, "a limit the operator inserted by hand limits its queue")
	requireAllowed(t, operator, "DELETE FROM "+pgx.Identifier{b.schema, "flow_limits"}.Sanitize()+" WHERE queue = 'roles-hand'")
	requireAllowed(t, worker, "INSERT INTO "+pgx.Identifier{b.schema, "flow_keys"}.Sanitize()+" (queue, key) VALUES ('roles', 'acme') "+
		"ON CONFLICT DO NOTHING; SELECT FROM "+pgx.Identifier{b.schema, "flow_limits"}.Sanitize())
	sw, err := sweeper.New(sweeper.Config{Pool: worker, Schema: b.schema})
	require.NoError(t, err)
	_, err = sw.Sweep(ctx)
	require.NoError(t, err)
	for _, sql := range []string{
		"SELECT " + pgx.Identifier{b.schema, "set_flow_limit"}.Sanitize() + "('q')",
		"INSERT INTO " + pgx.Identifier{b.schema, "flow_limits"}.Sanitize() + " (queue) VALUES ('q')",
	} {
		requireDenied(t, worker, sql)
		requireDenied(t, writer, sql)
	}
	requireDenied(t, operator, "DELETE FROM "+pgx.Identifier{b.schema, "flow_keys"}.Sanitize())

	// The worker keeps the endpoints' circuits: it counts, opens, probes
	// and closes; the operator lists them; the writer reads none.
	const ep = "http://roles.example:80"
	endpointsTable := pgx.Identifier{b.schema, "endpoints"}.Sanitize()
	br, err := endpoints.New(endpoints.Config{DB: worker, Schema: b.schema, MinAttempts: 1, FailureRatio: 1, CoolDown: time.Hour})
	require.NoError(t, err)
	require.NoError(t, br.Load(ctx))
	br.Record(ep, true, "HTTP 503")
	require.NoError(t, br.Flush(ctx))
	require.Equal(t, "open", br.State(ep))
	_, err = pgtest.Pool(t).Exec(ctx, "UPDATE "+endpointsTable+" SET open_until = now()")
	require.NoError(t, err)
	require.NoError(t, br.Load(ctx))
	probe := br.Admit(ctx, ep, time.Minute)
	require.True(t, probe.Probe)
	require.NoError(t, br.ProbeDone(ctx, ep, probe, false, ""))
	require.Equal(t, "closed", br.State(ep))
	eps, err := a.Endpoints(ctx)
	require.NoError(t, err)
	require.Len(t, eps, 1)
	requireDenied(t, operator, "UPDATE "+endpointsTable+" SET state = 'open'")
	requireDenied(t, writer, "SELECT * FROM "+endpointsTable)

	// The breaker's events, and their jobs, are the worker's to write and
	// report; the operator disables, enables and notes an endpoint, with
	// its event and job, through the functions only, and reads the events;
	// the writer does neither.
	eventsTable := pgx.Identifier{b.schema, "endpoint_events"}.Sanitize()
	evBreaker, err := endpoints.New(endpoints.Config{
		DB: worker, Schema: b.schema, MinAttempts: 1, FailureRatio: 1,
		CoolDown: time.Hour, EventKind: "noop",
	})
	require.NoError(t, err)
	evBreaker.Record("http://events.example:80", true, "HTTP 503")
	require.NoError(t, evBreaker.Flush(ctx))
	require.NoError(t, evBreaker.Report(ctx))
	changed, err := a.DisableEndpoint(ctx, ep, "ask ops", admin.EventJob{Kind: "noop"})
	require.NoError(t, err)
	require.True(t, changed)
	require.NoError(t, a.SetEndpointNote(ctx, ep, "still asking"))
	changed, err = a.EnableEndpoint(ctx, ep, admin.EventJob{})
	require.NoError(t, err)
	require.True(t, changed)
	evs, err := a.EndpointEvents(ctx, "", 10)
	require.NoError(t, err)
	require.Len(t, evs, 5) // opened and closed above, opened, disabled, enabled
	requireDenied(t, operator, "INSERT INTO "+eventsTable+" (endpoint, event, actor) VALUES ('http://x:80', 'opened', 'breaker')")
	requireDenied(t, operator, "SELECT "+pgx.Identifier{b.schema, "endpoint_event"}.Sanitize()+
		"('http://x:80', 'opened', 'breaker', NULL, NULL, 'noop', NULL, NULL)")
	requireDenied(t, writer, "SELECT * FROM "+eventsTable)
	requireDenied(t, writer, "SELECT "+pgx.Identifier{b.schema, "disable_endpoint"}.Sanitize()+"('http://x:80')")
	requireDenied(t, worker, "SELECT "+pgx.Identifier{b.schema, "disable_endpoint"}.Sanitize()+"('http://x:80')")

	// The operator rotates the signing secrets and lists them without
	// reading one; the worker reads them (it did at start, with
	// SigningKeys); no one else reads them.
	secrets := pgx.Identifier{b.schema, "signing_secrets"}.Sanitize()
	rotation, err := a.RotateSigningSecret(ctx, signing.Generate(), time.Hour)
	require.NoError(t, err)
	listed, err := a.SigningSecrets(ctx)
	require.NoError(t, err)
	require.Equal(t, rotation.ID, listed[len(listed)-1].ID)
	requireAllowed(t, worker, "SELECT secret FROM "+secrets)
	requireDenied(t, operator, "SELECT secret FROM "+secrets)
	requireDenied(t, operator, "SELECT * FROM "+secrets)
	requireDenied(t, writer, "SELECT secret FROM "+secrets)
	requireDenied(t, writer, "SELECT id FROM "+secrets)
	for _, db := range []*pgxpool.Pool{worker, writer} {
		_, err := admin.New(db, b.schema, 10*time.Second).RotateSigningSecret(ctx, signing.Generate(), 0)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, "42501", pgErr.Code)
	}

	// The operator declares a schedule, which the worker fires as its own
	// role; the operator pauses, resumes, lists and removes it.
	created, err := a.Declare(ctx, admin.ScheduleSpec{Name: "roles", Every: time.Second, Kind: "record"})
	require.NoError(t, err)
	require.True(t, created)
	b.waitScheduled(t, "roles", 1, waitFor)
	for _, f := range []func(context.Context, string) (bool, error){a.PauseSchedule, a.ResumeSchedule} {
		changed, err := f(ctx, "roles")
		require.NoError(t, err)
		require.True(t, changed)
	}
	schedules, err := a.Schedules(ctx)
	require.NoError(t, err)
	require.Len(t, schedules, 1)
	found, err := a.Unschedule(ctx, "roles")
	require.NoError(t, err)
	require.True(t, found)
	for _, sql := range []string{
		"INSERT INTO " + pgx.Identifier{b.schema, "schedules"}.Sanitize() + " (name, cron, kind) VALUES ('w', '@daily', 'record')",
		"DELETE FROM " + pgx.Identifier{b.schema, "schedules"}.Sanitize(),
		// What a schedule's jobs are, and whether it runs, are the
		// operator's: else the worker makes any job it likes through
		// insert_scheduled_jobs().
		"UPDATE " + pgx.Identifier{b.schema, "schedules"}.Sanitize() + " SET kind = 'http_callback', payload = '{}'",
		"UPDATE " + pgx.Identifier{b.schema, "schedules"}.Sanitize() + " SET enabled = true",
	} {
		requireDenied(t, worker, sql)
	}
	requireDenied(t, writer, "SELECT * FROM "+pgx.Identifier{b.schema, "schedules"}.Sanitize())
	requireDenied(t, operator, "SELECT "+pgx.Identifier{b.schema, "insert_scheduled_jobs"}.Sanitize()+"('{}', '{}')")
	requireDenied(t, operator, "SELECT * FROM "+pgx.Identifier{b.schema, "fire_schedule_slots"}.Sanitize()+"('{}', '{}')")
	requireDenied(t, writer, "SELECT * FROM "+pgx.Identifier{b.schema, "fire_schedule_slots"}.Sanitize()+"('{}', '{}')")

	orders := pgx.Identifier{b.schema, "orders"}.Sanitize()
	requireAllowed(t, pgtest.Pool(t), "CREATE TABLE "+orders+" (id int); "+
		"GRANT TRIGGER ON "+orders+" TO "+pgx.Identifier{r.operator}.Sanitize()+"; "+
		"GRANT INSERT ON "+orders+" TO "+pgx.Identifier{r.writer}.Sanitize())
	name, created, err := triggers.Add(ctx, operator, b.schema, triggers.Spec{
		Table: orders, Events: []string{"insert"}, Kind: "record",
	})
	require.NoError(t, err)
	require.True(t, created)
	_, err = triggers.List(ctx, operator, b.schema)
	require.NoError(t, err)
	requireAllowed(t, writer, "INSERT INTO "+orders+" VALUES (42)") // the trigger enqueues as the writer
	// DROP TRIGGER is the table owner's alone, whatever the grants.
	err = triggers.Remove(ctx, operator, b.schema, name, time.Second)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "42501", pgErr.Code)
	require.NoError(t, triggers.Remove(ctx, pgtest.Pool(t), b.schema, name, time.Second))
	for _, sql := range []string{
		"INSERT INTO " + jobs + " (kind) VALUES ('record')",
		"DELETE FROM " + jobs,
		"SELECT " + enqueue + "('record')",
	} {
		requireDenied(t, operator, sql)
	}
}

// A writer cannot take a schedule's slots: the dedup_keys that begin with
// schedule: are the schedules', and a writer's INSERT or enqueue of one is
// refused, even with the setting the workers' function runs under set in
// its own session, and so is an UPDATE that gives a job such a key. The
// slot then gets the schedule's own job. The writer may INSERT into jobs,
// every column of it, and call enqueue() and enqueue_checked().
func TestScheduleKeysAreReserved(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b := setupUnwatched(t)
	r := createRoles(t)
	schema := pgx.Identifier{b.schema}.Sanitize()
	writerRole, operatorRole := pgx.Identifier{r.writer}.Sanitize(), pgx.Identifier{r.operator}.Sanitize()
	requireAllowed(t, pgtest.Pool(t), "GRANT USAGE ON SCHEMA "+schema+" TO "+writerRole+", "+operatorRole+"; "+
		"GRANT INSERT ON "+b.jobs+" TO "+writerRole+"; "+
		"GRANT EXECUTE ON FUNCTION "+schema+".enqueue(text, jsonb, text, timestamptz, smallint, text, integer, text, text, text), "+
		schema+".enqueue_checked(text, jsonb, text, timestamptz, smallint, text, integer, text, text, text) TO "+writerRole+"; "+
		"GRANT SELECT, UPDATE ON "+b.jobs+" TO "+operatorRole)
	writer, operator := rolePool(t, r.writer), rolePool(t, r.operator)

	b.declare(t, `'tick', NULL, 'record', every => '1 hour', payload => '{"from": "the schedule"}'`)
	slot := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	b.exec(t, "UPDATE "+pgx.Identifier{b.schema, "schedules"}.Sanitize()+" SET next_run_at = $1", slot)
	key := "schedule:tick:2030-01-01T00:00:00Z"
	enqueue, checked := pgx.Identifier{b.schema, "enqueue"}.Sanitize(), pgx.Identifier{b.schema, "enqueue_checked"}.Sanitize()

	refused := func(db *pgxpool.Pool, firing bool, sql string, args ...any) {
		t.Helper()
		tx, err := db.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx) //nolint:errcheck // refused: nothing to keep
		if firing {
			_, err = tx.Exec(ctx, "SELECT set_config('pgdispatch.firing', 'on', true), set_config('pgdispatch.scheduling', 'on', true)")
			require.NoError(t, err)
		}
		_, err = tx.Exec(ctx, sql, args...)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, sql)
		require.Equal(t, "42501", pgErr.Code, "%s: %v", sql, err)
		require.Contains(t, pgErr.Message, `dedup_key "`+key+`" is reserved for the schedules' jobs`)
	}
	evil := `{"from": "the writer"}`
	for _, firing := range []bool{false, true} {
		refused(writer, firing, "INSERT INTO "+b.jobs+" (kind, payload, run_at, dedup_key) VALUES ('record', $1, $2, $3)", evil, slot, key)
		refused(writer, firing, "INSERT INTO "+b.jobs+" (kind, payload, run_at, dedup_key) VALUES ('record', $1, $2, $3) ON CONFLICT DO NOTHING", evil, slot, key)
		refused(writer, firing, "SELECT "+enqueue+"('record', $1, run_at => $2, dedup_key => $3)", evil, slot, key)
		refused(writer, firing, "SELECT * FROM "+checked+"('record', $1, run_at => $2, dedup_key => $3)", evil, slot, key)
	}
	// The operator, who may update jobs, cannot move one onto the key.
	var id int64
	require.NoError(t, writer.QueryRow(ctx, "SELECT "+enqueue+"('record', $1, run_at => $2, dedup_key => 'mine')", evil, slot).Scan(&id))
	for _, firing := range []bool{false, true} {
		refused(operator, firing, "UPDATE "+b.jobs+" SET dedup_key = $1 WHERE id = $2", key, id)
	}

	// The slot gets the schedule's job.
	s, err := schedule.New(schedule.Config{Pool: pgtest.Pool(t), Schema: b.schema, Now: func() time.Time { return slot.Add(time.Minute) }})
	require.NoError(t, err)
	res, err := s.Pass(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, res.Created)
	var payload string
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "SELECT payload::text FROM "+b.jobs+" WHERE dedup_key = $1", key).Scan(&payload))
	require.JSONEq(t, `{"from": "the schedule"}`, payload)
}
