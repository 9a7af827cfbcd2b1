package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/test/bufconn"

	"github.com/tokenserver/tokenserver/internal/raftfsm"
)

// fixedEnvoyStore is an envoyStore holding one set of domains that never
// changes: the node serves them without Raft. Writes are refused.
type fixedEnvoyStore struct{ ds raftfsm.EnvoyDomains }

var errFixedStore = errors.New("fixed envoy store: read only")

func (s fixedEnvoyStore) EnvoyDomains() raftfsm.EnvoyDomains { return s.ds }
func (s fixedEnvoyStore) EnvoyIndex() uint64                 { return s.ds.Index }
func (fixedEnvoyStore) PutEnvoyDomain(context.Context, raftfsm.EnvoyDomain, *uint64) (raftfsm.EnvoyDomain, error) {
	return raftfsm.EnvoyDomain{}, errFixedStore
}
func (fixedEnvoyStore) DeleteEnvoyDomain(context.Context, string, *uint64) error {
	return errFixedStore
}
func (fixedEnvoyStore) SyncEnvoyDomains(context.Context, string, []raftfsm.EnvoyDomain) (int, error) {
	return 0, errFixedStore
}
func (s fixedEnvoyStore) GetEnvoyDomain(context.Context, string) (raftfsm.EnvoyDomain, error) {
	return raftfsm.EnvoyDomain{}, errFixedStore
}
func (s fixedEnvoyStore) ListEnvoyDomains(context.Context) (raftfsm.EnvoyDomains, error) {
	return s.ds, nil
}
func (fixedEnvoyStore) IsLeader() bool { return false }

// envoyControl is a standalone control plane that also keeps Envoy
// domains.
type envoyControl struct {
	ControlPlane
	fixedEnvoyStore
}

const benchEnvoyYAML = `domain: bench
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 4000000000
`

// envoyTestNode serves a standalone node with the bench domain over an
// in-memory connection, as newTestNode does, with mutate's changes to its
// config and wrap's data plane (each may be nil), and returns it and its
// connection.
func envoyTestNode(tb testing.TB, mutate func(*Config), wrap func(*Standalone) DataPlane) (*Node, *grpc.ClientConn) {
	tb.Helper()
	cfg := DefaultConfig()
	cfg.HTTPAddr = ""
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if mutate != nil {
		mutate(&cfg)
	}
	deps := NewStandalone("node-1", "bufnet", inmem(tb, cfg.MaxRules)).Deps()
	if wrap != nil {
		deps.Data = wrap(deps.Control.(*Standalone))
	}
	deps.Control = envoyControl{ControlPlane: deps.Control, fixedEnvoyStore: fixedEnvoyStore{raftfsm.EnvoyDomains{Index: 1,
		Domains: []raftfsm.EnvoyDomain{{Name: "bench", YAML: benchEnvoyYAML, Version: 1, Source: "bench.yaml"}}}}}
	n, err := New(cfg, deps)
	if err != nil {
		tb.Fatal(err)
	}
	lis := bufconn.Listen(1 << 20)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Serve(ctx, Listeners{GRPC: lis}) }()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close(); cancel(); <-done })
	return n, conn
}

// envoyBenchConn is envoyTestNode's RLS client.
func envoyBenchConn(b *testing.B) rlpb.RateLimitServiceClient {
	_, conn := envoyTestNode(b, nil, nil)
	return rlpb.NewRateLimitServiceClient(conn)
}

// BenchmarkEnvoyRLS compares ShouldRateLimit with one and with ten
// descriptors (fixed windows, counted on this node) with a bare gRPC unary
// call over the same kind of in-memory connection, as BenchmarkUnary does
// for AcquireToken.
func BenchmarkEnvoyRLS(b *testing.B) {
	b.Run("bare", func(b *testing.B) {
		lis := bufconn.Listen(1 << 20)
		s := grpc.NewServer()
		healthpb.RegisterHealthServer(s, health.NewServer())
		go s.Serve(lis)
		defer s.Stop()
		conn, err := grpc.NewClient("passthrough:///bufnet",
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
			grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		c := healthpb.NewHealthClient(conn)
		req := &healthpb.HealthCheckRequest{}
		runParallel(b, func(ctx context.Context) error { _, err := c.Check(ctx, req); return err })
	})
	for _, n := range []int{1, 10} {
		b.Run(fmt.Sprint("descriptors=", n), func(b *testing.B) {
			c := envoyBenchConn(b)
			reqs := envoyBenchRequests(n)
			i := 0
			runParallel(b, func(ctx context.Context) error {
				i++
				resp, err := c.ShouldRateLimit(ctx, reqs[i%len(reqs)])
				if err == nil && resp.GetOverallCode() != rlpb.RateLimitResponse_OK {
					err = fmt.Errorf("answer %v", resp)
				}
				if err == nil && resp.GetStatuses()[0].GetCurrentLimit() == nil {
					err = errors.New("the bench domain is not served")
				}
				return err
			})
		})
	}
}

// envoyBenchRequests is 1000 requests of n distinct addresses each, to
// reuse in turn.
func envoyBenchRequests(n int) []*rlpb.RateLimitRequest {
	reqs := make([]*rlpb.RateLimitRequest, 1000)
	for i := range reqs {
		reqs[i] = &rlpb.RateLimitRequest{Domain: "bench"}
		for j := 0; j < n; j++ {
			reqs[i].Descriptors = append(reqs[i].Descriptors, &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
				{Key: "remote_address", Value: fmt.Sprintf("10.%d.%d.%d", j, i/256, i%256)}}})
		}
	}
	return reqs
}

// BenchmarkEnvoyHandler is BenchmarkEnvoyRLS without gRPC: the node's
// ShouldRateLimit (matching, counting on the shards, metrics, the answer)
// called in process, so that its cost per descriptor shows apart from the
// transport's.
func BenchmarkEnvoyHandler(b *testing.B) {
	for _, n := range []int{1, 10} {
		b.Run(fmt.Sprint("descriptors=", n), func(b *testing.B) {
			node, _ := envoyTestNode(b, nil, nil)
			reqs := envoyBenchRequests(n)
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				resp, err := node.envoy.ShouldRateLimit(ctx, reqs[i%len(reqs)])
				if err != nil || resp.GetOverallCode() != rlpb.RateLimitResponse_OK || resp.GetStatuses()[0].GetCurrentLimit() == nil {
					b.Fatalf("answer %v, %v", resp, err)
				}
			}
		})
	}
}
