package retry

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// A failure on a lost connection is tried again at once, a pool's worth of
// times in a row; any other failure, and a lost connection past that, backs
// off from the first step (100 ms) up. A failure to connect is not a lost
// connection: the database is down, and trying again at once would spin.
func TestBackoffSkipsLostConnections(t *testing.T) {
	t.Parallel()
	lost := fmt.Errorf("claim jobs: %w", &pgconn.PgError{Severity: "FATAL", Code: "57P01", Message: "terminating connection due to administrator command"})
	failed := errors.New(`claim jobs: relation "jobs" does not exist`)
	b := New(2)
	var got []time.Duration
	for _, err := range []error{lost, lost, lost, failed, io.ErrUnexpectedEOF} {
		got = append(got, b.Next(err))
	}
	require.Equal(t, []time.Duration{0, 0, 100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond}, got)

	require.True(t, ConnLost(fmt.Errorf("record outcomes: %w", io.EOF)))
	require.False(t, ConnLost(&pgconn.PgError{Severity: "ERROR", Code: "40P01"}), "a deadlock is the statement's failure")
	_, err := pgconn.Connect(context.Background(), "postgres://127.0.0.1:1/x?connect_timeout=5")
	require.Error(t, err)
	require.False(t, ConnLost(err), "a failed connect: %v", err)
}
