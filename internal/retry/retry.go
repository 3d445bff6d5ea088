// Package retry paces the tries of database statements that keep failing,
// for the claimer and the sweeper.
package retry

import (
	"errors"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Backoff paces the tries of a statement that keeps failing: 100 ms after
// the first failure, doubling to 10 s (Delay). A failure whose connection
// was lost (ConnLost) is tried again at once instead, a pool's worth of
// times in a row: the pool handed out a connection the server had closed
// (terminated, restarted) and drops it now, and after a mass termination
// every idle connection is dead. Backing off for each left a queue
// unclaimed for seconds (0.1 + 0.2 + 0.4 + ... s for a pool of warmed
// connections; the fault suite's terminate scenario caught it).
//
// The zero Backoff never tries again at once; use New.
type Backoff struct {
	failures int // in a row
	quick    int // of them, tried again at once
	poolSize int
}

// New returns a Backoff for statements run on a pool of poolSize
// connections.
func New(poolSize int) Backoff {
	return Backoff{poolSize: poolSize}
}

// Next counts a failure and returns the pause before the next try: 0 to try
// again at once.
func (b *Backoff) Next(err error) time.Duration {
	b.failures++
	if ConnLost(err) && b.quick < b.poolSize {
		b.quick++
		return 0
	}
	return Delay(b.failures - b.quick)
}

// Failures is how many failures in a row Next has counted.
func (b *Backoff) Failures() int { return b.failures }

// ConnLost reports whether err says that the connection died under the
// statement, the server having closed it (a FATAL error, such as
// pg_terminate_backend's 57P01) or gone away, rather than that the
// statement failed or a new connection could not be made.
func ConnLost(err error) bool {
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return false
	}
	if pgErr := (*pgconn.PgError)(nil); errors.As(err, &pgErr) {
		return pgErr.Severity == "FATAL" || pgErr.SeverityUnlocalized == "FATAL"
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// Delay is the pause after the failures-th failure in a row: 100 ms,
// doubling to 10 s.
func Delay(failures int) time.Duration {
	d := 100 * time.Millisecond << min(failures-1, 7)
	return min(d, 10*time.Second)
}
