package xidsql_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/internal/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/xidsql"
)

func TestMain(m *testing.M) { pgtest.MainNoLeaks(m) }

// Xid8 gives the status of real transactions, and never fails on a value
// that is no transaction's: one beyond the reference (a MultiXactId read as
// an xid can be) reads as an older epoch's.
func TestXid8(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn := pgtest.Conn(t)
	var committed, aborted uint32
	require.NoError(t, conn.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&committed))
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, tx.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&aborted))
	require.NoError(t, tx.Rollback(ctx))

	tx, err = conn.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck // the test's end
	status := func(xmax uint32, ref string) *string {
		t.Helper()
		var s *string
		require.NoError(t, tx.QueryRow(ctx, "SELECT pg_xact_status("+xidsql.Xid8("$1::bigint::text::xid", ref)+")", xmax).Scan(&s))
		return s
	}
	const current = "pg_current_xact_id()::text::bigint"
	var own uint32
	require.NoError(t, tx.QueryRow(ctx, "SELECT "+current).Scan(&own))
	require.Equal(t, "committed", *status(committed, current))
	require.Equal(t, "aborted", *status(aborted, current))
	require.Equal(t, "in progress", *status(own, current))
	for _, beyond := range []uint32{own + 1, own + 1_000_000, 1<<32 - 1} {
		// An older epoch: before the first one, frozen (committed); in a
		// later epoch, too old for the commit log (NULL). Never an error.
		if s := status(beyond, current); s != nil {
			require.Equal(t, "committed", *s, "xmax %d", beyond)
		}
	}
	// A reference before the transaction: it is beyond it, so from an
	// older epoch, and not read as in progress.
	if s := status(own, "pg_snapshot_xmin(pg_current_snapshot())::text::bigint - 1"); s != nil {
		require.NotEqual(t, "in progress", *s)
	}
}
