package pgdispatch_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgcluster"
)

// A transaction that sent NOTIFY cannot be prepared, and the trigger sends
// one while a worker sleeps. A two-phase-commit writer turns it off with
// pgdispatch.notify, and calls wake() once the transaction is committed.
func TestTwoPhaseCommitWriter(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cluster, err := pgcluster.Start(ctx, pgcluster.Options{Settings: []string{"max_prepared_transactions=2"}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cluster.Stop() })
	pool, err := pgxpool.New(ctx, cluster.URL())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, pgdispatch.Migrate(ctx, pool, pgdispatch.DefaultSchema))

	b := &bundle{rec: newRecorder(), registry: executors.NewRegistry()}
	b.registry.Register("record", b.rec)
	cfg := b.config(t, "w")
	cfg.Pool, cfg.Schema = pool, pgdispatch.DefaultSchema
	w, _, _ := start(t, cfg)
	b.waitAsleep(t, w)

	writer, err := pgx.Connect(ctx, cluster.URL())
	require.NoError(t, err)
	defer func() { _ = writer.Close(context.Background()) }()
	exec := func(sql string) error {
		_, err := writer.Exec(ctx, sql)
		return err
	}

	// As is, PREPARE fails while a worker sleeps.
	require.NoError(t, exec("BEGIN"))
	require.NoError(t, exec("INSERT INTO pgdispatch.jobs (kind) VALUES ('record')"))
	err = exec("PREPARE TRANSACTION 'plain'")
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Contains(t, pgErr.Message, "NOTIFY")

	// With NOTIFY off, it prepares; wake() after the commit starts the job.
	require.NoError(t, exec("BEGIN"))
	require.NoError(t, exec("SET LOCAL pgdispatch.notify = off"))
	var id int64
	require.NoError(t, writer.QueryRow(ctx, "INSERT INTO pgdispatch.jobs (kind) VALUES ('record') RETURNING id").Scan(&id))
	require.NoError(t, exec("PREPARE TRANSACTION 'quiet'"))
	require.NoError(t, exec("COMMIT PREPARED 'quiet'"))
	require.NoError(t, exec("SELECT pgdispatch.wake('default')"))
	b.rec.waitStart(t, id, 5*time.Second)
	require.Zero(t, w.Claimer(pgdispatch.DefaultQueue).Stats().TickHits)
}
