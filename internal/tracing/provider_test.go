package tracing_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/pgdispatch/pgdispatch/internal/testkit/otlptest"
	"github.com/pgdispatch/pgdispatch/internal/tracing"
)

// clearOTel unsets, for the test, every variable NewProvider decides by.
func clearOTel(t *testing.T) {
	for _, v := range tracing.Variables {
		t.Setenv(v, "")
	}
}

func TestTracingIsOffUnlessTheEnvironmentSaysSo(t *testing.T) {
	for name, env := range map[string]map[string]string{
		"nothing set":            {},
		"sdk disabled":           {"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"},
		"exporter none":          {"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"},
		"a sampler, no endpoint": {"OTEL_TRACES_SAMPLER": "always_on"},
	} {
		t.Run(name, func(t *testing.T) {
			clearOTel(t)
			for k, v := range env {
				t.Setenv(k, v)
			}
			tp, err := tracing.NewProvider(context.Background(), "w1", zaptest.NewLogger(t))
			require.NoError(t, err)
			assert.Nil(t, tp)
		})
	}
	for name, env := range map[string]map[string]string{
		"zipkin": {"OTEL_TRACES_EXPORTER": "zipkin"},
		"grpc":   {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
	} {
		t.Run(name, func(t *testing.T) {
			clearOTel(t)
			for k, v := range env {
				t.Setenv(k, v)
			}
			_, err := tracing.NewProvider(context.Background(), "w1", zaptest.NewLogger(t))
			require.Error(t, err)
			t.Log(err)
		})
	}
}

// With an endpoint, spans go there over OTLP/HTTP, named by
// OTEL_SERVICE_NAME, or pgdispatch.
func TestTracingExportsToTheEnvironmentsEndpoint(t *testing.T) {
	for _, service := range []string{"", "dispatch-eu"} {
		clearOTel(t)
		rcv := otlptest.New(t)
		t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", rcv.URL+"/v1/traces")
		t.Setenv("OTEL_SERVICE_NAME", service)
		tp, err := tracing.NewProvider(context.Background(), "w1", zaptest.NewLogger(t))
		require.NoError(t, err)
		require.NotNil(t, tp)
		_, span := tp.Tracer("test").Start(context.Background(), "a span")
		span.End()
		tracing.Shutdown(context.Background(), tp, zaptest.NewLogger(t))
		spans := rcv.Wait(t, 10*time.Second, func(s []otlptest.Span) bool { return len(s) == 1 })
		want := service
		if want == "" {
			want = "pgdispatch"
		}
		assert.Equal(t, want, spans[0].Resource["service.name"])
		assert.Equal(t, "w1", spans[0].Resource["service.instance.id"])
	}
}
