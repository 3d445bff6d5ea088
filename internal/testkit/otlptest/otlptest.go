// Package otlptest is an OTLP/HTTP trace receiver for tests: a real HTTP
// server that decodes the protocol's protobuf (go.opentelemetry.io/proto/otlp)
// and keeps the spans it receives.
package otlptest

import (
	"compress/gzip"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	collectorpb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Span is a span as received, its ids in hex.
type Span struct {
	TraceID, SpanID, ParentSpanID string // ParentSpanID is empty for a root
	Name                          string
	Kind                          tracepb.Span_SpanKind
	Attrs                         map[string]any // string, int64, float64 or bool
	Resource                      map[string]any
	Start, End                    time.Time
	Error                         bool   // its status is an error
	Message                       string // its status's message
}

// Receiver receives spans at URL/v1/traces.
type Receiver struct {
	URL     string // the server's base URL; spans go to URL + "/v1/traces"
	mu      sync.Mutex
	spans   []Span
	changed chan struct{} // closed and replaced at each export
}

// New starts a Receiver, closed when the test ends.
func New(t testing.TB) *Receiver {
	r := &Receiver{changed: make(chan struct{})}
	srv := httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(srv.Close)
	r.URL = srv.URL
	return r
}

func (r *Receiver) serve(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
		http.NotFound(w, req)
		return
	}
	body := io.Reader(req.Body)
	if req.Header.Get("Content-Encoding") == "gzip" {
		gz, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = gz
	}
	raw, err := io.ReadAll(io.LimitReader(body, 64<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var msg collectorpb.ExportTraceServiceRequest
	if err := proto.Unmarshal(raw, &msg); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var got []Span
	for _, rs := range msg.GetResourceSpans() {
		res := attrs(rs.GetResource().GetAttributes())
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				got = append(got, Span{
					TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
					ParentSpanID: hex.EncodeToString(s.GetParentSpanId()), Name: s.GetName(), Kind: s.GetKind(),
					Attrs: attrs(s.GetAttributes()), Resource: res,
					Start:   time.Unix(0, int64(s.GetStartTimeUnixNano())), //nolint:gosec // a time
					End:     time.Unix(0, int64(s.GetEndTimeUnixNano())),   //nolint:gosec // a time
					Error:   s.GetStatus().GetCode() == tracepb.Status_STATUS_CODE_ERROR,
					Message: s.GetStatus().GetMessage(),
				})
			}
		}
	}
	out, _ := proto.Marshal(&collectorpb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
	r.mu.Lock()
	r.spans = append(r.spans, got...)
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

func attrs(kvs []*commonpb.KeyValue) map[string]any {
	m := make(map[string]any, len(kvs))
	for _, kv := range kvs {
		switch v := kv.GetValue().GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			m[kv.GetKey()] = v.StringValue
		case *commonpb.AnyValue_IntValue:
			m[kv.GetKey()] = v.IntValue
		case *commonpb.AnyValue_DoubleValue:
			m[kv.GetKey()] = v.DoubleValue
		case *commonpb.AnyValue_BoolValue:
			m[kv.GetKey()] = v.BoolValue
		}
	}
	return m
}

// Spans are the spans received so far.
func (r *Receiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// Wait waits until done says yes to the spans received, and returns them;
// it fails the test after timeout.
func (r *Receiver) Wait(t testing.TB, timeout time.Duration, done func([]Span) bool) []Span {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		spans, changed := append([]Span(nil), r.spans...), r.changed
		r.mu.Unlock()
		if done(spans) {
			return spans
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("the spans awaited did not arrive within %s; received %d: %v", timeout, len(spans), names(spans))
			return nil
		}
	}
}

func names(spans []Span) []string {
	n := make([]string, len(spans))
	for i, s := range spans {
		n[i] = s.Name
	}
	return n
}
