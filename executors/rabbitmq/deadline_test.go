package rabbitmq_test

import (
	"context"
	"encoding/json"
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

// returnsSoon waits for an Execute that should return by its context's
// end, and fails the test when it goes on long after: a minute, far below
// the hour the tests' executors would otherwise wait, and far above what a
// loaded machine adds.
func returnsSoon(t *testing.T, done <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(time.Minute):
		t.Fatalf("%s: Execute went on long past its context's end", what)
		return nil
	}
}

func executeAsync(ctx context.Context, t *testing.T, e *rabbitmq.Executor, id int64, queue, body string) <-chan error {
	t.Helper()
	payload, err := json.Marshal(map[string]any{"routing_key": queue, "body": body})
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- e.Execute(ctx, &executors.Job{ID: id, Attempt: 1, Payload: payload}) }()
	return done
}

// A broker that takes the connection but answers nothing (a stopped
// process: the kernel still accepts) holds no job past its deadline, and a
// job does not wait past its own for another's connection attempt.
func TestSilentBrokerDial(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	accepted := make(chan net.Conn, 4)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		wg.Wait()
		for len(accepted) > 0 {
			_ = (<-accepted).Close()
		}
	})
	e, err := rabbitmq.New(rabbitmq.Config{URL: "amqp://guest:guest@" + ln.Addr().String() + "/", DialTimeout: time.Hour})
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })

	first, cancel := context.WithCancel(context.Background())
	defer cancel()
	dialing := executeAsync(first, t, e, 1, "q", "first")
	conn := <-accepted // the first job is connecting
	defer func() { _ = conn.Close() }()

	second, cancel2 := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel2()
	err = returnsSoon(t, executeAsync(second, t, e, 2, "q", "second"), "a job behind another's connection attempt")
	require.ErrorIs(t, err, context.DeadlineExceeded)

	cancel()
	err = returnsSoon(t, dialing, "the job connecting")
	require.ErrorIs(t, err, context.Canceled)
}

// stalledBroker returns an executor whose connection to the broker has
// published one message through a proxy, and the proxy, stalled now: the
// broker reads nothing more of the connection, as under a memory alarm.
// heartbeat=0: as under the alarm, when RabbitMQ stops checking the
// client's heartbeats, the connection stays up.
func stalledBroker(t *testing.T, cfg rabbitmq.Config) (*rabbitmq.Executor, string) {
	t.Helper()
	brokerURL := amqptest.URL(t)
	queue := "pgdispatch-deadline-" + strings.ReplaceAll(time.Now().Format("150405.000000"), ".", "")
	amqptest.Queue(t, brokerURL, queue)
	u, err := url.Parse(brokerURL)
	require.NoError(t, err)
	proxy := newStallProxy(t, u.Host)
	u.Host = proxy.ln.Addr().String()
	u.RawQuery = "heartbeat=0"
	cfg.URL = u.String()
	e, err := rabbitmq.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close() })
	t.Cleanup(proxy.Close) // first: it ends the stalled connection

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	require.NoError(t, returnsSoon(t, executeAsync(ctx, t, e, 1, queue, "before"), "the first publish"))
	<-proxy.accepted
	proxy.stall()
	return e, queue
}

// A job that needs a new channel on a connection whose broker answers
// nothing returns by its deadline.
func TestStalledBrokerChannelOpen(t *testing.T) {
	t.Parallel()
	e, queue := stalledBroker(t, rabbitmq.Config{Channels: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	// It publishes on the idle channel, gets no confirm, and drops the channel.
	err := returnsSoon(t, executeAsync(ctx, t, e, 2, queue, "no confirm"), "the publish on the idle channel")
	require.ErrorContains(t, err, "no confirm from the broker")

	ctx, cancel = context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	err = returnsSoon(t, executeAsync(ctx, t, e, 3, queue, "new channel"), "the job opening a channel")
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// A job whose message the broker does not take returns by its deadline,
// however long the write bound.
func TestStalledBrokerPublishWrite(t *testing.T) {
	t.Parallel()
	e, queue := stalledBroker(t, rabbitmq.Config{WriteTimeout: time.Hour})
	// Far more than the socket buffers between the executor and the proxy
	// take; a number, which holds no secret to look for in the error.
	payload, err := json.Marshal(map[string]any{"routing_key": queue, "body": json.RawMessage(strings.Repeat("7", 8<<20))})
	require.NoError(t, err)
	// Execute decodes the 8 MiB before it takes a channel: half a second
	// under the race detector on an idle machine, several on a loaded one,
	// and the deadline must fall during the write.
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- e.Execute(ctx, &executors.Job{ID: 2, Attempt: 1, Payload: payload}) }()
	err = returnsSoon(t, done, "the publish")
	require.ErrorContains(t, err, "the broker did not take the message before the job's deadline")
	require.NotErrorAs(t, err, new(*executors.PermanentError), "the attempt retries")
}

// Close returns when the broker answers nothing, after the write bound.
func TestStalledBrokerClose(t *testing.T) {
	t.Parallel()
	e, _ := stalledBroker(t, rabbitmq.Config{WriteTimeout: time.Second})
	done := make(chan error, 1)
	go func() { done <- e.Close() }()
	err := returnsSoon(t, done, "Close")
	require.ErrorContains(t, err, "the broker did not answer the close within 1s")
}
