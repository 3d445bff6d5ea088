package pgdispatch_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/internal/testkit/otlptest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
	"github.com/pgdispatch/pgdispatch/internal/tracing"
)

// traced is a test's tracing: a real OTLP/HTTP receiver, the provider
// that exports to it as each span ends, and a webhook receiver that
// records the traceparent of each request by path.
type traced struct {
	*bundle
	otlp    *otlptest.Receiver
	hook    *httptest.Server
	mu      sync.Mutex
	parents map[string][]string // path → traceparent of each request
	logs    *observer.ObservedLogs
}

func setupTraced(t *testing.T) (*traced, pgdispatch.Config) {
	t.Helper()
	b := setup(t)
	registerHTTP(t, b)
	tr := &traced{bundle: b, otlp: otlptest.New(t), parents: map[string][]string{}}
	// /fail2 fails its first two requests (the attempt number is a header).
	tr.hook = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tr.mu.Lock()
		tr.parents[r.URL.Path] = append(tr.parents[r.URL.Path], r.Header.Get("traceparent"))
		tr.mu.Unlock()
		if r.URL.Path == "/fail2" && r.Header.Get("Pgdispatch-Attempt") != "3" {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(tr.hook.Close)
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(tr.otlp.URL+"/v1/traces"))
	require.NoError(t, err)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	cfg := b.config(t, "w1")
	cfg.TracerProvider = tp
	cfg.RetryBackoff = func(int) time.Duration { return time.Millisecond }
	core, logs := observer.New(zapcore.DebugLevel)
	cfg.Logger = zap.New(zapcore.NewTee(cfg.Logger.Core(), core))
	tr.logs = logs
	return tr, cfg
}

func (tr *traced) enqueue(t *testing.T, path, traceparent string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id, err := pgdispatch.Schema(tr.schema).Enqueue(ctx, pgtest.Pool(t), pgdispatch.Job{
		Kind: "http_callback", Payload: map[string]any{"url": tr.hook.URL + path}, TraceParent: traceparent,
		TraceState: "vendor=abc",
	})
	require.NoError(t, err)
	return id
}

func (tr *traced) requests(path string) []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return append([]string(nil), tr.parents[path]...)
}

// attempts are the attempt spans of job id, in attempt order, once n of
// them and all their children have arrived.
func attemptsOf(t *testing.T, rcv *otlptest.Receiver, id string, n int) (attempts []otlptest.Span, children map[string][]otlptest.Span) {
	t.Helper()
	rcv.Wait(t, waitFor, func(spans []otlptest.Span) bool {
		attempts, children = nil, map[string][]otlptest.Span{}
		for _, s := range spans {
			if s.Name == "process default" && s.Attrs["messaging.message.id"] == id {
				attempts = append(attempts, s)
			}
			children[s.ParentSpanID] = append(children[s.ParentSpanID], s)
		}
		if len(attempts) < n {
			return false
		}
		for _, a := range attempts { // wait, claim, POST, complete
			if len(children[a.SpanID]) < 4 {
				return false
			}
		}
		return true
	})
	require.Len(t, attempts, n)
	for i := range attempts {
		for j := i + 1; j < len(attempts); j++ {
			if attempts[j].Attrs["pgdispatch.job.attempt"].(int64) < attempts[i].Attrs["pgdispatch.job.attempt"].(int64) {
				attempts[i], attempts[j] = attempts[j], attempts[i]
			}
		}
	}
	return attempts, children
}

func byName(spans []otlptest.Span) map[string]otlptest.Span {
	m := map[string]otlptest.Span{}
	for _, s := range spans {
		m[s.Name] = s
	}
	return m
}

// Acceptance: a job inserted with the writer's traceparent, which fails
// twice, shows three attempt spans in the writer's trace, each a child of
// the writer's span, with its wait, claim, HTTP request and outcome write;
// each request carried the trace to the receiver, and the job's log lines
// carry its trace id.
func TestTraceOfARetriedWebhookContinuesTheWriters(t *testing.T) {
	t.Parallel()
	tr, cfg := setupTraced(t)
	start(t, cfg)
	const traceID, writerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	id := tr.enqueue(t, "/fail2", "00-"+traceID+"-"+writerSpan+"-01")

	attempts, children := attemptsOf(t, tr.otlp, strconv.FormatInt(id, 10), 3)
	for i, a := range attempts {
		n := int64(i + 1)
		assert.Equal(t, traceID, a.TraceID, "attempt %d", n)
		assert.Equal(t, writerSpan, a.ParentSpanID, "attempt %d is a child of the writer's span", n)
		assert.Equal(t, tracepb.Span_SPAN_KIND_CONSUMER, a.Kind)
		assert.Equal(t, n, a.Attrs["pgdispatch.job.attempt"])
		assert.Equal(t, "pgdispatch", a.Attrs["messaging.system"])
		assert.Equal(t, "process", a.Attrs["messaging.operation.type"])
		assert.Equal(t, "default", a.Attrs["messaging.destination.name"])
		assert.Equal(t, "http_callback", a.Attrs["pgdispatch.job.kind"])
		assert.Equal(t, "parent", a.Attrs["pgdispatch.trace.writer"])
		kids := byName(children[a.SpanID])
		require.Contains(t, kids, "wait")
		require.Contains(t, kids, "claim default")
		require.Contains(t, kids, "POST")
		require.Contains(t, kids, "complete default")
		assert.Contains(t, kids["wait"].Attrs, "pgdispatch.job.run_at")
		assert.Contains(t, kids["wait"].Attrs, "pgdispatch.job.claimed_at")
		assert.GreaterOrEqual(t, kids["claim default"].Attrs["messaging.batch.message_count"], int64(1))
		assert.Equal(t, "receive", kids["claim default"].Attrs["messaging.operation.type"])
		assert.Equal(t, "settle", kids["complete default"].Attrs["messaging.operation.type"])
		assert.Equal(t, tracepb.Span_SPAN_KIND_CLIENT, kids["POST"].Kind)
		assert.Equal(t, "POST", kids["POST"].Attrs["http.request.method"])
		assert.Equal(t, "127.0.0.1", kids["POST"].Attrs["server.address"])
		assert.False(t, a.End.Before(kids["complete default"].End), "the attempt ends with its outcome written")
		if n < 3 {
			assert.Equal(t, "retry", a.Attrs["pgdispatch.job.outcome"])
			assert.True(t, a.Error)
			assert.Contains(t, a.Message, "503")
			assert.Equal(t, int64(503), kids["POST"].Attrs["http.response.status_code"])
		} else {
			assert.Equal(t, "done", a.Attrs["pgdispatch.job.outcome"])
			assert.False(t, a.Error)
			assert.Equal(t, int64(204), kids["POST"].Attrs["http.response.status_code"])
		}
		t.Logf("attempt %d: %s from due to written, wait %s", n, a.End.Sub(a.Start), kids["wait"].End.Sub(kids["wait"].Start))
	}

	t.Logf("the trace, as docs/operations.md renders it:\n%s", render(attempts, children))

	// The receiver's trace continues the job's: its parent is the request's span.
	reqs := tr.requests("/fail2")
	require.Len(t, reqs, 3)
	for i, tp := range reqs {
		post := byName(children[attempts[i].SpanID])["POST"]
		assert.Equal(t, "00-"+traceID+"-"+post.SpanID+"-01", tp, "request %d", i+1)
	}

	// The job's log lines carry its trace id.
	started := tr.logs.FilterMessage("job started").FilterField(zap.Int64("job_id", id)).All()
	require.Len(t, started, 3)
	for _, e := range started {
		assert.Equal(t, traceID, e.ContextMap()["trace_id"])
	}
}

// Acceptance: a job without a traceparent, or with a malformed one,
// starts a trace of its own, which the receiver continues.
func TestTraceOfAJobWithoutWriterStartsANewOne(t *testing.T) {
	t.Parallel()
	tr, cfg := setupTraced(t)
	start(t, cfg)
	for _, c := range []struct{ path, traceparent, writer string }{
		{"/none", "", "none"},
		{"/malformed", "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", "malformed"}, // upper case: not W3C
		{"/zeros", "00-00000000000000000000000000000000-00f067aa0ba902b7-01", "malformed"},
		{"/hostile", "00-" + strings.Repeat("a", 32) + "-" + strings.Repeat("b", 16) + "-01\r\nX-Injected: 1", "malformed"},
	} {
		id := tr.enqueue(t, c.path, c.traceparent)
		attempts, children := attemptsOf(t, tr.otlp, strconv.FormatInt(id, 10), 1)
		a := attempts[0]
		assert.Empty(t, a.ParentSpanID, "%s: the attempt is a root", c.path)
		assert.NotEqual(t, strings.Repeat("0", 32), a.TraceID)
		assert.NotContains(t, c.traceparent, a.TraceID)
		assert.Equal(t, c.writer, a.Attrs["pgdispatch.trace.writer"], c.path)
		assert.Equal(t, "done", a.Attrs["pgdispatch.job.outcome"])
		post := byName(children[a.SpanID])["POST"]
		assert.Equal(t, []string{"00-" + a.TraceID + "-" + post.SpanID + "-01"}, tr.requests(c.path), c.path)
	}

	// The table refuses a traceparent longer than a header's worth.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := pgdispatch.Schema(tr.schema).Enqueue(ctx, pgtest.Pool(t), pgdispatch.Job{
		Kind: "http_callback", TraceParent: strings.Repeat("a", 129),
	})
	require.ErrorContains(t, err, "jobs_traceparent_length")
}

// Enqueue stores the trace context of the span its context carries, unless
// the job names one.
func TestEnqueueStoresTheTraceContextOfItsContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	sc := tracing.Parent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "rojo=1")
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	stored := func(job pgdispatch.Job) (tp, ts *string) {
		id, err := pgdispatch.Schema(b.schema).Enqueue(ctx, pgtest.Pool(t), job)
		require.NoError(t, err)
		require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "SELECT traceparent, tracestate FROM "+b.jobs+" WHERE id = $1", id).Scan(&tp, &ts))
		return tp, ts
	}
	tp, ts := stored(pgdispatch.Job{Kind: "record"})
	require.NotNil(t, tp)
	assert.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", *tp)
	assert.Equal(t, "rojo=1", *ts)
	tp, ts = stored(pgdispatch.Job{Kind: "record", TraceParent: "00-11111111111111111111111111111111-2222222222222222-00"})
	assert.Equal(t, "00-11111111111111111111111111111111-2222222222222222-00", *tp)
	assert.Nil(t, ts)
	id, err := pgdispatch.Schema(b.schema).EnqueueChecked(context.Background(), pgtest.Pool(t), pgdispatch.Job{Kind: "record"})
	require.NoError(t, err)
	require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "SELECT traceparent FROM "+b.jobs+" WHERE id = $1", id.ID).Scan(&tp))
	assert.Nil(t, tp, "no span, no trace context")
}

// render draws attempts and their children as a text tree, each span with
// its start from the first attempt's and its duration.
func render(attempts []otlptest.Span, children map[string][]otlptest.Span) string {
	var b strings.Builder
	t0 := attempts[0].Start
	line := func(prefix string, s otlptest.Span, attrs ...string) {
		fmt.Fprintf(&b, "%-34s %9.1f ms  %8.1f ms ", prefix+s.Name, float64(s.Start.Sub(t0).Microseconds())/1000,
			float64(s.End.Sub(s.Start).Microseconds())/1000)
		for _, k := range attrs {
			if v, ok := s.Attrs[k]; ok {
				fmt.Fprintf(&b, " %s=%v", k, v)
			}
		}
		if s.Error {
			fmt.Fprintf(&b, " ERROR %q", s.Message)
		}
		b.WriteString("\n")
	}
	for _, a := range attempts {
		line("", a, "pgdispatch.job.attempt", "pgdispatch.job.outcome")
		kids := children[a.SpanID]
		slices.SortFunc(kids, func(x, y otlptest.Span) int { return x.Start.Compare(y.Start) })
		for j, k := range kids {
			p := "├─ "
			if j == len(kids)-1 {
				p = "└─ "
			}
			line(p, k, "messaging.batch.message_count", "http.response.status_code")
		}
	}
	return b.String()
}

// A job cancelled while it runs ends its attempt's span, cancelled, with
// no outcome written.
func TestTraceOfACancelledJob(t *testing.T) {
	t.Parallel()
	tr, cfg := setupTraced(t)
	start(t, cfg)
	id := tr.insert(t, "INSERT INTO "+tr.jobs+" (kind, payload) VALUES ('record', '{\"block\": true}') RETURNING id")
	tr.rec.waitStart(t, id, waitFor)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := pgtest.Pool(t).Exec(ctx, "SELECT * FROM "+pgx.Identifier{tr.schema, "cancel"}.Sanitize()+"($1)", id)
	require.NoError(t, err)
	spans := tr.otlp.Wait(t, waitFor, func(spans []otlptest.Span) bool {
		for _, s := range spans {
			if s.Name == "process default" && s.Attrs["messaging.message.id"] == strconv.FormatInt(id, 10) {
				return true
			}
		}
		return false
	})
	var a otlptest.Span
	for _, s := range spans {
		if s.Name == "process default" {
			a = s
		}
	}
	assert.Equal(t, "cancelled", a.Attrs["pgdispatch.job.outcome"])
	assert.True(t, a.Error)
	assert.Equal(t, "none", a.Attrs["pgdispatch.trace.writer"])
	for _, s := range spans {
		assert.NotEqual(t, "complete default", s.Name, "a cancelled run writes no outcome")
	}
}
