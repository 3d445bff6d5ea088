package giveback

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// A claim's reply is lost when the connection failed under it, not when the
// server refused the statement or no connection was made.
func TestReplyLost(t *testing.T) {
	t.Parallel()
	for err, want := range map[error]bool{
		fmt.Errorf("claim jobs: %w", net.ErrClosed):                                     true,
		fmt.Errorf("claim jobs: %w", context.DeadlineExceeded):                          true,
		fmt.Errorf("claim jobs: %w", &pgconn.PgError{Severity: "FATAL", Code: "57P01"}): true,
		fmt.Errorf("claim jobs: %w", &pgconn.PgError{Severity: "ERROR", Code: "42P01"}): false,
		fmt.Errorf("claim jobs: %w", &pgconn.ConnectError{}):                            false,
		fmt.Errorf("claim jobs: %w", errors.New("scan: cannot scan NULL into *int64")):  false,
	} {
		require.Equal(t, want, ReplyLost(err), "%v", err)
	}
}
