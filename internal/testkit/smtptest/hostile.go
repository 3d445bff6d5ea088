package smtptest

import (
	"bufio"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
)

// Behaviour is what a Hostile server does on a connection.
type Behaviour int

const (
	// EndlessLine greets with a line that never ends.
	EndlessLine Behaviour = iota
	// EndlessMultiline greets with "220-" lines that never end in a last one.
	EndlessMultiline
	// EndlessEHLO greets properly and answers EHLO with "250-" lines that
	// never end in a last one: before STARTTLS, anyone on the path can.
	EndlessEHLO
	// EchoAuth offers AUTH PLAIN and LOGIN and refuses any AUTH with a 535
	// reply that quotes the command, its credentials included.
	EchoAuth
)

func (b Behaviour) String() string {
	return [...]string{"endless line", "endless multi-line", "endless EHLO", "echoing AUTH"}[b]
}

// DefaultHostileLimit is how much a Hostile server sends on one connection
// before it stops and waits for the client to close it: far past any
// bound a client should hold to, and small enough that a client without
// one does not take the machine down.
const DefaultHostileLimit = 512 << 20

// Hostile is an SMTP server that attacks its clients: written with no SMTP
// library, so that it can send what no server should.
type Hostile struct {
	Host string
	Port int
	// Conns has one entry per connection, in the order they came.
	Conns chan *HostileConn

	behaviours []Behaviour
	limit      int64
	mu         sync.Mutex
	n          int
}

// HostileConn is one connection a Hostile server served.
type HostileConn struct {
	Behaviour Behaviour
	// Closed is closed when the client has closed the connection.
	Closed chan struct{}

	mu      sync.Mutex
	written int64
}

// Written is the bytes the server managed to send on the connection: what
// the client read, plus what the sockets' buffers held when it closed.
func (c *HostileConn) Written() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.written
}

// StartHostile runs a hostile server until the test ends. Its i-th
// connection gets behaviours[i mod len(behaviours)]. Each sends at most
// limit bytes (DefaultHostileLimit when 0).
func StartHostile(t testing.TB, limit int64, behaviours ...Behaviour) *Hostile {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if limit == 0 {
		limit = DefaultHostileLimit
	}
	addr := ln.Addr().(*net.TCPAddr)
	h := &Hostile{Host: addr.IP.String(), Port: addr.Port, Conns: make(chan *HostileConn, 100), behaviours: behaviours, limit: limit}
	var wg sync.WaitGroup
	var open sync.Map // net.Conn → struct{}
	t.Cleanup(func() {
		_ = ln.Close()
		open.Range(func(c, _ any) bool { _ = c.(net.Conn).Close(); return true })
		wg.Wait()
	})
	wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			h.mu.Lock()
			hc := &HostileConn{Behaviour: behaviours[h.n%len(behaviours)], Closed: make(chan struct{})}
			h.n++
			h.mu.Unlock()
			open.Store(conn, struct{}{})
			select {
			case h.Conns <- hc:
			default:
			}
			wg.Go(func() {
				defer open.Delete(conn)
				defer func() { _ = conn.Close() }()
				h.serve(conn, hc)
			})
		}
	})
	return h
}

func (h *Hostile) serve(conn net.Conn, hc *HostileConn) {
	r := bufio.NewReader(conn)
	write := func(s string) bool {
		n, err := conn.Write([]byte(s))
		hc.mu.Lock()
		hc.written += int64(n)
		hc.mu.Unlock()
		return err == nil
	}
	// flood writes prefix and then line after line until the limit or the
	// client's close, then waits for the close.
	flood := func(prefix, line string) {
		if write(prefix) {
			chunk := strings.Repeat(line, max(1, 32<<10/len(line)))
			for hc.Written() < h.limit && write(chunk) {
			}
		}
		waitClosed(r, hc)
	}
	switch hc.Behaviour {
	case EndlessLine:
		flood("220 ", "x")
		return
	case EndlessMultiline:
		flood("", "220-hostile.test greets you, and goes on greeting you\r\n")
		return
	}
	if !write("220 hostile.test ESMTP\r\n") {
		return
	}
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			close(hc.Closed)
			return
		}
		cmd := strings.TrimRight(line, "\r\n")
		verb, _, _ := strings.Cut(strings.ToUpper(cmd), " ")
		switch {
		case (verb == "EHLO" || verb == "HELO") && hc.Behaviour == EndlessEHLO:
			flood("", "250-X-HOSTILE-EXTENSION goes on and on\r\n")
			return
		case verb == "EHLO" || verb == "HELO":
			write("250-hostile.test\r\n250 AUTH PLAIN LOGIN\r\n")
		case verb == "AUTH":
			write("535 5.7.8 authentication failed for: " + cmd + "\r\n")
		case verb == "QUIT":
			write("221 bye\r\n")
		default:
			write("502 5.5.1 not here\r\n")
		}
	}
}

// waitClosed reads what the client sends until it closes the connection.
func waitClosed(r *bufio.Reader, hc *HostileConn) {
	_, _ = io.Copy(io.Discard, r)
	close(hc.Closed)
}
