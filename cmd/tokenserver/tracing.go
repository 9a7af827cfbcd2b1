package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
)

// tracingFlags are the OpenTelemetry flags; tracing is off unless
// --otlp-endpoint is set.
type tracingFlags struct {
	endpoint string
	insecure bool
	sample   float64
}

// setupTracing sets o.cfg.TracerProvider to one exporting spans over OTLP
// gRPC to --otlp-endpoint, and returns the func that flushes and stops it.
func (o *options) setupTracing(log *slog.Logger) (func(), error) {
	f := o.tracing
	if f.endpoint == "" {
		return func() {}, nil
	}
	if f.sample < 0 || f.sample > 1 {
		return nil, fmt.Errorf("--otlp-sample must be between 0 and 1, got %v", f.sample)
	}
	opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(f.endpoint)}
	if f.insecure {
		opts = append(opts, otlptracegrpc.WithInsecure())
	}
	exp, err := otlptracegrpc.New(context.Background(), opts...)
	if err != nil {
		return nil, fmt.Errorf("--otlp-endpoint %s: %w", f.endpoint, err)
	}
	res := resource.NewWithAttributes(semconv.SchemaURL, semconv.ServiceName("tokenserver"), semconv.ServiceInstanceID(o.raft.NodeID))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(f.sample))))
	o.cfg.TracerProvider = tp
	log.Info("tracing on", "otlp_endpoint", f.endpoint, "sample", f.sample)
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := tp.Shutdown(ctx); err != nil {
			log.Warn("tracing: flushing spans at shutdown", "err", err)
		}
	}, nil
}
