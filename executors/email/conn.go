package email

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	gomail "github.com/wneessen/go-mail"
)

// MaxReplyBytes bounds what the executor reads of one reply of the SMTP
// server: the bytes between two commands it sends, the greeting before
// the first. RFC 5321 allows 512 bytes a line, and an EHLO reply has a few
// dozen lines. A server that sends more fails the attempt.
const MaxReplyBytes = 64 << 10

// maxSessionBytes bounds what the executor reads over one session, TLS
// records included, whatever the commands between.
const maxSessionBytes = 1 << 20

// errReplyTooLong fails an attempt whose server sent a reply longer than
// MaxReplyBytes, or more than maxSessionBytes in all.
var errReplyTooLong = errors.New("the server's reply ran past " + fmt.Sprint(MaxReplyBytes>>10) +
	" KiB (or the session past " + fmt.Sprint(maxSessionBytes>>20) + " MiB) without ending: a broken or hostile server")

// dialer connects to the server for one attempt: its connection's reads are
// bounded (see boundedConn), its deadlines never fall past the attempt's,
// and it is closed when attempt ends (Execute ends it as it returns: go-mail
// leaves a connection open when the server's EHLO reply fails). With TLS tls it is encrypted
// from the first byte, over the bounded connection.
func (e *Executor) dialer(attempt context.Context) gomail.DialContextFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		raw, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		conn := newBoundedConn(attempt, raw)
		if e.cfg.TLS != TLSImplicit {
			return conn, nil
		}
		tc := tls.Client(conn, e.cfg.TLSConfig)
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = tc.Close()
			return nil, err
		}
		return tc, nil
	}
}

// boundedConn is a connection to an SMTP server that cannot hold more of
// the worker than its attempt allows: it reads at most MaxReplyBytes
// between two writes and maxSessionBytes in all, no deadline set on it
// falls past the attempt's, and it is closed when the attempt ends, so that
// an executor abandoned at its deadline reads no more.
type boundedConn struct {
	net.Conn
	attempt  context.Context
	deadline time.Time // the attempt's; zero when it has none
	stop     func() bool

	mu         sync.Mutex
	sinceWrite int // bytes read since the last write: the reply being read
	total      int
}

func newBoundedConn(attempt context.Context, conn net.Conn) *boundedConn {
	c := &boundedConn{Conn: conn, attempt: attempt}
	c.deadline, _ = attempt.Deadline()
	if !c.deadline.IsZero() {
		_ = conn.SetDeadline(c.deadline)
	}
	c.stop = context.AfterFunc(attempt, func() { _ = conn.Close() })
	return c
}

func (c *boundedConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	room := min(MaxReplyBytes-c.sinceWrite, maxSessionBytes-c.total)
	c.mu.Unlock()
	if room <= 0 {
		return 0, errReplyTooLong
	}
	n, err := c.Conn.Read(p[:min(len(p), room)])
	c.mu.Lock()
	c.sinceWrite += n
	c.total += n
	c.mu.Unlock()
	return n, c.explain(err)
}

func (c *boundedConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.sinceWrite = 0
	c.mu.Unlock()
	n, err := c.Conn.Write(p)
	return n, c.explain(err)
}

// explain says why a read or a write failed when it was the attempt's end
// that failed it: the connection closed under it, or its deadline passed.
func (c *boundedConn) explain(err error) error {
	switch {
	case err == nil:
		return nil
	case c.attempt.Err() != nil && errors.Is(context.Cause(c.attempt), context.DeadlineExceeded),
		errors.Is(err, os.ErrDeadlineExceeded) && !c.deadline.IsZero() && !time.Now().Before(c.deadline):
		return fmt.Errorf("no reply before the job's deadline: %w", context.DeadlineExceeded)
	case c.attempt.Err() != nil:
		return fmt.Errorf("the attempt ended before the server's reply: %w", context.Cause(c.attempt))
	}
	return err
}

func (c *boundedConn) Close() error {
	c.stop()
	return c.Conn.Close()
}

// SetDeadline and the others below keep any deadline go-mail sets (its
// Timeout, from now) within the attempt's.
func (c *boundedConn) SetDeadline(t time.Time) error {
	return c.explain(c.Conn.SetDeadline(c.within(t)))
}

func (c *boundedConn) SetReadDeadline(t time.Time) error {
	return c.explain(c.Conn.SetReadDeadline(c.within(t)))
}

func (c *boundedConn) SetWriteDeadline(t time.Time) error {
	return c.explain(c.Conn.SetWriteDeadline(c.within(t)))
}

func (c *boundedConn) within(t time.Time) time.Time {
	if c.deadline.IsZero() || !t.IsZero() && t.Before(c.deadline) {
		return t
	}
	return c.deadline
}
