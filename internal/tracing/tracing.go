// Package tracing carries W3C Trace Context between pgdispatch's writers,
// the attempts of their jobs and the receivers the attempts send to, and
// starts the client spans of the executors.
//
// Nothing here costs anything unless a context carries a span: with
// tracing off, Inject and StartClient return at once.
package tracing

import (
	"context"
	"unicode/utf8"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// The bounds the jobs table puts on a writer's trace context (migration
// 014): 128 bytes of traceparent (version 00 is 55), 512 of tracestate.
const (
	MaxTraceParent = 128
	MaxTraceState  = 512
)

// Scope is the instrumentation scope of pgdispatch's spans.
const Scope = "github.com/pgdispatch/pgdispatch"

// SchemaURL is the semantic conventions the spans' attributes follow.
const SchemaURL = semconv.SchemaURL

// System is the messaging.system of an attempt's spans: no value of the
// conventions names a PostgreSQL job queue, which they allow.
const System = "pgdispatch"

// Parent is the span context a writer's traceparent and tracestate
// describe, marked remote. It is the zero SpanContext, which is not valid,
// when traceparent is empty, too long or malformed (W3C Trace Context,
// level 1: its version, ids and flags in lower-case hex, neither id all
// zeros). A tracestate too long or malformed is left out.
func Parent(traceparent, tracestate string) trace.SpanContext {
	if traceparent == "" || len(traceparent) > MaxTraceParent {
		return trace.SpanContext{}
	}
	if len(tracestate) > MaxTraceState {
		tracestate = ""
	}
	return trace.SpanContextFromContext(propagator.Extract(context.Background(), carrier{traceparent, tracestate}))
}

// Inject sets, in c, the traceparent and tracestate headers of the span
// ctx carries, and reports whether it did: not when ctx carries no valid
// span context. Carriers of pointer shape (propagation.HeaderCarrier, a
// map, a struct of one pointer) cost no allocation when it does not.
func Inject(ctx context.Context, c propagation.TextMapCarrier) bool {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return false
	}
	propagator.Inject(ctx, c)
	return true
}

// Headers are the traceparent and tracestate of the span ctx carries, for
// a writer to store with its job; both are empty when ctx carries none.
func Headers(ctx context.Context) (traceparent, tracestate string) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return "", ""
	}
	c := propagation.MapCarrier{}
	if Inject(ctx, c) {
		traceparent, tracestate = c["traceparent"], c["tracestate"]
	}
	return traceparent, tracestate
}

// StartClient starts a span of kind (client or producer) named name, with
// the attributes attrs returns, a child of the span ctx carries, from that
// span's provider. When ctx carries no recording span (tracing is off, or
// the attempt was not sampled) it starts nothing, does not call attrs, and
// returns ctx and a nil span, so that it costs nothing; End takes the nil
// span.
func StartClient(ctx context.Context, kind trace.SpanKind, name string, attrs func() []attribute.KeyValue) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return ctx, nil
	}
	return parent.TracerProvider().Tracer(Scope, trace.WithSchemaURL(SchemaURL)).
		Start(ctx, name, trace.WithSpanKind(kind), trace.WithAttributes(attrs()...))
}

// End ends span, one of StartClient's, with err as its error when err is
// not nil. It leaves a nil span alone.
func End(span trace.Span, err error) {
	if span == nil {
		return
	}
	if err != nil {
		Fail(span, err.Error())
	}
	span.End()
}

// Fail marks span failed with msg, an error's text as last_error holds it
// (masked), cut to maxStatus bytes.
func Fail(span trace.Span, msg string) {
	if len(msg) > maxStatus {
		n := maxStatus
		for n > 0 && !utf8.RuneStart(msg[n]) {
			n--
		}
		msg = msg[:n] + "…"
	}
	span.SetStatus(codes.Error, msg)
}

// maxStatus bounds a span's error text: a failed attempt's last_error may
// quote a receiver's reply at length.
const maxStatus = 1024
