package tracing_test

import (
	"context"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgdispatch/pgdispatch/internal/tracing"
)

const valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func TestParent(t *testing.T) {
	t.Parallel()
	sc := tracing.Parent(valid, "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7")
	require.True(t, sc.IsValid())
	assert.True(t, sc.IsRemote())
	assert.True(t, sc.IsSampled())
	assert.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", sc.TraceID().String())
	assert.Equal(t, "00f067aa0ba902b7", sc.SpanID().String())
	assert.Equal(t, "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7", sc.TraceState().String())

	for name, tp := range map[string]string{
		"empty":          "",
		"upper case":     strings.ToUpper(valid),
		"zero trace id":  "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
		"zero span id":   "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
		"version ff":     "ff" + valid[2:],
		"short":          valid[:40],
		"header smuggle": valid + "\r\nX-Evil: 1",
		"too long":       "01" + valid[2:] + "-" + strings.Repeat("a", tracing.MaxTraceParent),
		"not hex":        "00-4bf92f3577b34da6a3ce929d0e0e47zz-00f067aa0ba902b7-01",
	} {
		assert.False(t, tracing.Parent(tp, "").IsValid(), name)
	}
	// A tracestate malformed or too long is left out; the parent stands.
	for _, ts := range []string{"=,=", strings.Repeat("a=b,", tracing.MaxTraceState)} {
		sc := tracing.Parent(valid, ts)
		assert.True(t, sc.IsValid())
		assert.Empty(t, sc.TraceState().String())
	}
}

func FuzzParent(f *testing.F) {
	f.Add(valid, "rojo=00f067aa0ba902b7")
	f.Add("00-"+strings.Repeat("f", 32)+"-"+strings.Repeat("f", 16)+"-ff", "")
	f.Fuzz(func(t *testing.T, traceparent, tracestate string) {
		sc := tracing.Parent(traceparent, tracestate)
		if !sc.IsValid() {
			return
		}
		// A valid parent goes on as the W3C header it is, and nothing else.
		ctx := trace.ContextWithRemoteSpanContext(context.Background(), sc)
		h := propagation.MapCarrier{}
		require.True(t, tracing.Inject(ctx, h))
		require.Len(t, h["traceparent"], 55)
		require.NotContains(t, h["traceparent"]+h["tracestate"], "\n")
		require.Equal(t, sc, tracing.Parent(h["traceparent"], h["tracestate"]))
	})
}

func TestInjectWithoutSpanSetsNothing(t *testing.T) {
	t.Parallel()
	h := propagation.MapCarrier{}
	assert.False(t, tracing.Inject(context.Background(), h))
	assert.Empty(t, h)
	tp, ts := tracing.Headers(context.Background())
	assert.Empty(t, tp+ts)
	ctx, span := tracing.StartClient(context.Background(), trace.SpanKindClient, "x", func() []attribute.KeyValue {
		t.Fatal("attributes built with tracing off")
		return nil
	})
	assert.Nil(t, span)
	assert.Equal(t, context.Background(), ctx)
	tracing.End(span, nil)
}

func TestInjectDoesNotAllocateWithTracingOff(t *testing.T) {
	h := propagation.HeaderCarrier{}
	ctx := context.Background()
	assert.Zero(t, testing.AllocsPerRun(100, func() { tracing.Inject(ctx, h) }))
}
