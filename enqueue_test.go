package pgdispatch_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
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
