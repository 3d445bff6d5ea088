package rabbitmq_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/executors/rabbitmq"
	"github.com/pgdispatch/pgdispatch/internal/testkit/amqptest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/workertest"
)

func TestMain(m *testing.M) { pgtest.MainNoLeaks(m) }

const waitFor = 30 * time.Second

type bundle struct {
	schema     string
	url, queue string
	jobs       string
	watch      *pgtest.Watcher
	exec       *rabbitmq.Executor
}

func setup(t *testing.T) *bundle {
	t.Helper()
	u := amqptest.URL(t)
	exec, err := rabbitmq.New(rabbitmq.Config{
		URL: u, Name: "pgdispatch-test", ReconnectMin: 50 * time.Millisecond,
		ReconnectMax: 500 * time.Millisecond, Logger: zaptest.NewLogger(t),
	})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, exec.Close()) }) // after the worker stops
	reg := executors.NewRegistry()
	reg.Register(rabbitmq.Kind, exec)
	schema := workertest.Start(t, "rabbit-test", reg)
	b := &bundle{schema: schema, url: u, queue: "pgdispatch-test-" + schema, jobs: pgx.Identifier{schema, "jobs"}.Sanitize(), exec: exec}
	amqptest.Queue(t, u, b.queue)
	b.watch = pgtest.Watch(t, schema)
	return b
}

func (b *bundle) enqueue(t *testing.T, payload any, maxAttempts int) int64 {
	t.Helper()
	return workertest.Enqueue(t, b.schema, "rabbitmq", payload, maxAttempts)
}

// drain reads every message in the test queue.
func (b *bundle) drain(t *testing.T) []amqp.Delivery {
	t.Helper()
	return amqptest.Drain(t, b.url, b.queue)
}

func TestPublishWithConfirm(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.enqueue(t, map[string]any{
		"exchange": "", "routing_key": b.queue, "body": map[string]any{"order": 42},
		"headers": map[string]any{"tenant": "acme", "retries": 2, "nested": map[string]any{"a": true}},
	}, 5)
	raw := b.enqueue(t, map[string]any{"routing_key": b.queue, "body": "plain text", "content_type": "text/plain"}, 5)
	b.watch.Status(t, id, "done", waitFor)
	b.watch.Status(t, raw, "done", waitFor)

	got := map[string]amqp.Delivery{}
	for _, d := range b.drain(t) {
		got[d.MessageId] = d
	}
	d, ok := got[strconv.FormatInt(id, 10)]
	require.True(t, ok, "message_id is the job id")
	require.JSONEq(t, `{"order": 42}`, string(d.Body))
	require.Equal(t, "application/json", d.ContentType)
	require.Equal(t, amqp.Persistent, d.DeliveryMode)
	require.Equal(t, "acme", d.Headers["tenant"])
	require.InDelta(t, 2, d.Headers["retries"], 0)
	require.Equal(t, amqp.Table{"a": true}, d.Headers["nested"])

	d = got[strconv.FormatInt(raw, 10)]
	require.Equal(t, "plain text", string(d.Body))
	require.Equal(t, "text/plain", d.ContentType)
}

func TestUnroutableFailsTheJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := b.enqueue(t, map[string]any{"routing_key": "no-such-queue-" + b.queue, "body": 1}, 2)
	s := b.watch.Status(t, id, "dead", waitFor)
	require.Equal(t, 2, s.Attempts, "an unroutable message is retried, then dead")
	require.Contains(t, *s.Error, "unroutable")
	require.Contains(t, *s.Error, "NO_ROUTE")
	// The worker keeps publishing.
	ok := b.enqueue(t, map[string]any{"routing_key": b.queue, "body": 1}, 5)
	b.watch.Status(t, ok, "done", waitFor)
}

// After the broker closes every connection, later jobs are delivered, and
// every job marked done had its message confirmed: it is in the queue.
func TestBrokerClosesConnections(t *testing.T) {
	if _, err := exec.LookPath("rabbitmqctl"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("rabbitmqctl is required under CI=true")
		}
		t.Skip("rabbitmqctl is not installed")
	}
	b := setup(t) // not parallel: it closes every connection on the broker
	var ids []int64
	enqueue := func(n int) {
		for range n {
			ids = append(ids, b.enqueue(t, map[string]any{"routing_key": b.queue, "body": 1}, 25))
		}
	}
	enqueue(10)
	for _, id := range ids {
		b.watch.Status(t, id, "done", waitFor)
	}
	out, err := exec.Command("rabbitmqctl", "close_all_connections", "pgdispatch test").CombinedOutput()
	require.NoError(t, err, string(out))
	enqueue(20)
	for _, id := range ids {
		b.watch.Status(t, id, "done", waitFor)
	}
	delivered := map[string]int{}
	for _, d := range b.drain(t) {
		delivered[d.MessageId]++
	}
	for _, id := range ids {
		require.Positive(t, delivered[strconv.FormatInt(id, 10)], "job %d is done, so its message must be in the queue", id)
	}
	t.Logf("%d jobs done, %d distinct messages, %d deliveries", len(ids), len(delivered), sum(delivered))
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func TestUnreachableBrokerRetries(t *testing.T) {
	t.Parallel()
	e, err := rabbitmq.New(rabbitmq.Config{URL: "amqp://guest:s3cret@127.0.0.1:1/", DialTimeout: time.Second})
	require.NoError(t, err)
	defer func() { _ = e.Close() }()
	job := &executors.Job{ID: 1, Attempt: 1, Payload: json.RawMessage(`{"routing_key": "q", "body": 1}`)}
	err = e.Execute(context.Background(), job)
	require.Error(t, err)
	var p *executors.PermanentError
	require.NotErrorAs(t, err, &p, "an unreachable broker is retried")
	require.NotContains(t, err.Error(), "s3cret")
	// A second job within the backoff fails fast without dialling.
	err = e.Execute(context.Background(), job)
	require.ErrorContains(t, err, "next connection attempt in")
}

// AMQP's CC and BCC headers make the broker route a message to more
// queues than its routing key names (sender-selected distribution), and BCC
// hides them from its consumers. A payload may not set them, in any case:
// the job is dead, and nothing reaches the other queue.
func TestCCHeadersAreRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	other := b.queue + "-cc"
	amqptest.Queue(t, b.url, other)
	cc := b.enqueue(t, map[string]any{"routing_key": b.queue, "body": 1, "headers": map[string]any{"CC": []string{other}}}, 3)
	bcc := b.enqueue(t, map[string]any{"routing_key": b.queue, "body": 2, "headers": map[string]any{"BCC": []string{other}}}, 3)
	ok := b.enqueue(t, map[string]any{"routing_key": b.queue, "body": 3, "headers": map[string]any{"note": map[string]any{"CC": "kept"}}}, 3)
	b.watch.Status(t, ok, "done", waitFor)

	final := b.watch.Until(t, waitFor, "both jobs finished", func(m map[int64]pgtest.JobState) bool {
		return (m[cc].Status == "done" || m[cc].Status == "dead") && (m[bcc].Status == "done" || m[bcc].Status == "dead")
	})
	require.Empty(t, amqptest.Drain(t, b.url, other), "no message was copied to the other queue")
	require.Len(t, b.drain(t), 1)
	for id, header := range map[int64]string{cc: "CC", bcc: "BCC"} {
		s := final[id]
		require.Equal(t, "dead", s.Status)
		require.Equal(t, 1, s.Attempts, "refused for good")
		require.Contains(t, *s.Error, "payload.headers."+header+": ")
	}
}

func TestCCHeadersAreRefusedInAnyCase(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"CC", "cc", "Cc", "BCC", "bcc", "bCc"} {
		err := rabbitmq.Validate(json.RawMessage(`{"routing_key": "q", "body": 1, "headers": {"` + name + `": ["elsewhere"]}}`))
		require.ErrorContains(t, err, "payload.headers."+name+": ", name)
		var p *executors.PermanentError
		require.ErrorAs(t, err, &p)
	}
	require.NoError(t, rabbitmq.Validate(json.RawMessage(`{"routing_key": "q", "body": 1, "headers": {"ccx": 1, "x": {"CC": ["q2"]}}}`)))
}
