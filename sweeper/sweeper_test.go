package sweeper_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/wait"
	"github.com/pgdispatch/pgdispatch/sweeper"
)

func TestMain(m *testing.M) { pgtest.MainNoLeaks(m) }

func TestSweep(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.Schema(t)
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	pool := pgtest.Pool(t)
	_, err := pool.Exec(ctx, `INSERT INTO `+jobs+` (kind, status, attempts, max_attempts, locked_by, locked_until, finished_at) VALUES
		('expired',   'running', 1, 3,    'w1', now() - interval '1 second', NULL),
		('exhausted', 'running', 3, 3,    'w1', now() - interval '1 second', NULL),
		('default',   'running', 5, NULL, 'w1', now() - interval '1 second', NULL),
		('live',      'running', 1, 3,    'w2', now() + interval '1 minute', NULL),
		('old_done',  'done',    1, 3,    NULL, NULL, now() - interval '2 days'),
		('new_done',  'done',    1, 3,    NULL, NULL, now() - interval '1 hour'),
		('old_dead',  'dead',    3, 3,    NULL, NULL, now() - interval '8 days'),
		('cancelled', 'cancelled', 0, 3,  NULL, NULL, now() - interval '8 days'),
		('new_dead',  'dead',    3, 3,    NULL, NULL, now() - interval '1 day')`)
	require.NoError(t, err)

	s, err := sweeper.New(sweeper.Config{Pool: pool, Schema: schema})
	require.NoError(t, err)
	sweeper.SetBatchSize(s, 2)
	res, err := s.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, sweeper.Result{Locked: true, Rescued: 1, Killed: 2, Purged: 3}, res)

	rows, err := pool.Query(ctx, "SELECT kind, status, locked_by IS NULL, coalesce(last_error, '') FROM "+jobs+" ORDER BY id")
	require.NoError(t, err)
	type row struct {
		Kind, Status string
		Unlocked     bool
		Error        string
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	require.NoError(t, err)
	require.Len(t, got, 6)
	require.Equal(t, row{"expired", "pending", true, "lease expired: worker w1 stopped renewing it during attempt 1 of 3"}, got[0])
	require.Equal(t, "dead", got[1].Status)
	require.Equal(t, "dead", got[2].Status, "max_attempts NULL means the default 5")
	require.Equal(t, row{"live", "running", false, ""}, got[3])
	require.Equal(t, "new_done", got[4].Kind)
	require.Equal(t, "new_dead", got[5].Kind)
}

// While one sweeper holds the schema's lock, another does nothing.
func TestOneSweeperAtATime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.Schema(t)
	tx, err := pgtest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	var locked bool
	require.NoError(t, tx.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock(hashtext('pgdispatch.sweeper'), hashtext($1))", schema).Scan(&locked))
	require.True(t, locked)

	s, err := sweeper.New(sweeper.Config{Pool: pgtest.Pool(t), Schema: schema})
	require.NoError(t, err)
	res, err := s.Sweep(ctx)
	require.NoError(t, err)
	require.False(t, res.Locked)

	// Another schema's sweeper is not blocked by this one.
	other, err := sweeper.New(sweeper.Config{Pool: pgtest.Pool(t), Schema: pgtest.Schema(t)})
	require.NoError(t, err)
	res, err = other.Sweep(ctx)
	require.NoError(t, err)
	require.True(t, res.Locked)
}

func TestRunStopsWithContext(t *testing.T) {
	t.Parallel()
	s, err := sweeper.New(sweeper.Config{Pool: pgtest.Pool(t), Schema: pgtest.Schema(t), Interval: time.Hour})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()
	cancel()
	require.NoError(t, <-done)
}

// After every connection of its pool was terminated, the sweeper goes
// through the dead ones at once and rescues the expired lease in the same
// pass; it used to wait a whole Interval (an hour here) after meeting the
// first.
func TestRunSkipsDeadConnections(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schema := pgtest.Schema(t)
	const poolSize = 4
	pool, app := pgtest.UnpingedPool(ctx, t, poolSize)
	pgtest.FillPool(ctx, t, pool)
	require.Equal(t, poolSize, pgtest.TerminateApp(ctx, t, app))
	_, err := pgtest.Pool(t).Exec(ctx, `INSERT INTO `+pgx.Identifier{schema, "jobs"}.Sanitize()+
		` (kind, status, attempts, locked_by, locked_until) VALUES ('expired', 'running', 1, 'w1', now() - interval '1 second')`)
	require.NoError(t, err)

	s, err := sweeper.New(sweeper.Config{Pool: pool, Schema: schema, Interval: time.Hour})
	require.NoError(t, err)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error)
	go func() { done <- s.Run(runCtx) }()
	defer func() {
		stop()
		require.NoError(t, <-done)
	}()
	wait.For(t, 30*time.Second, "the expired lease to be rescued before the next Interval", func() bool { return s.Stats().Rescued == 1 })
}

// An attempt lost with its worker leaves its entry in errors, as a failed
// one does: a job whose two attempts were both lost ends dead with two
// entries, each naming its attempt, its start (the claim), its worker and
// what happened.
func TestLostAttemptsEnterErrors(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.Schema(t)
	jobs := pgx.Identifier{schema, "jobs"}.Sanitize()
	pool := pgtest.Pool(t)
	s, err := sweeper.New(sweeper.Config{Pool: pool, Schema: schema})
	require.NoError(t, err)

	var id int64
	require.NoError(t, pool.QueryRow(ctx, `INSERT INTO `+jobs+` (kind, max_attempts) VALUES ('lost', 2) RETURNING id`).Scan(&id))
	// claim stands for a claim of worker w whose lease has already expired.
	claim := func(w string) {
		t.Helper()
		_, err := pool.Exec(ctx, `UPDATE `+jobs+` SET status = 'running', attempts = attempts + 1, locked_by = $2,
			locked_until = now() - interval '1 second', updated_at = now() - interval '1 minute' WHERE id = $1`, id, w)
		require.NoError(t, err)
	}
	claim("w1")
	res, err := s.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Rescued)
	claim("w2")
	res, err = s.Sweep(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), res.Killed)

	type entry struct {
		Attempt    int        `json:"attempt"`
		StartedAt  *time.Time `json:"started_at"`
		FinishedAt *time.Time `json:"finished_at"`
		Worker     string     `json:"worker"`
		Error      string     `json:"error"`
	}
	var (
		status   string
		attempts int
		lastErr  string
		entries  []entry
	)
	require.NoError(t, pool.QueryRow(ctx, `SELECT status, attempts, last_error, coalesce(errors, '[]') FROM `+jobs+` WHERE id = $1`, id).
		Scan(&status, &attempts, &lastErr, &entries))
	require.Equal(t, "dead", status)
	require.Equal(t, 2, attempts)
	require.Len(t, entries, 2, "one entry per lost attempt")
	for i, e := range entries {
		w := []string{"w1", "w2"}[i]
		require.Equal(t, i+1, e.Attempt)
		require.Equal(t, w, e.Worker)
		require.Equal(t, "lease expired: worker "+w+" stopped renewing it during attempt "+[]string{"1", "2"}[i]+" of 2", e.Error)
		require.NotNil(t, e.StartedAt, "the claim's time is the attempt's start")
		require.NotNil(t, e.FinishedAt)
		require.True(t, e.StartedAt.Before(*e.FinishedAt))
	}
	require.Equal(t, entries[1].Error, lastErr)
}

// A pass deletes the flow_keys rows no longer needed, in batches: those of
// keys with no pending or running job whose newest start is older than the
// largest per of the queue's limits, or that have no start. A row a claim
// holds is left for a later pass.
func TestSweepForgetsFlowKeys(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schema := pgtest.Schema(t)
	s := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	pool := pgtest.Pool(t)
	_, err := pool.Exec(ctx, `SELECT `+s("set_flow_limit")+`('q', rate => 10, per => '1 minute');
		SELECT `+s("set_flow_limit")+`('q', 'slow', rate => 1, per => '1 hour');
		SELECT `+s("set_flow_limit")+`('other', concurrency => 1);
		INSERT INTO `+s("jobs")+` (kind, queue, flow_key, status) VALUES
			('noop', 'q', 'pending', 'pending'), ('noop', 'q', 'running', 'running'), ('noop', 'q', 'done', 'done');
		INSERT INTO `+s("flow_keys")+` (queue, key, starts) VALUES
			('q', 'pending', '{}'), ('q', 'running', '{}'), ('q', 'done', '{}'),
			('q', 'recent', ARRAY[now() - interval '2 hours', now() - interval '30 minutes']),
			('q', 'old', ARRAY[now() - interval '2 hours']),
			('q', 'locked', '{}'),
			('other', 'a', ARRAY[now()]), ('other', 'b', '{}')`)
	require.NoError(t, err)

	// A claim holds the key locked.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit, nothing
	_, err = tx.Exec(ctx, "SELECT FROM "+s("flow_keys")+" WHERE queue = 'q' AND key = 'locked' FOR NO KEY UPDATE")
	require.NoError(t, err)

	sw, err := sweeper.New(sweeper.Config{Pool: pool, Schema: schema})
	require.NoError(t, err)
	sweeper.SetBatchSize(sw, 2)
	res, err := sw.Sweep(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 4, res.FlowKeys, "done and old of q, a and b of other (no rate: the starts do not matter)")
	keys := func() []string {
		var out []string
		rows, err := pool.Query(ctx, "SELECT queue || '/' || key FROM "+s("flow_keys")+" ORDER BY 1")
		require.NoError(t, err)
		out, err = pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return out
	}
	require.Equal(t, []string{"q/locked", "q/pending", "q/recent", "q/running"}, keys(),
		"recent started within the largest per of q (1 hour)")

	require.NoError(t, tx.Rollback(ctx))
	res, err = sw.Sweep(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, res.FlowKeys)
	require.Equal(t, []string{"q/pending", "q/recent", "q/running"}, keys())
}

// A pass deletes the endpoints closed and not written for EndpointIdle,
// in batches: not one written since, nor one open, nor one a worker's
// flush holds, nor one an operator disabled or noted.
func TestSweepForgetsIdleEndpoints(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schema := pgtest.Schema(t)
	e := pgx.Identifier{schema, "endpoints"}.Sanitize()
	pool := pgtest.Pool(t)
	_, err := pool.Exec(ctx, `INSERT INTO `+e+` (endpoint, state, open_until, updated_at) VALUES
		('http://idle-a:80', 'closed', NULL, now() - interval '25 hours'),
		('http://idle-b:80', 'closed', NULL, now() - interval '25 hours'),
		('http://idle-c:80', 'closed', NULL, now() - interval '25 hours'),
		('http://locked:80', 'closed', NULL, now() - interval '25 hours'),
		('http://recent:80', 'closed', NULL, now() - interval '23 hours'),
		('http://down:80', 'open', now() + interval '1 hour', now() - interval '25 hours')`)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `INSERT INTO `+e+` (endpoint, state, updated_at, disabled_at, disabled_by, note) VALUES
		('http://disabled:80', 'closed', now() - interval '25 hours', now() - interval '25 hours', 'operator', NULL),
		('http://noted:80', 'closed', now() - interval '25 hours', NULL, NULL, 'ours: ask ops')`)
	require.NoError(t, err)

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit, nothing
	_, err = tx.Exec(ctx, "SELECT FROM "+e+" WHERE endpoint = 'http://locked:80' FOR UPDATE")
	require.NoError(t, err)

	sw, err := sweeper.New(sweeper.Config{Pool: pool, Schema: schema})
	require.NoError(t, err)
	sweeper.SetBatchSize(sw, 2)
	res, err := sw.Sweep(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 3, res.Endpoints)
	require.Equal(t, []string{"http://disabled:80", "http://down:80", "http://locked:80", "http://noted:80", "http://recent:80"},
		endpointsLeft(ctx, t, e))
}

// endpointsLeft is the endpoints in table e, in order.
func endpointsLeft(ctx context.Context, t *testing.T, e string) []string {
	t.Helper()
	rows, err := pgtest.Pool(t).Query(ctx, "SELECT endpoint FROM "+e+" ORDER BY 1")
	require.NoError(t, err)
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return left
}

// A pass deletes the endpoints' events older than RetainDead, in batches,
// and keeps the newer ones.
func TestSweepPurgesOldEndpointEvents(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schema := pgtest.Schema(t)
	events := pgx.Identifier{schema, "endpoint_events"}.Sanitize()
	pool := pgtest.Pool(t)
	_, err := pool.Exec(ctx, `INSERT INTO `+events+` (endpoint, event, actor, at) VALUES
		('http://a:80', 'opened', 'breaker', now() - interval '49 hours'),
		('http://a:80', 'closed', 'breaker', now() - interval '49 hours'),
		('http://a:80', 'disabled', 'operator', now() - interval '49 hours'),
		('http://a:80', 'enabled', 'operator', now() - interval '47 hours')`)
	require.NoError(t, err)

	sw, err := sweeper.New(sweeper.Config{Pool: pool, Schema: schema, RetainDead: 48 * time.Hour})
	require.NoError(t, err)
	sweeper.SetBatchSize(sw, 2)
	res, err := sw.Sweep(ctx) // two batches, the first full
	require.NoError(t, err)
	require.EqualValues(t, 3, res.Events)
	rows, err := pool.Query(ctx, "SELECT event FROM "+events)
	require.NoError(t, err)
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"enabled"}, left)
}

// An open endpoint whose cool-down ended EndpointIdle ago, and a
// half-open one whose probe's time did, are deleted too: no job has asked
// for them since (a job that asks takes the probe, which writes the row),
// and a writer's URLs that failed would otherwise stay in the table, and
// in every worker's reads of the endpoints not closed, for ever.
func TestSweepForgetsAbandonedOpenEndpoints(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	schema := pgtest.Schema(t)
	e := pgx.Identifier{schema, "endpoints"}.Sanitize()
	_, err := pgtest.Pool(t).Exec(ctx, `INSERT INTO `+e+` (endpoint, state, opened_at, open_until, probe_until, updated_at) VALUES
		('http://gone:80', 'open', now() - interval '26 hours', now() - interval '25 hours', NULL, now() - interval '26 hours'),
		('http://gone-probe:80', 'half_open', now() - interval '27 hours', NULL, now() - interval '25 hours', now() - interval '26 hours'),
		('http://down:80', 'open', now() - interval '26 hours', now() + interval '1 hour', NULL, now() - interval '26 hours'),
		('http://ended:80', 'open', now() - interval '26 hours', now() - interval '23 hours', NULL, now() - interval '26 hours'),
		('http://probing:80', 'half_open', now() - interval '26 hours', NULL, now() + interval '1 hour', now() - interval '26 hours')`)
	require.NoError(t, err)
	_, err = pgtest.Pool(t).Exec(ctx, `INSERT INTO `+e+` (endpoint, state, opened_at, open_until, updated_at, disabled_at, disabled_by) VALUES
		('http://gone-disabled:80', 'open', now() - interval '26 hours', now() - interval '25 hours', now() - interval '26 hours',
		 now() - interval '26 hours', 'breaker')`)
	require.NoError(t, err)

	sw, err := sweeper.New(sweeper.Config{Pool: pgtest.Pool(t), Schema: schema})
	require.NoError(t, err)
	res, err := sw.Sweep(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, res.Endpoints)
	require.Equal(t, []string{"http://down:80", "http://ended:80", "http://gone-disabled:80", "http://probing:80"},
		endpointsLeft(ctx, t, e), "a disabled endpoint is the operator's")
}
