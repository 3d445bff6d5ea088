package tracing

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.uber.org/zap"
)

// Variables are the standard OpenTelemetry variables docs/reference.md
// lists: those NewProvider reads, and those the SDK reads for it.
var Variables = []string{
	"OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER",
	"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
	"OTEL_EXPORTER_OTLP_PROTOCOL", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
	"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_EXPORTER_OTLP_COMPRESSION",
	"OTEL_EXPORTER_OTLP_CERTIFICATE", "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "OTEL_EXPORTER_OTLP_CLIENT_KEY",
	"OTEL_EXPORTER_OTLP_INSECURE",
	"OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES",
	"OTEL_BSP_SCHEDULE_DELAY", "OTEL_BSP_EXPORT_TIMEOUT", "OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
	"OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT",
}

// shutdownTimeout bounds the export of the last spans at exit.
const shutdownTimeout = 5 * time.Second

// NewProvider builds the TracerProvider of the worker workerID (its
// service.instance.id) from the standard OpenTelemetry environment, as
// pgdispatch run does, or returns nil when that leaves tracing off:
// OTEL_SDK_DISABLED=true, OTEL_TRACES_EXPORTER=none, or neither
// OTEL_TRACES_EXPORTER=otlp nor an OTLP endpoint
// (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT). Spans
// go to the collector over OTLP/HTTP (protobuf); the SDK reads the rest of
// the environment itself: the endpoint and its headers, timeout,
// compression and certificates, the sampler (OTEL_TRACES_SAMPLER and its
// _ARG, default parentbased_always_on), the batching (OTEL_BSP_*), the span
// limits and the resource (OTEL_SERVICE_NAME, default pgdispatch, and
// OTEL_RESOURCE_ATTRIBUTES). docs/reference.md lists them.
func NewProvider(ctx context.Context, workerID string, logger *zap.Logger) (*sdktrace.TracerProvider, error) {
	if strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true") {
		return nil, nil
	}
	switch exporter := strings.ToLower(strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER"))); exporter {
	case "none":
		return nil, nil
	case "":
		if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
			return nil, nil
		}
	case "otlp":
	default:
		return nil, fmt.Errorf("invalid OTEL_TRACES_EXPORTER %q: pgdispatch exports traces with OTLP only (otlp, or none)", exporter)
	}
	protocol := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if protocol == "" {
		protocol = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	if p := strings.ToLower(strings.TrimSpace(protocol)); p != "" && p != "http/protobuf" {
		return nil, fmt.Errorf("invalid OTEL_EXPORTER_OTLP_PROTOCOL %q: pgdispatch exports OTLP over HTTP only (http/protobuf, "+
			"the collector's port 4318)", protocol)
	}
	// An export failure is the SDK's to retry; say it once per failure,
	// not on stderr.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { logger.Warn("tracing", zap.Error(err)) }))
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("tracing: OTLP exporter: %w", err)
	}
	// Later detectors win: OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME
	// over pgdispatch's own.
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName("pgdispatch"), semconv.ServiceInstanceID(workerID)),
		resource.WithTelemetrySDK(), resource.WithFromEnv())
	if err != nil {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	logger.Info("tracing: spans are exported over OTLP/HTTP (the OTEL_* environment)")
	return tp, nil
}

// Shutdown exports the spans tp holds, for at most 5s.
func Shutdown(ctx context.Context, tp *sdktrace.TracerProvider, logger *zap.Logger) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	if err := tp.Shutdown(ctx); err != nil {
		logger.Warn("tracing: the last spans were not all exported", zap.Error(err))
	}
}
