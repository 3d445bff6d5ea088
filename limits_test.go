package pgdispatch_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

// No row a writer can insert stops its queue. A job whose attempts were
// 2^31-1 made every claim of the queue fail with "integer out of range"
// (the claim writes attempts + 1), so a good job behind it never ran. It is
// refused at INSERT, by the constraint that names the column.
func TestHugeAttemptsDoNotStopTheQueue(t *testing.T) {
	t.Parallel()
	b := setup(t)
	start(t, b.config(t, "w-hostile"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	// First in the queue's order, so that every claim meets it.
	_, hostile := pgtest.Pool(t).Exec(ctx, "INSERT INTO "+b.jobs+" (kind, attempts, priority) VALUES ('record', 2147483647, -1)")
	good := b.insert(t, "INSERT INTO "+b.jobs+" (kind) VALUES ('record') RETURNING id")
	b.watch.Status(t, good, "done", waitFor)

	var pgErr *pgconn.PgError
	require.ErrorAs(t, hostile, &pgErr, "the row is refused at INSERT")
	require.Equal(t, "jobs_attempts_check", pgErr.ConstraintName)
}
