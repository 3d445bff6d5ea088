package tracing

import (
	"go.opentelemetry.io/otel/propagation"
)

// propagator is the W3C Trace Context: pgdispatch reads and writes
// traceparent and tracestate whatever the process's global propagator.
var propagator propagation.TraceContext

// carrier reads a writer's stored trace context.
type carrier struct{ traceparent, tracestate string }

func (c carrier) Get(key string) string {
	switch key {
	case "traceparent":
		return c.traceparent
	case "tracestate":
		return c.tracestate
	}
	return ""
}

func (carrier) Set(string, string) {}

func (carrier) Keys() []string { return []string{"traceparent", "tracestate"} }
