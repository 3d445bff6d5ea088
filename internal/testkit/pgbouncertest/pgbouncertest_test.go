package pgbouncertest_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/internal/testkit/pgbouncertest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { pgtest.MainNoLeaks(m) }

// The bouncer pools transactions as a default install does: it refuses
// startup parameters it does not know, and a statement prepared in one
// transaction is gone in the next, while one described and run unnamed works.
func TestTransactionPooling(t *testing.T) {
	t.Parallel()
	b := pgbouncertest.Start(t, pgtest.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	cfg, err := pgx.ParseConfig(b.URL())
	require.NoError(t, err)
	cfg.RuntimeParams["statement_timeout"] = "1000"
	_, err = pgx.ConnectConfig(ctx, cfg)
	require.ErrorContains(t, err, "unsupported startup parameter: statement_timeout")

	// Client a prepares a statement on the only server connection, which b
	// then keeps in a transaction: a's next call runs on another one.
	a, err := pgx.Connect(ctx, b.URL())
	require.NoError(t, err)
	defer func() { require.NoError(t, a.Close(ctx)) }()
	holder, err := pgx.Connect(ctx, b.URL())
	require.NoError(t, err)
	defer func() { require.NoError(t, holder.Close(ctx)) }()

	var first, second int
	require.NoError(t, a.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&first))
	tx, err := holder.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, tx.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&second))
	require.Equal(t, first, second, "b holds the server connection a prepared on")

	err = a.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&second)
	require.ErrorContains(t, err, "does not exist", "pgx's default mode prepares named statements")

	// Described and run unnamed, in one round trip once described, as
	// pgdispatch's pool does behind a pooler; with an array argument.
	var got []int64
	require.NoError(t, a.QueryRow(ctx, "SELECT $1::int8[] || pg_backend_pid()::int8",
		pgx.QueryExecModeCacheDescribe, []int64{1, 2}).Scan(&got))
	require.Len(t, got, 3)
	require.NotEqual(t, first, int(got[2]), "a ran on another server connection")
	require.NoError(t, tx.Rollback(ctx))
}
