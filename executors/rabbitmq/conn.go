package rabbitmq

import (
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// MaxContentBytes bounds the body of a message the broker sends back (a
// return of an unroutable message): twice the largest payload, and so the
// largest body, a job can have. amqp091-go bounds each frame by the frame
// size the connection negotiated, but gathers a message's body frames up to
// the size its header announces, whatever it is; a broker that announces
// more fails the connection before a byte of the body is kept.
const MaxContentBytes = 2 << 20

const (
	frameHeaderSize  = 7  // type, channel, size
	contentHeadBytes = 12 // class id, weight, body size: the start of a content header frame's payload
	frameTypeHeader  = 2
)

// guardedConn is the broker's connection, read through a parser of its
// frames that refuses a content header announcing a body larger than
// MaxContentBytes. It reads nothing itself: it looks at what amqp091-go
// reads.
//
// Each write is bounded by writeTimeout. amqp091-go writes every frame of
// the connection (publishes, heartbeats, channel methods) under one lock,
// with no deadline: a broker that stops reading (a memory or disk alarm
// blocks publishers so; a stalled network) would block the write forever
// once the socket's buffers fill, and with it every channel of the
// connection. A write that fails closes the socket, so that amqp091-go's
// reader fails too and shuts the connection down, and marks the connection
// broken (see broken) for the executor to dial a new one.
type guardedConn struct {
	net.Conn
	writeTimeout time.Duration

	mu        sync.Mutex
	head      [frameHeaderSize + contentHeadBytes]byte
	have      int    // bytes of head gathered
	remaining uint64 // bytes of the current frame's payload and end left to pass, once its head is in
	err       error  // sticky
	werr      error  // the first write error, sticky
}

func guard(conn net.Conn, writeTimeout time.Duration) *guardedConn {
	return &guardedConn{Conn: conn, writeTimeout: writeTimeout}
}

func (c *guardedConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	werr := c.werr
	c.mu.Unlock()
	if werr != nil {
		return 0, werr
	}
	if err := c.SetWriteDeadline(time.Now().Add(c.writeTimeout)); err != nil {
		return 0, c.fail(err)
	}
	n, err := c.Conn.Write(p)
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			err = fmt.Errorf("the broker took no data for %s (a memory or disk alarm, or a stalled network): %w", c.writeTimeout, err)
		}
		return n, c.fail(err)
	}
	return n, nil
}

// fail records err as the connection's write error and closes the socket.
func (c *guardedConn) fail(err error) error {
	c.mu.Lock()
	if c.werr == nil {
		c.werr = err
	}
	err = c.werr
	c.mu.Unlock()
	_ = c.Close()
	return err
}

// broken is the write error that broke the connection, or nil: after one
// the connection is no good, even before amqp091-go has shut it down.
func (c *guardedConn) broken() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.werr
}

func (c *guardedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil {
		c.err = c.scan(p[:n])
	}
	if c.err != nil {
		return 0, c.err
	}
	return n, err
}

// scan follows the frames in b, the next bytes of the stream.
func (c *guardedConn) scan(b []byte) error {
	for len(b) > 0 {
		if c.remaining > 0 {
			skip := min(uint64(len(b)), c.remaining)
			c.remaining -= skip
			b = b[skip:]
			continue
		}
		// Gather the frame's header, and for a content header the start of
		// its payload.
		want := frameHeaderSize
		if c.have >= frameHeaderSize && c.head[0] == frameTypeHeader {
			want = len(c.head)
		}
		k := copy(c.head[c.have:want], b)
		c.have += k
		b = b[k:]
		if c.have < want {
			continue
		}
		size := uint64(binary.BigEndian.Uint32(c.head[3:7]))
		if c.head[0] == frameTypeHeader && want == frameHeaderSize && size >= contentHeadBytes {
			continue // gather the body size too
		}
		if c.head[0] == frameTypeHeader && want == len(c.head) {
			if body := binary.BigEndian.Uint64(c.head[11:19]); body > MaxContentBytes {
				return fmt.Errorf("the broker sent a message of %d bytes on channel %d: more than the %d bytes of any message a job publishes",
					body, binary.BigEndian.Uint16(c.head[1:3]), MaxContentBytes)
			}
		}
		// The rest of the payload, and the frame-end octet.
		c.remaining = size + 1 - uint64(want-frameHeaderSize)
		c.have = 0
	}
	return nil
}

// dialer returns the URL to hand amqp091-go and the dial function that
// connects it, so that every byte amqp091-go reads passes the guard. An
// amqps URL is handed as amqp on its own port, with the TLS (as amqp091-go
// would set it up from the URL's cacertfile, certfile, keyfile and
// server_name_indication) done by the dial function, under the guard:
// amqp091-go would do it over the connection dial returns, and the guard
// would see only TLS records. Each connection dial makes is kept in *wire
// (only the opening in progress dials, in dial).
func (e *Executor) dialer(wire **guardedConn) (string, func(network, addr string) (net.Conn, error), error) {
	dial := amqp.DefaultDial(e.cfg.DialTimeout)
	uri, err := amqp.ParseURI(e.cfg.URL)
	if err != nil {
		return "", nil, err
	}
	if uri.Scheme != "amqps" {
		return e.cfg.URL, func(network, addr string) (net.Conn, error) {
			conn, err := dial(network, addr)
			if err != nil {
				return nil, err
			}
			*wire = guard(conn, e.cfg.WriteTimeout)
			return *wire, nil
		}, nil
	}
	cfg, err := tlsConfig(uri)
	if err != nil {
		return "", nil, err
	}
	u, err := url.Parse(e.cfg.URL)
	if err != nil {
		return "", nil, err
	}
	u.Scheme, u.Host = "amqp", net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port))
	return u.String(), func(network, addr string) (net.Conn, error) {
		conn, err := dial(network, addr)
		if err != nil {
			return nil, err
		}
		tc := tls.Client(conn, cfg)
		if err := tc.Handshake(); err != nil { // within the deadline DefaultDial set
			_ = conn.Close()
			return nil, err
		}
		*wire = guard(tc, e.cfg.WriteTimeout)
		return *wire, nil
	}, nil
}

// tlsConfig is the TLS configuration amqp091-go makes of an amqps URI.
func tlsConfig(uri amqp.URI) (*tls.Config, error) {
	cfg := &tls.Config{ServerName: cmp.Or(uri.ServerName, uri.Host), MinVersion: tls.VersionTLS12}
	if uri.CACertFile != "" {
		pem, err := os.ReadFile(uri.CACertFile)
		if err != nil {
			return nil, fmt.Errorf("read CA certificate: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		cfg.RootCAs.AppendCertsFromPEM(pem)
	}
	if uri.CertFile != "" && uri.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(uri.CertFile, uri.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("load client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
