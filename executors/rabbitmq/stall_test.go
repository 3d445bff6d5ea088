package rabbitmq_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/executors/rabbitmq"
	"github.com/pgdispatch/pgdispatch/internal/testkit/amqptest"
)

// stallProxy forwards TCP connections to a broker. stall makes the
// connections open at the time stop reading from the client, as a broker
// under a memory alarm does; connections accepted later are forwarded.
type stallProxy struct {
	ln     net.Listener
	target string
	done   chan struct{} // closed by Close: stalled forwarders give up

	mu       sync.Mutex
	stalled  chan struct{} // closed by stall, for the connections open then
	conns    []net.Conn
	accepted chan struct{} // one per connection accepted
	wg       sync.WaitGroup
}

func newStallProxy(t *testing.T, target string) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &stallProxy{ln: ln, target: target, done: make(chan struct{}), stalled: make(chan struct{}), accepted: make(chan struct{}, 16)}
	p.wg.Go(p.serve)
	return p
}

func (p *stallProxy) serve() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		broker, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		// A small receive buffer, so that the client's writes fill it soon.
		_ = client.(*net.TCPConn).SetReadBuffer(4096)
		p.mu.Lock()
		stalled := p.stalled
		p.conns = append(p.conns, client, broker)
		p.mu.Unlock()
		p.accepted <- struct{}{}
		p.wg.Go(func() { // client to broker
			buf := make([]byte, 4096)
			for {
				n, err := client.Read(buf)
				select {
				case <-stalled: // read no more, forward nothing
					<-p.done
					return
				default:
				}
				if n > 0 {
					if _, werr := broker.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					_ = broker.(*net.TCPConn).CloseWrite()
					return
				}
			}
		})
		p.wg.Go(func() { // broker to client
			_, _ = io.Copy(client, broker)
			_ = client.(*net.TCPConn).CloseWrite()
		})
	}
}

// stall stops reading the connections open now.
func (p *stallProxy) stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	close(p.stalled)
	p.stalled = make(chan struct{})
}

func (p *stallProxy) Close() {
	_ = p.ln.Close()
	close(p.done)
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// A broker that stops reading fails the publish on its connection, within
// the write bound, instead of blocking it (and every channel of the
// connection) forever; the next job publishes on a new connection.
func TestBrokerStopsReading(t *testing.T) {
	t.Parallel()
	brokerURL := amqptest.URL(t)
	queue := "pgdispatch-stall-" + strings.ReplaceAll(time.Now().Format("150405.000000"), ".", "")
	amqptest.Queue(t, brokerURL, queue)
	u, err := url.Parse(brokerURL)
	require.NoError(t, err)
	proxy := newStallProxy(t, u.Host)
	u.Host = proxy.ln.Addr().String()

	e, err := rabbitmq.New(rabbitmq.Config{URL: u.String(), WriteTimeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	t.Cleanup(proxy.Close) // first: it unblocks a write that never returned

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	execute := func(id int64, body string) <-chan error {
		payload, err := json.Marshal(map[string]any{"routing_key": queue, "body": body})
		require.NoError(t, err)
		done := make(chan error, 1)
		go func() { done <- e.Execute(ctx, &executors.Job{ID: id, Attempt: 1, Payload: payload}) }()
		return done
	}
	wait := func(done <-chan error) error {
		select {
		case err := <-done:
			return err
		case <-ctx.Done():
			t.Fatal("Execute did not return: the publish hangs on a broker that reads nothing")
			return nil
		}
	}

	require.NoError(t, wait(execute(1, "before")))
	<-proxy.accepted

	proxy.stall()
	// Far more than the socket buffers between the executor and the proxy.
	err = wait(execute(2, strings.Repeat("x", 8<<20)))
	require.Error(t, err)
	require.Contains(t, err.Error(), "the broker took no data for 1s")
	require.NotErrorAs(t, err, new(*executors.PermanentError), "the attempt retries")

	require.NoError(t, wait(execute(3, "after")), "a later job publishes on a new connection")
	select {
	case <-proxy.accepted:
	default:
		t.Fatal("the later job did not dial a new connection")
	}
}
