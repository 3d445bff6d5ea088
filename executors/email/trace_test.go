package email_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/executors/email"
	"github.com/pgdispatch/pgdispatch/internal/testkit/smtptest"
)

// The message carries the attempt's trace context in a Traceparent
// header, its parent the sending's span.
func TestMessageCarriesTheTraceContext(t *testing.T) {
	t.Parallel()
	s := smtptest.Start(t, user, password)
	exec, err := email.New(config(s, password))
	require.NoError(t, err)
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	ctx, attempt := tp.Tracer("test").Start(context.Background(), "process default")
	payload, err := json.Marshal(map[string]any{"to": []string{"ann@example.test"}, "subject": "s", "text": "t"})
	require.NoError(t, err)
	require.NoError(t, exec.Execute(ctx, &executors.Job{ID: 7, Attempt: 1, Payload: payload}))
	attempt.End()

	d := <-s.Received
	ended := spans.GetSpans()
	require.Len(t, ended, 2)
	send := ended[0]
	assert.Equal(t, "smtp send", send.Name)
	assert.Equal(t, attempt.SpanContext().SpanID(), send.Parent.SpanID())
	assert.Equal(t, "00-"+send.SpanContext.TraceID().String()+"-"+send.SpanContext.SpanID().String()+"-01",
		d.Header.Get("Traceparent"))
}
