package rabbitmq_test

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/executors/rabbitmq"
	"github.com/pgdispatch/pgdispatch/internal/testkit/tlstest"
)

// hostileBroker speaks just enough AMQP 0-9-1, with no AMQP library, to
// take a publish, and answers it with what mode says; over TLS with a
// certificate of its own when secure is true. It returns the broker's URL
// and a channel that gets the bytes it sent on each connection once the
// client has closed it.
func hostileBroker(t *testing.T, mode string, secure bool) (string, <-chan int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	url := "amqp://guest:guest@" + ln.Addr().String() + "/"
	if secure {
		certs := tlstest.New(t)
		ca := filepath.Join(t.TempDir(), "ca.pem")
		require.NoError(t, os.WriteFile(ca, certs.PEM, 0o600))
		ln = tls.NewListener(ln, certs.Server)
		url = "amqps://guest:guest@" + ln.Addr().String() + "/?cacertfile=" + ca
	}
	sent := make(chan int64, 10)
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer func() { _ = conn.Close() }()
				sent <- serveHostile(conn, mode)
			})
		}
	})
	return url, sent
}

// hostileLimit is what the broker sends at most on a connection: a client
// that reads it all has no bound.
const hostileLimit = 64 << 20

func serveHostile(conn net.Conn, mode string) int64 {
	var (
		mu      sync.Mutex
		written int64
		flood   sync.WaitGroup
	)
	send := func(typ byte, ch uint16, payload []byte) error {
		b := append([]byte{typ}, binary.BigEndian.AppendUint16(nil, ch)...)
		b = binary.BigEndian.AppendUint32(b, uint32(len(payload)))
		b = append(append(b, payload...), 0xCE)
		mu.Lock()
		defer mu.Unlock()
		n, err := conn.Write(b)
		written += int64(n)
		return err
	}
	r := bufio.NewReader(conn)
	if _, err := io.ReadFull(r, make([]byte, 8)); err != nil { // the protocol header
		return 0
	}
	_ = send(1, 0, method(10, 10, []byte{0, 9}, table(), longstr("PLAIN"), longstr("en_US"))) // connection.start
	for {
		typ, ch, payload, err := readFrame(r)
		if err != nil {
			break
		}
		if typ != 1 {
			continue
		}
		switch class, id := binary.BigEndian.Uint16(payload), binary.BigEndian.Uint16(payload[2:]); {
		case class == 10 && id == 11: // start-ok
			_ = send(1, 0, method(10, 30, u16(0), binary.BigEndian.AppendUint32(nil, 131072), u16(0))) // tune
		case class == 10 && id == 40: // open
			_ = send(1, 0, method(10, 41, shortstr("")))
		case class == 20 && id == 10: // channel.open
			_ = send(1, ch, method(20, 11, longstr("")))
		case class == 85 && id == 10: // confirm.select
			_ = send(1, ch, method(85, 11))
		case class == 60 && id == 40 && mode == "endless return": // basic.publish
			flood.Go(func() {
				// The message comes back, with a header that announces a
				// terabyte of body, and body frames that never end.
				_ = send(1, ch, method(60, 50, u16(312), shortstr("NO_ROUTE"), shortstr(""), shortstr("q")))
				_ = send(2, ch, method(60, 0, binary.BigEndian.AppendUint64(nil, 1<<40), u16(0)))
				body := make([]byte, 131072-8)
				for {
					mu.Lock()
					done := written >= hostileLimit
					mu.Unlock()
					if done || send(3, ch, body) != nil {
						return
					}
				}
			})
		case class == 60 && id == 40 && mode == "echoing return":
			_ = send(1, ch, method(60, 50, u16(312), shortstr("NO_ROUTE for Bearer amqp-bearer-0ne and amqp-api-key-tw0"), shortstr(""), shortstr("q")))
			// A header with no body and the message id the job set (flag 0x0080), then the ack.
			_ = send(2, ch, method(60, 0, binary.BigEndian.AppendUint64(nil, 0), u16(0x0080), shortstr("1")))
			_ = send(1, ch, method(60, 80, binary.BigEndian.AppendUint64(nil, 1), []byte{0}))
		case class == 20 && id == 40: // channel.close
			_ = send(1, ch, method(20, 41))
		case class == 10 && id == 50: // connection.close
			_ = send(1, 0, method(10, 51))
		}
	}
	flood.Wait()
	mu.Lock()
	defer mu.Unlock()
	return written
}

func readFrame(r *bufio.Reader) (byte, uint16, []byte, error) {
	head := make([]byte, 7)
	if _, err := io.ReadFull(r, head); err != nil {
		return 0, 0, nil, err
	}
	payload := make([]byte, binary.BigEndian.Uint32(head[3:])+1)
	if _, err := io.ReadFull(r, payload); err != nil {
		return 0, 0, nil, err
	}
	return head[0], binary.BigEndian.Uint16(head[1:]), payload[:len(payload)-1], nil
}

func method(class, id uint16, args ...[]byte) []byte {
	b := append(u16(class), u16(id)...)
	for _, a := range args {
		b = append(b, a...)
	}
	return b
}

func u16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }

func shortstr(s string) []byte { return append([]byte{byte(len(s))}, s...) }

func longstr(s string) []byte {
	return append(binary.BigEndian.AppendUint32(nil, uint32(len(s))), s...)
}

func table() []byte { return binary.BigEndian.AppendUint32(nil, 0) }

// A broker that returns the message with a body that never ends fails the
// connection at the return's header: the worker reads no more of it, and
// the job retries with a readable error.
func TestEndlessReturnedMessage(t *testing.T) {
	t.Parallel()
	for _, secure := range []bool{false, true} {
		t.Run(map[bool]string{false: "amqp", true: "amqps"}[secure], func(t *testing.T) {
			t.Parallel()
			endlessReturn(t, secure)
		})
	}
}

func endlessReturn(t *testing.T, secure bool) {
	url, sent := hostileBroker(t, "endless return", secure)
	e, err := rabbitmq.New(rabbitmq.Config{URL: url})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- e.Execute(ctx, &executors.Job{ID: 4, Attempt: 1, Payload: json.RawMessage(`{"routing_key": "q", "body": {}}`)})
	}()
	select {
	case err = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the attempt went on past its context's end")
	}
	require.ErrorContains(t, err, "more than the "+strconv.Itoa(rabbitmq.MaxContentBytes)+" bytes")
	var n int64
	select {
	case n = <-sent:
	case <-time.After(10 * time.Second):
		t.Fatal("the worker still holds the connection")
	}
	t.Logf("%v; the broker sent %d bytes", err, n)
	require.Less(t, n, int64(16<<20), "the client read on")
}

// A broker's reply text, which may quote what it got, is masked as any
// peer's reply is, of the payload's secrets too.
func TestEchoedReplyTextIsMasked(t *testing.T) {
	t.Parallel()
	url, _ := hostileBroker(t, "echoing return", false)
	e, err := rabbitmq.New(rabbitmq.Config{URL: url})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx, a := executors.WithAttempt(ctx)
	err = e.Execute(ctx, &executors.Job{ID: 1, Attempt: 1, Payload: json.RawMessage(`{"routing_key": "q", "body": {}, "headers": {"X-Api-Key": "amqp-api-key-tw0"}}`)})
	require.ErrorContains(t, err, "unroutable")
	for _, out := range []string{err.Error(), string(a.Result())} {
		t.Log(out)
		require.Contains(t, out, "NO_ROUTE")
		require.NotContains(t, out, "amqp-bearer-0ne")
		require.NotContains(t, out, "amqp-api-key-tw0")
	}
}
