package server_test

import (
	"context"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokenserver/tokenserver/internal/server"
	"github.com/tokenserver/tokenserver/internal/testcluster"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// TestTracingAcrossForwarding: an acquire sent, with a trace context, to
// a node that does not own the key yields the entry node's span, child of
// the caller's, and the owner's span, child of the entry node's, all in
// the caller's trace.
func TestTracingAcrossForwarding(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	c := testcluster.NewWith(t, 3, func(o *server.Options) { o.Server.TracerProvider = tp })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := &pb.Rule{Name: "api", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 100, Period: durationpb.New(time.Second)}
	if _, err := c.Leader().Admin().PutRule(ctx, &pb.PutRuleRequest{Rule: r}); err != nil {
		t.Fatal(err)
	}
	c.WaitForRule("api")
	c.WaitFor("three live members", func() bool { return c.View().Len() == 3 })
	entry := c.Nodes[0]
	key := c.KeyOwnedBy(c.Nodes[1].ID, "user-")

	conn, err := grpc.NewClient(entry.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithUnaryInterceptor(server.InjectTraceContext))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	callerCtx, caller := tp.Tracer("test").Start(ctx, "caller")
	exp.Reset()
	if _, err := pb.NewTokenServiceClient(conn).AcquireToken(callerCtx, &pb.AcquireTokenRequest{Rule: "api", Key: key}); err != nil {
		t.Fatal(err)
	}
	caller.End()

	var entrySpan, ownerSpan *tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.Name != pb.TokenService_AcquireToken_FullMethodName {
			continue
		}
		for _, a := range s.Attributes {
			if a.Key == "tokenserver.node" && a.Value.AsString() == entry.ID {
				entrySpan = &s
			}
			if a.Key == "tokenserver.node" && a.Value.AsString() == c.Nodes[1].ID {
				ownerSpan = &s
			}
		}
	}
	if entrySpan == nil || ownerSpan == nil {
		t.Fatalf("spans %v: want one AcquireToken span on %s and one on %s", exp.GetSpans(), entry.ID, c.Nodes[1].ID)
	}
	want := caller.SpanContext().TraceID()
	for _, s := range []*tracetest.SpanStub{entrySpan, ownerSpan} {
		if s.SpanContext.TraceID() != want || s.SpanKind != trace.SpanKindServer {
			t.Errorf("span on %v: trace %v kind %v, want trace %v, server", s.Attributes, s.SpanContext.TraceID(), s.SpanKind, want)
		}
	}
	if entrySpan.Parent.SpanID() != caller.SpanContext().SpanID() {
		t.Errorf("entry span's parent %v, want the caller's span %v", entrySpan.Parent.SpanID(), caller.SpanContext().SpanID())
	}
	if ownerSpan.Parent.SpanID() != entrySpan.SpanContext.SpanID() {
		t.Errorf("owner span's parent %v, want the entry node's span %v", ownerSpan.Parent.SpanID(), entrySpan.SpanContext.SpanID())
	}
}

// TestTracingShouldRateLimit: Envoy's ShouldRateLimit, sent with a trace
// context to a node that does not own the descriptor's counter, yields
// the entry node's span, child of the caller's, and the owner's span for
// the forwarded hit batch, child of the entry node's.
func TestTracingShouldRateLimit(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	c := testcluster.NewWith(t, 3, func(o *server.Options) { o.Server.TracerProvider = tp })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	put, err := c.Leader().Admin().PutEnvoyDomain(ctx, &pb.PutEnvoyDomainRequest{Yaml: envoyYAML, Source: "edge.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		c.WaitFor("domain everywhere", func() bool { return n.Cluster().EnvoyIndex() >= put.GetDomain().GetVersion() })
	}
	c.WaitFor("three live members", func() bool { return c.View().Len() == 3 })
	entry, owner := c.Nodes[0], c.Nodes[1]

	conn, err := grpc.NewClient(entry.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithUnaryInterceptor(server.InjectTraceContext))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	callerCtx, caller := tp.Tracer("test").Start(ctx, "caller")
	exp.Reset()
	req := &rlpb.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("remote_address", ownedAddress(c, owner.ID))}}
	if _, err := rlpb.NewRateLimitServiceClient(conn).ShouldRateLimit(callerCtx, req); err != nil {
		t.Fatal(err)
	}
	caller.End()

	entrySpan := spanOn(t, exp, rlpb.RateLimitService_ShouldRateLimit_FullMethodName, entry.ID)
	ownerSpan := spanOn(t, exp, rlpb.RateLimitService_ShouldRateLimit_FullMethodName, owner.ID)
	want := caller.SpanContext().TraceID()
	for _, s := range []tracetest.SpanStub{entrySpan, ownerSpan} {
		if s.SpanContext.TraceID() != want || s.SpanKind != trace.SpanKindServer {
			t.Errorf("span on %v: trace %v kind %v, want trace %v, server", s.Attributes, s.SpanContext.TraceID(), s.SpanKind, want)
		}
	}
	if entrySpan.Parent.SpanID() != caller.SpanContext().SpanID() {
		t.Errorf("entry span's parent %v, want the caller's span %v", entrySpan.Parent.SpanID(), caller.SpanContext().SpanID())
	}
	if ownerSpan.Parent.SpanID() != entrySpan.SpanContext.SpanID() {
		t.Errorf("owner span's parent %v, want the entry node's span %v", ownerSpan.Parent.SpanID(), entrySpan.SpanContext.SpanID())
	}
}

// spanOn returns the one span named method that node id recorded.
func spanOn(t *testing.T, exp *tracetest.InMemoryExporter, method, id string) tracetest.SpanStub {
	t.Helper()
	var found []tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.Name != method {
			continue
		}
		for _, a := range s.Attributes {
			if a.Key == "tokenserver.node" && a.Value.AsString() == id {
				found = append(found, s)
			}
		}
	}
	if len(found) != 1 {
		t.Fatalf("spans %v: want one %s span on %s, got %d", exp.GetSpans(), method, id, len(found))
	}
	return found[0]
}
