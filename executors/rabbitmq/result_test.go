package rabbitmq_test

import (
	"context"
	"encoding/json"
	"strconv"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/executors/rabbitmq"
	"github.com/pgdispatch/pgdispatch/internal/testkit/amqptest"
)

// Each attempt records the broker's answer: an ack, a nack, or the return
// of a mandatory message no queue took, with the broker's reply.
func TestResultIsTheBrokersAnswer(t *testing.T) {
	t.Parallel()
	u := amqptest.URL(t)
	e, err := rabbitmq.New(rabbitmq.Config{URL: u, Name: "pgdispatch-test"})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, e.Close()) })
	queue := "pgdispatch-test-result-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	amqptest.Queue(t, u, queue)
	full := queue + "-full" // takes no message: the broker nacks each
	declare(t, u, full, amqp.Table{"x-max-length": int32(0), "x-overflow": "reject-publish"})

	run := func(id int64, routingKey string) (string, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), waitFor)
		defer cancel()
		ctx, a := executors.WithAttempt(ctx)
		payload, _ := json.Marshal(map[string]any{"routing_key": routingKey, "body": map[string]any{"order": id}})
		err := e.Execute(ctx, &executors.Job{ID: id, Attempt: 1, Payload: payload})
		return string(a.Result()), err
	}

	got, err := run(1, queue)
	require.NoError(t, err)
	require.JSONEq(t, `{"broker": "ack"}`, got)
	require.Len(t, amqptest.Drain(t, u, queue), 1)

	got, err = run(2, "no-such-queue-"+queue)
	require.ErrorContains(t, err, "unroutable")
	require.JSONEq(t, `{"broker": "return", "reply_code": 312, "reply_text": "NO_ROUTE"}`, got)

	got, err = run(3, full)
	require.ErrorContains(t, err, "nacked")
	require.JSONEq(t, `{"broker": "nack"}`, got)

	got, err = run(4, queue)
	require.NoError(t, err, "the channel is used again")
	require.JSONEq(t, `{"broker": "ack"}`, got)
}

// declare declares a queue with args for the test, and deletes it when the
// test ends.
func declare(t *testing.T, url, name string, args amqp.Table) {
	t.Helper()
	conn, err := amqp.Dial(url)
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(name, false, false, false, false, args)
	require.NoError(t, err)
	t.Cleanup(func() {
		conn, err := amqp.Dial(url)
		if err != nil {
			return
		}
		defer func() { _ = conn.Close() }()
		if ch, err := conn.Channel(); err == nil {
			_, _ = ch.QueueDelete(name, false, false, false)
		}
	})
}
