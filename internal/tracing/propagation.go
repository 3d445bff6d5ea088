package tracing

import (
	"go.opentelemetry.io/otel/propagation"
)

// propagator is the W3C Trace Context: pgdispatch reads and writes
// traceparent and tracestate whatever the process's global propagator.
var propagator propagation.TraceContext

// carrier adapts a getter or a setter to a TextMapCarrier, so that headers
// of any shape (http.Header, amqp.Table, an email's) take the context
// without a map in between.
type carrier struct {
	get func(string) string
	set func(string, string)
}

func (c carrier) Get(key string) string {
	if c.get == nil {
		return ""
	}
	return c.get(key)
}

func (c carrier) Set(key, value string) {
	if c.set != nil {
		c.set(key, value)
	}
}

func (c carrier) Keys() []string { return []string{"traceparent", "tracestate"} }
