package pgdispatch_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/migrations"
)

// A writer of the table can take a dedup key before the application uses
// it, with a job of its own that is due in the year 9998: the application's
// enqueue then creates nothing. EnqueueChecked says so (Conflict), and the
// SQL enqueue() that returns only the id raises a NOTICE; the same job
// asked for again is no conflict.
func TestEnqueueReportsASquattedDedupKey(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	schema := pgtest.Schema(t)
	s := pgdispatch.Schema(schema)
	pool := pgtest.Pool(t)
	var squatted int64
	require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+pgx.Identifier{schema, "jobs"}.Sanitize()+
		" (kind, dedup_key, run_at) VALUES ('noop', 'order-42-paid', '9998-01-01') RETURNING id").Scan(&squatted))

	job := pgdispatch.Job{Kind: "noop", Payload: map[string]int{"order": 42}, DedupKey: "order-42-paid"}
	e, err := s.EnqueueChecked(ctx, pool, job)
	require.NoError(t, err)
	require.Equal(t, pgdispatch.Enqueued{ID: squatted, Created: false, Conflict: true}, e)

	// The bigint enqueue() is unchanged for its callers, and tells them in a notice.
	var notices []*pgconn.Notice
	cfg, err := pgx.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { notices = append(notices, n) }
	noticed, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = noticed.Close(context.Background())
		<-noticed.PgConn().CleanupDone()
	})
	var id int64
	require.NoError(t, noticed.QueryRow(ctx, "SELECT "+pgx.Identifier{schema, "enqueue"}.Sanitize()+
		"('noop', '{\"order\": 42}', dedup_key => 'order-42-paid')").Scan(&id))
	require.Equal(t, squatted, id)
	require.Len(t, notices, 1)
	require.Contains(t, notices[0].Message, "dedup_key order-42-paid is held by job")
	require.Contains(t, notices[0].Message, "(payload, a later run_at)")

	// The application's own job, enqueued twice, is created once and no conflict.
	job.DedupKey = "order-43-paid"
	job.RunAt = time.Now().Add(time.Hour)
	first, err := s.EnqueueChecked(ctx, pool, job)
	require.NoError(t, err)
	require.True(t, first.Created)
	require.False(t, first.Conflict)
	job.RunAt = job.RunAt.Add(time.Minute)
	again, err := s.EnqueueChecked(ctx, pool, job)
	require.NoError(t, err)
	require.Equal(t, pgdispatch.Enqueued{ID: first.ID, Created: false, Conflict: false}, again)
	id, err = s.Enqueue(ctx, pool, job)
	require.NoError(t, err)
	require.Equal(t, first.ID, id)

	_, err = s.Enqueue(ctx, pool, pgdispatch.Job{Kind: "noop", MaxAttempts: 1 << 31})
	require.ErrorContains(t, err, "MaxAttempts 2147483648: must be from 0")
}

// loginPool is a pool whose sessions log in as role, which the test makes a
// login role with a password of its own: enqueue_checked knows its caller
// by the role that logged in.
func loginPool(t *testing.T, role string) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	password := hex.EncodeToString(b)
	_, err := pgtest.Pool(t).Exec(ctx, "ALTER ROLE "+pgx.Identifier{role}.Sanitize()+" LOGIN PASSWORD '"+password+"'")
	require.NoError(t, err)
	cfg, err := pgxpool.ParseConfig(pgtest.URL())
	require.NoError(t, err)
	cfg.ConnConfig.User = role
	cfg.ConnConfig.Password = password
	cfg.MaxConns = 2
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

// enqueue_checked tells a writer nothing about a job another role created:
// a writer that may only insert (docs/roles.sql) gets the same answer for
// a right and a wrong guess of another writer's payload, and for any
// run_at, so it can neither confirm a PIN nor find the job's run_at by
// bisection; enqueue()'s notice names no field. The writer that created
// the job still learns whether it is the one asked for.
func TestEnqueueCheckedRevealsNothingOfAnotherWritersJob(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schema := pgtest.Schema(t)
	s := pgdispatch.Schema(schema)
	app, other := createRoles(t), createRoles(t)
	applyRolesScript(t, schema, app)
	applyRolesScript(t, schema, other)
	victim, attacker := loginPool(t, app.writer), loginPool(t, other.writer)

	runAt := time.Now().Add(90 * time.Minute).Truncate(time.Microsecond)
	job := pgdispatch.Job{Kind: "noop", Payload: map[string]string{"pin": "4711"}, DedupKey: "reset-42", RunAt: runAt}
	created, err := s.EnqueueChecked(ctx, victim, job)
	require.NoError(t, err)
	require.True(t, created.Created)

	// The creator's own checks still compare.
	again, err := s.EnqueueChecked(ctx, victim, job)
	require.NoError(t, err)
	require.Equal(t, pgdispatch.Enqueued{ID: created.ID, Created: false, Conflict: false}, again)
	wrong := job
	wrong.Payload = map[string]string{"pin": "0000"}
	differs, err := s.EnqueueChecked(ctx, victim, wrong)
	require.NoError(t, err)
	require.True(t, differs.Conflict, "the creator learns that its own job differs")

	// Another writer gets one answer for every guess.
	answers := map[pgdispatch.Enqueued][]string{}
	for _, guess := range []struct {
		name string
		pin  string
		at   time.Time
	}{
		{"right pin, right run_at", "4711", runAt},
		{"wrong pin", "0000", runAt},
		{"right pin, run_at before", "4711", runAt.Add(-time.Minute)},
		{"right pin, run_at after", "4711", runAt.Add(time.Minute)},
		{"right pin, run_at far after", "4711", runAt.Add(24 * time.Hour)},
	} {
		g := job
		g.Payload, g.RunAt = map[string]string{"pin": guess.pin}, guess.at
		e, err := s.EnqueueChecked(ctx, attacker, g)
		require.NoError(t, err)
		answers[e] = append(answers[e], guess.name)
	}
	require.Len(t, answers, 1, "another writer's guesses got different answers: %v", answers)
	for e := range answers {
		require.Equal(t, pgdispatch.Enqueued{ID: created.ID, Created: false, Conflict: true}, e,
			"a key another role holds is a conflict, whatever its job holds")
	}

	// enqueue()'s notice says the key is taken, and nothing of the job.
	var notices []string
	cfg := attacker.Config().ConnConfig.Copy()
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) { notices = append(notices, n.Message) }
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	for _, pin := range []string{"4711", "0000"} {
		_, err := s.Enqueue(ctx, conn, pgdispatch.Job{Kind: "noop", Payload: map[string]string{"pin": pin}, DedupKey: "reset-42", RunAt: runAt})
		require.NoError(t, err)
	}
	require.Len(t, notices, 2)
	require.Equal(t, notices[0], notices[1], "the notice is the same for a right and a wrong guess")
	require.NotContains(t, notices[0], "payload")
	require.NotContains(t, notices[0], "run_at")
}

// Acceptance 6: one dedup_key makes one job, from SQL and from Go.
func TestDedupKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	pool := pgtest.Pool(t)
	fn := pgx.Identifier{b.schema, "enqueue"}.Sanitize()

	first := b.insert(t, "SELECT "+fn+"('record', '{\"a\": 1}', dedup_key => 'order-1')")
	again := b.insert(t, "SELECT "+fn+"('record', '{\"a\": 2}', dedup_key => 'order-1')")
	require.Equal(t, first, again)

	tag, err := pool.Exec(ctx, "INSERT INTO "+b.jobs+" (kind, dedup_key) VALUES ('record', 'order-1') "+
		"ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL DO NOTHING")
	require.NoError(t, err)
	require.Zero(t, tag.RowsAffected())

	s := pgdispatch.Schema(b.schema)
	goID, err := s.Enqueue(ctx, pool, pgdispatch.Job{Kind: "record", DedupKey: "order-2", Payload: map[string]int{"a": 3}})
	require.NoError(t, err)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	goAgain, err := s.Enqueue(ctx, tx, pgdispatch.Job{Kind: "record", DedupKey: "order-2"})
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, goID, goAgain)

	var count int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+b.jobs).Scan(&count))
	require.Equal(t, 2, count)

	// Inside a transaction that rolls back, the job goes with it.
	tx, err = pool.Begin(ctx)
	require.NoError(t, err)
	_, err = s.Enqueue(ctx, tx, pgdispatch.Job{Kind: "record", DedupKey: "order-3"})
	require.NoError(t, err)
	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+b.jobs).Scan(&count))
	require.Equal(t, 2, count)
}

// Enqueue into a schema that is not installed says so, and what to run.
func TestEnqueueIntoAMissingSchema(t *testing.T) {
	t.Parallel()
	_, err := pgdispatch.Schema("no_such_schema").Enqueue(context.Background(), pgtest.Pool(t), pgdispatch.Job{Kind: "noop"})
	require.ErrorIs(t, err, migrations.ErrSchemaMissing)
	require.ErrorContains(t, err, `schema "no_such_schema" is not installed in this database: run 'pgdispatch migrate' first`)
}

// A job's flow key goes into its row, from Go and from SQL, and a job
// holding the dedup key with another flow key is not the one asked for.
func TestEnqueueFlowKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	pool := pgtest.Pool(t)
	s := pgdispatch.Schema(b.schema)

	keyed, err := s.EnqueueChecked(ctx, pool, pgdispatch.Job{Kind: "record", FlowKey: "acme", DedupKey: "k", RunAt: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	require.True(t, keyed.Created)
	plain, err := s.Enqueue(ctx, pool, pgdispatch.Job{Kind: "record", RunAt: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	fromSQL := b.insert(t, "SELECT "+pgx.Identifier{b.schema, "enqueue"}.Sanitize()+"('record', run_at => now() + interval '1 hour', flow_key => 'globex')")
	for id, want := range map[int64]*string{keyed.ID: strPtr("acme"), plain: nil, fromSQL: strPtr("globex")} {
		var got *string
		require.NoError(t, pool.QueryRow(ctx, "SELECT flow_key FROM "+b.jobs+" WHERE id = $1", id).Scan(&got))
		require.Equal(t, want, got, "job %d", id)
	}

	again, err := s.EnqueueChecked(ctx, pool, pgdispatch.Job{Kind: "record", FlowKey: "globex", DedupKey: "k", RunAt: time.Now().Add(time.Hour)})
	require.NoError(t, err)
	require.Equal(t, keyed.ID, again.ID)
	require.True(t, again.Conflict, "another flow key")

	_, err = s.Enqueue(ctx, pool, pgdispatch.Job{Kind: "record", FlowKey: strings.Repeat("k", 257)})
	require.ErrorContains(t, err, "jobs_flow_key_check")
}

func strPtr(s string) *string { return &s }
