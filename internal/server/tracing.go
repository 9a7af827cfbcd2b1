package server

import (
	"context"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// Tracing: with Config.TracerProvider set, the node makes an
// OpenTelemetry server span for each traced method (decisions, Envoy's
// ShouldRateLimit and rule writes), a child of the W3C trace context the call carries
// (traceparent, tracestate in its metadata). Calls it forwards to other
// nodes (to a key's owner, to the leader, the visibility fan-out) carry
// the context of its span, so the next node's span is its child and one
// trace follows a request across the hop. The SDK's client.WithTracing
// sends the caller's context the same way.

// tracedMethods are the methods that get a span.
var tracedMethods = map[string]bool{
	pb.TokenService_AcquireToken_FullMethodName:  true,
	pb.TokenService_AcquireTokens_FullMethodName: true,
	pb.AdminService_PutRule_FullMethodName:       true,
	pb.AdminService_DeleteRule_FullMethodName:    true,
	pb.AdminService_RollbackRule_FullMethodName:  true,
	// Envoy's calls, and the hit batches a node forwards to the owners
	// of their counters (envoy_decide.go): the hop is a child span.
	rlpb.RateLimitService_ShouldRateLimit_FullMethodName: true,
}

// propagator reads and writes W3C trace context; it holds no state.
var propagator = propagation.TraceContext{}

// mdCarrier adapts gRPC metadata to propagation.TextMapCarrier.
type mdCarrier metadata.MD

func (c mdCarrier) Get(k string) string {
	if v := metadata.MD(c).Get(k); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c mdCarrier) Set(k, v string) { metadata.MD(c).Set(k, v) }

func (c mdCarrier) Keys() []string {
	out := make([]string, 0, len(c))
	for k := range c {
		out = append(out, k)
	}
	return out
}

// newTracer returns the node's tracer from tp; nil (tracing off) for a
// nil tp.
func newTracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		return nil
	}
	return tp.Tracer("github.com/tokenserver/tokenserver/internal/server")
}

// traceCall runs h in a server span for a traced method when tracing is
// on, the child of the trace context in ctx's incoming metadata.
func (n *Node) traceCall(ctx context.Context, method string, req any, h grpc.UnaryHandler) (any, error) {
	if n.tracer == nil || !tracedMethods[method] {
		return h(ctx, req)
	}
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		ctx = propagator.Extract(ctx, mdCarrier(md))
	}
	ctx, span := n.tracer.Start(ctx, method, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attribute.String("rpc.system", "grpc"), attribute.String("tokenserver.node", n.data.ID()),
			attribute.Bool("tokenserver.forwarded", forwarded(ctx))))
	defer span.End()
	resp, err := h(ctx, req)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(otelcodes.Error, codeOf(err).String())
	}
	return resp, err
}

// InjectTraceContext is a gRPC client interceptor that writes the span
// context of the call's ctx into its metadata as W3C trace context. The
// node's peer connections use it; so does client.WithTracing.
func InjectTraceContext(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		md, _ := metadata.FromOutgoingContext(ctx)
		md = md.Copy()
		propagator.Inject(ctx, mdCarrier(md))
		ctx = metadata.NewOutgoingContext(ctx, md)
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}
