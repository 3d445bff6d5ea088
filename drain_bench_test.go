package pgdispatch_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/pgdispatch/pgdispatch"
	"github.com/pgdispatch/pgdispatch/claimer"
	"github.com/pgdispatch/pgdispatch/executors"
	"github.com/pgdispatch/pgdispatch/internal/testkit/otlptest"
	"github.com/pgdispatch/pgdispatch/internal/testkit/pgtest"
)

// BenchmarkNoopDrain drains b.N noop jobs with one worker, tracing off:
// its allocs/op are the worker's allocations per job (its start is spread
// over the jobs: run it with -benchtime=20000x or more). Compare builds
// with benchstat; timings on a shared machine are the bench command's.
func BenchmarkNoopDrain(b *testing.B) { drain(b, nil) }

// BenchmarkNoopDrainTraced is BenchmarkNoopDrain with every attempt traced
// and exported in batches to an OTLP/HTTP receiver in the process.
func BenchmarkNoopDrainTraced(b *testing.B) {
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(otlptest.New(b).URL+"/v1/traces"))
	require.NoError(b, err)
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	drain(b, tp)
}

func drain(b *testing.B, tp trace.TracerProvider) {
	schema := pgtest.Schema(b)
	pool := pgtest.Pool(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	_, err := pool.Exec(ctx, "INSERT INTO "+pgx.Identifier{schema, "jobs"}.Sanitize()+" (kind) SELECT 'noop' FROM generate_series(1, $1)", b.N)
	require.NoError(b, err)
	reg := executors.NewRegistry()
	reg.Register(executors.KindNoop, executors.Noop{})
	done := &counter{want: int64(b.N), all: make(chan struct{})}
	w, err := pgdispatch.NewWorker(pgdispatch.Config{
		Pool: pool, Schema: schema, WorkerID: "bench", Registry: reg, Observer: done, Logger: zap.NewNop(),
		TracerProvider: tp,
		Options:        claimer.Options{PollInterval: time.Hour},
	})
	require.NoError(b, err)
	runCtx, stop := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	b.ReportAllocs()
	b.ResetTimer()
	go func() { stopped <- w.Run(runCtx) }()
	select {
	case <-done.all:
	case <-ctx.Done():
		b.Fatal("the drain did not end")
	}
	b.StopTimer()
	stop()
	require.NoError(b, <-stopped)
}

// counter closes all once want jobs finished.
type counter struct {
	n, want int64
	all     chan struct{}
}

func (c *counter) JobStarted(*executors.Job) {}

func (c *counter) JobFinished(*executors.Job, claimer.Outcome, time.Duration) {
	if atomic.AddInt64(&c.n, 1) == c.want {
		close(c.all)
	}
}
