package rabbitmq

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/internal/testkit/amqptest"
)

func testFrame(typ byte, payload []byte) []byte {
	b := binary.BigEndian.AppendUint32([]byte{typ, 0, 1}, uint32(len(payload)))
	return append(append(b, payload...), 0xCE)
}

func contentHeader(bodySize uint64) []byte {
	return testFrame(frameTypeHeader, append(binary.BigEndian.AppendUint64([]byte{0, 60, 0, 0}, bodySize), 0, 0))
}

// The guard follows frames however the reads cut them, and refuses only a
// content header that announces too large a body.
func TestGuardScan(t *testing.T) {
	t.Parallel()
	var ok []byte
	ok = append(ok, testFrame(1, []byte{0, 60, 0, 50, 1, 56})...)
	ok = append(ok, contentHeader(MaxContentBytes)...)
	ok = append(ok, testFrame(3, make([]byte, 1000))...)
	ok = append(ok, testFrame(8, nil)...) // a heartbeat
	bad := append(append([]byte{}, ok...), contentHeader(MaxContentBytes+1)...)
	for _, step := range []int{1, 2, 7, 13, 19, len(bad)} {
		for _, c := range []struct {
			stream []byte
			fails  bool
		}{{ok, false}, {bad, true}} {
			g := &guardedConn{}
			var err error
			for i := 0; i < len(c.stream) && err == nil; i += step {
				err = g.scan(c.stream[i:min(i+step, len(c.stream))])
			}
			if c.fails {
				require.ErrorContains(t, err, "more than the", "reads of %d bytes", step)
			} else {
				require.NoError(t, err, "reads of %d bytes", step)
				require.Zero(t, g.have+int(g.remaining), "between frames")
			}
		}
	}
}

// Whatever the bytes and however they are cut, the guard's verdict is the
// same.
func FuzzGuardScan(f *testing.F) {
	f.Add(contentHeader(1<<40), 3)
	f.Add(append(testFrame(1, []byte{1, 2, 3}), contentHeader(5)...), 9)
	f.Fuzz(func(t *testing.T, stream []byte, cut int) {
		whole := &guardedConn{}
		want := whole.scan(stream)
		cut = min(max(cut, 0), len(stream))
		parts := &guardedConn{}
		got := parts.scan(stream[:cut])
		if got == nil {
			got = parts.scan(stream[cut:])
		}
		require.Equal(t, want == nil, got == nil)
		if want == nil {
			require.Equal(t, whole.have, parts.have)
			require.Equal(t, whole.remaining, parts.remaining)
		}
	})
}

// A write the peer does not take within the bound fails, closes the
// socket, and breaks the connection: later writes fail at once.
func TestGuardWriteTimeout(t *testing.T) {
	t.Parallel()
	client, peer := net.Pipe() // synchronous: a write waits for the peer's read
	g := guard(client, 10*time.Millisecond)
	require.NoError(t, g.broken())
	_, err := g.Write([]byte("frame"))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.ErrorContains(t, err, "the broker took no data for 10ms")
	require.Equal(t, err, g.broken())
	_, err2 := g.Write([]byte("more"))
	require.Equal(t, err, err2, "the error is sticky")
	_, err = peer.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF, "the socket is closed")
}

// After the ack, the message's return is found among those the channel
// holds, also once amqp091-go has closed the channel's returns; a closed
// channel holding none ends the search. The connection closing between the
// broker's ack and this search (rabbitmqctl close_all_connections caught
// it) left a job spinning on the closed channel, holding its slot.
func TestReturned(t *testing.T) {
	t.Parallel()
	search := func(returns chan amqp.Return, id string) (amqp.Return, bool) {
		type found struct {
			r  amqp.Return
			ok bool
		}
		done := make(chan found, 1)
		go func() {
			r, ok := returned(returns, id)
			done <- found{r, ok}
		}()
		select {
		case f := <-done:
			return f.r, f.ok
		case <-time.After(30 * time.Second):
			t.Fatalf("returned(%q) has not ended: it spins", id)
			return amqp.Return{}, false
		}
	}

	returns := make(chan amqp.Return, 4)
	_, ok := search(returns, "7")
	require.False(t, ok, "an open channel holding no return")

	returns <- amqp.Return{MessageId: "6", ReplyCode: 312}
	returns <- amqp.Return{MessageId: "7", ReplyCode: 312, ReplyText: "NO_ROUTE"}
	close(returns)
	r, ok := search(returns, "7")
	require.True(t, ok, "the message's return, behind an earlier one, in a closed channel")
	require.Equal(t, "NO_ROUTE", r.ReplyText)
	_, ok = search(returns, "8")
	require.False(t, ok, "a closed channel holding no return")
}

// A channel goes back to the idle pool only while its connection is the
// executor's: one whose connection the executor let go of (a write failed
// on it, and amqp091-go may not have shut it down yet) is discarded, or the
// next job's publish would fail on it.
func TestPoolKeepsOnlyTheConnectionsChannels(t *testing.T) {
	t.Parallel()
	e, err := New(Config{URL: amqptest.URL(t)})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	ch, err := e.acquire(ctx)
	require.NoError(t, err)
	e.release(ch, true)
	e.mu.Lock()
	require.Len(t, e.idle, 1, "a channel of the executor's connection is kept")
	wire := e.wire
	e.mu.Unlock()

	ch, err = e.acquire(ctx)
	require.NoError(t, err)
	e.mu.Lock()
	e.wire = &guardedConn{} // a connection dialed since
	e.mu.Unlock()
	e.release(ch, true)
	e.mu.Lock()
	require.Empty(t, e.idle, "a channel of a connection let go of is kept")
	e.wire = wire
	e.mu.Unlock()
	require.Eventually(t, ch.ch.IsClosed, 30*time.Second, 10*time.Millisecond, "the channel was not closed")

	// A write failed on the connection: the executor lets go of it before
	// amqp091-go has shut it down, and its channel is kept out of the pool.
	ch, err = e.acquire(ctx)
	require.NoError(t, err)
	e.mu.Lock()
	e.wire.mu.Lock()
	e.wire.werr = errors.New("a write failed")
	e.wire.mu.Unlock()
	e.dropBrokenLocked()
	e.mu.Unlock()
	e.release(ch, true)
	e.mu.Lock()
	require.Empty(t, e.idle, "a channel of the connection let go of after a failed write is kept")
	e.mu.Unlock()
	require.NoError(t, e.Close())
}
