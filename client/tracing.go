package client

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// WithTracing sends the OpenTelemetry span context of each call's ctx to
// the server as W3C trace context (traceparent and tracestate metadata),
// so that the server's spans, and those of the nodes it forwards to, join
// the caller's trace. A call the client coalesces with others into one
// batch (WithCoalesceWindow) carries no caller's context: the batch is
// sent on the client's own.
func WithTracing() Option {
	return WithDialOptions(grpc.WithChainUnaryInterceptor(injectTraceContext))
}

// injectTraceContext writes ctx's span context into the call's metadata.
func injectTraceContext(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if trace.SpanContextFromContext(ctx).IsValid() {
		md, _ := metadata.FromOutgoingContext(ctx)
		md = md.Copy()
		propagation.TraceContext{}.Inject(ctx, traceCarrier(md))
		ctx = metadata.NewOutgoingContext(ctx, md)
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

// traceCarrier adapts gRPC metadata to propagation.TextMapCarrier.
type traceCarrier metadata.MD

func (c traceCarrier) Get(k string) string {
	if v := metadata.MD(c).Get(k); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c traceCarrier) Set(k, v string) { metadata.MD(c).Set(k, v) }

func (c traceCarrier) Keys() []string {
	out := make([]string, 0, len(c))
	for k := range c {
		out = append(out, k)
	}
	return out
}
