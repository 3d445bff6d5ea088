// Package jobtrace traces a claimer's attempts with OpenTelemetry. Each
// attempt is a span, a child of the writer's span when the job carries a
// valid traceparent (then every attempt of the job is in the writer's
// trace), else the root of a trace of its own. The attempt's span covers
// the attempt from the job's due time to its outcome written, and holds
// the spans of its parts:
//
//	process <queue>    the attempt: kind, attempt number, outcome, error
//	├─ wait            from the job's due time to its claim's sending
//	├─ claim           the claim statement that took it, and its batch size
//	├─ (the executor's client spans: POST, publish, send)
//	└─ complete        the statement that wrote its outcome
//
// A Tracer is nil when tracing is off, and the claimer then calls none of
// its methods: an attempt costs nothing more.
package jobtrace

import (
	"context"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgdispatch/pgdispatch/claimer/internal/runstate"
	"github.com/pgdispatch/pgdispatch/internal/tracing"
)

// Attribute keys of pgdispatch's own, where the conventions have none.
const (
	KeyKind        = attribute.Key("pgdispatch.job.kind")
	KeyAttempt     = attribute.Key("pgdispatch.job.attempt")
	KeyMaxAttempts = attribute.Key("pgdispatch.job.max_attempts")
	KeyPriority    = attribute.Key("pgdispatch.job.priority")
	KeyOutcome     = attribute.Key("pgdispatch.job.outcome")
	KeyRetryIn     = attribute.Key("pgdispatch.job.retry_in_ms")
	KeyCreatedAt   = attribute.Key("pgdispatch.job.created_at")
	KeyRunAt       = attribute.Key("pgdispatch.job.run_at")
	KeyClaimedAt   = attribute.Key("pgdispatch.job.claimed_at")
	KeyClaimLimit  = attribute.Key("pgdispatch.claim.limit")
	KeyWriterLink  = attribute.Key("pgdispatch.trace.writer") // "parent", or "malformed" when the job's traceparent was ignored
)

// outcomes name the verdicts as the claimer's Observer does.
var outcomes = [...]string{
	runstate.Done: "done", runstate.Retry: "retry", runstate.Dead: "dead",
	runstate.Snoozed: "snoozed", runstate.Released: "released", runstate.Dropped: "cancelled",
}

// Tracer traces the attempts of one claimer's queue.
type Tracer struct {
	tracer trace.Tracer
	queue  string
	spans  sync.Map // *runstate.Run → trace.Span, from the claim to the outcome written
	// writers are the trace contexts the writers stored with the jobs of
	// the claim being read: *runstate.Run → stored.
	writers sync.Map
}

// stored is a job's traceparent and tracestate, as stored.
type stored struct{ traceparent, tracestate string }

// Writer records the traceparent and tracestate stored with r's job, read
// by its claim.
func (t *Tracer) Writer(r *runstate.Run, traceparent, tracestate string) {
	t.writers.Store(r, stored{traceparent, tracestate})
}

// Forget forgets the writers of runs, whose claim failed.
func (t *Tracer) Forget(runs []*runstate.Run) {
	for _, r := range runs {
		t.writers.Delete(r)
	}
}

// New returns the Tracer of queue, or nil when tp is nil: tracing is off.
func New(tp trace.TracerProvider, queue string) *Tracer {
	if tp == nil {
		return nil
	}
	return &Tracer{tracer: tp.Tracer(tracing.Scope, trace.WithSchemaURL(tracing.SchemaURL)), queue: queue}
}

// Claimed starts the attempt spans of runs, taken by a claim of at most
// limit jobs sent at sent and read at read, each with its wait and claim.
func (t *Tracer) Claimed(runs []*runstate.Run, limit int, sent, read time.Time) {
	for _, r := range runs {
		t.claimed(r, len(runs), limit, sent, read)
	}
}

func (t *Tracer) claimed(r *runstate.Run, batch, limit int, sent, read time.Time) {
	job := r.Job
	ctx := context.Background()
	writer := "none"
	if w, ok := t.writers.LoadAndDelete(r); ok {
		w := w.(stored)
		if parent := tracing.Parent(w.traceparent, w.tracestate); parent.IsValid() {
			ctx, writer = trace.ContextWithRemoteSpanContext(ctx, parent), "parent"
		} else {
			writer = "malformed"
		}
	}
	// The job was due at run_at, or at its insert if later; the database's
	// clock says so, and a skewed one must not start it after its claim.
	due := job.RunAt
	if job.CreatedAt.After(due) {
		due = job.CreatedAt
	}
	if due.After(sent) {
		due = sent
	}
	ctx, span := t.tracer.Start(ctx, "process "+t.queue,
		trace.WithSpanKind(trace.SpanKindConsumer), trace.WithTimestamp(due),
		trace.WithAttributes(
			semconv.MessagingSystemKey.String(tracing.System),
			semconv.MessagingOperationTypeProcess,
			semconv.MessagingOperationName("process"),
			semconv.MessagingDestinationName(t.queue),
			semconv.MessagingMessageID(strconv.FormatInt(job.ID, 10)),
			KeyKind.String(job.Kind),
			KeyAttempt.Int(job.Attempt),
			KeyMaxAttempts.Int(job.MaxAttempts),
			KeyPriority.Int(int(job.Priority)),
			KeyWriterLink.String(writer),
		))
	if !span.IsRecording() {
		// Not sampled: the context still goes to the receivers.
		t.spans.Store(r, span)
		return
	}
	_, wait := t.tracer.Start(ctx, "wait", trace.WithTimestamp(due), trace.WithAttributes(
		KeyCreatedAt.String(job.CreatedAt.UTC().Format(time.RFC3339Nano)),
		KeyRunAt.String(job.RunAt.UTC().Format(time.RFC3339Nano)),
		KeyClaimedAt.String(r.ClaimedAt.UTC().Format(time.RFC3339Nano)),
	))
	wait.End(trace.WithTimestamp(sent))
	_, claim := t.tracer.Start(ctx, "claim "+t.queue, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithTimestamp(sent), trace.WithAttributes(
			semconv.MessagingSystemKey.String(tracing.System),
			semconv.MessagingOperationTypeReceive,
			semconv.MessagingOperationName("claim"),
			semconv.MessagingDestinationName(t.queue),
			semconv.MessagingBatchMessageCount(batch),
			KeyClaimLimit.Int(limit),
			semconv.DBSystemNamePostgreSQL,
		))
	claim.End(trace.WithTimestamp(read))
	t.spans.Store(r, span)
}

// Context is ctx with the attempt span of r, for its executor: its client
// spans are the attempt's children, and it sends the attempt's context on.
func (t *Tracer) Context(ctx context.Context, r *runstate.Run) context.Context {
	s, ok := t.spans.Load(r)
	if !ok {
		return ctx
	}
	return trace.ContextWithSpan(ctx, s.(trace.Span))
}

// TraceID is the trace id of r's attempt, for its log lines; empty when
// it has none.
func (t *Tracer) TraceID(r *runstate.Run) string {
	s, ok := t.spans.Load(r)
	if !ok {
		return ""
	}
	return s.(trace.Span).SpanContext().TraceID().String()
}

// Reported hears of o, the outcome of an attempt as its run's Tracker
// recorded it. An outcome that is not written (Dropped: the run was
// stopped) ends the attempt's span; the others end it once written
// (Written), which may come first: the completer may write an outcome
// before its attempt's goroutine gets here.
func (t *Tracer) Reported(o runstate.Outcome) {
	if o.Verdict != runstate.Dropped {
		return
	}
	s, ok := t.spans.LoadAndDelete(o.Run)
	if !ok {
		return
	}
	span := s.(trace.Span)
	setOutcome(span, o)
	span.End()
}

// setOutcome sets o's attributes, and its error, on its attempt's span.
func setOutcome(span trace.Span, o runstate.Outcome) {
	span.SetAttributes(KeyOutcome.String(outcomes[o.Verdict]))
	switch o.Verdict {
	case runstate.Retry, runstate.Snoozed:
		span.SetAttributes(KeyRetryIn.Int64(o.Delay.Milliseconds()))
	}
	switch {
	case (o.Verdict == runstate.Retry || o.Verdict == runstate.Dead) && o.Err != nil:
		span.SetAttributes(semconv.ErrorTypeKey.String(errorType(o.Verdict)))
		tracing.Fail(span, *o.Err)
	case o.Verdict == runstate.Dropped && o.Cause != nil:
		span.SetAttributes(semconv.ErrorTypeKey.String("cancelled"))
		tracing.Fail(span, o.Cause.Error())
	}
}

// errorType is an attempt's error.type: whether the job is tried again.
func errorType(v runstate.Verdict) string {
	if v == runstate.Retry {
		return "retry"
	}
	return "dead"
}

// Written ends the attempt spans of batch, whose outcomes one write (or
// two: done jobs deleted apart) recorded from start to end, each with a
// span of that write.
func (t *Tracer) Written(batch []runstate.Outcome, start, end time.Time) {
	for _, o := range batch {
		s, ok := t.spans.LoadAndDelete(o.Run)
		if !ok {
			continue
		}
		span := s.(trace.Span)
		if span.IsRecording() {
			setOutcome(span, o)
			ctx := trace.ContextWithSpan(context.Background(), span)
			_, w := t.tracer.Start(ctx, "complete "+t.queue, trace.WithSpanKind(trace.SpanKindClient),
				trace.WithTimestamp(start), trace.WithAttributes(
					semconv.MessagingSystemKey.String(tracing.System),
					semconv.MessagingOperationTypeSettle,
					semconv.MessagingOperationName("complete"),
					semconv.MessagingDestinationName(t.queue),
					semconv.MessagingBatchMessageCount(len(batch)),
					KeyOutcome.String(outcomes[o.Verdict]),
					semconv.DBSystemNamePostgreSQL,
				))
			w.End(trace.WithTimestamp(end))
		}
		span.End(trace.WithTimestamp(end))
	}
}
