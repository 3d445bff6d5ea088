package rabbitmq_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgdispatch/pgdispatch/executors"
)

// The message carries the attempt's trace context in its headers, its
// parent the publishing's span, over the payload's own traceparent.
func TestMessageCarriesTheTraceContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	ctx, attempt := tp.Tracer("test").Start(context.Background(), "process default")
	payload, err := json.Marshal(map[string]any{
		"routing_key": b.queue, "body": "x",
		"headers": map[string]any{"traceparent": "00-11111111111111111111111111111111-2222222222222222-01"},
	})
	require.NoError(t, err)
	require.NoError(t, b.exec.Execute(ctx, &executors.Job{ID: 7, Attempt: 1, Payload: payload}))
	attempt.End()

	got := b.drain(t)
	require.Len(t, got, 1)
	ended := spans.GetSpans()
	require.Len(t, ended, 2)
	send := ended[0]
	assert.Equal(t, "send ", send.Name) // the default exchange has no name
	assert.Equal(t, trace.SpanKindProducer, send.SpanKind)
	assert.Equal(t, attempt.SpanContext().SpanID(), send.Parent.SpanID())
	assert.Equal(t, "00-"+send.SpanContext.TraceID().String()+"-"+send.SpanContext.SpanID().String()+"-01",
		got[0].Headers["traceparent"])
}
