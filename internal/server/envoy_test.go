package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokenserver/tokenserver/internal/envoyrls"
	"github.com/tokenserver/tokenserver/internal/testcluster"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

const envoyYAML = `domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: day
      requests_per_unit: 3
  - key: path
    value: /login
    rate_limit:
      unit: day
      requests_per_unit: 1
  - key: tenant
    descriptors:
      - key: plan
        value: free
        rate_limit:
          unit: hour
          requests_per_unit: 2
`

func rlsClient(t *testing.T, addr string) rlpb.RateLimitServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlpb.NewRateLimitServiceClient(conn)
}

func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// ownedAddress is a remote_address value whose counter node id owns.
func ownedAddress(c *testcluster.Cluster, id string) string {
	for i := 0; ; i++ {
		v := fmt.Sprintf("10.0.0.%d", i)
		if n := c.OwnerOf("edge_remote_address_" + v + "_"); n != nil && n.ID == id {
			return v
		}
	}
}

// TestEnvoyRLSCluster: a domain written through a follower is served by
// every node; descriptors owned by different nodes are counted on their
// owners whichever node Envoy asks, and the answers equal MemDecider's for
// the same requests; bad input is InvalidArgument naming the field and
// counts nothing.
func TestEnvoyRLSCluster(t *testing.T) {
	c := testcluster.New(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	put, err := c.Follower().Admin().PutEnvoyDomain(ctx, &pb.PutEnvoyDomainRequest{Yaml: envoyYAML, Source: "edge.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	if put.GetDomain().GetVersion() == 0 || put.GetDomain().GetDomain() != "edge" {
		t.Fatalf("put: %v", put)
	}
	for _, n := range c.Nodes {
		c.WaitFor("domain everywhere", func() bool { return n.Cluster().EnvoyIndex() >= put.GetDomain().GetVersion() })
	}
	if _, err := c.Leader().Admin().PutEnvoyDomain(ctx, &pb.PutEnvoyDomainRequest{Yaml: "domain: x\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a bad domain: %v, want InvalidArgument", err)
	}
	list, err := c.Nodes[2].Admin().ListEnvoyDomains(ctx, &pb.ListEnvoyDomainsRequest{})
	if err != nil || len(list.GetDomains()) != 1 {
		t.Fatalf("list: %v %v", list, err)
	}

	cfg, err := envoyrls.NewConfig(mustDomain(t))
	if err != nil {
		t.Fatal(err)
	}
	ref := envoyrls.NewService(func() *envoyrls.Config { return cfg }, envoyrls.NewMemDecider(), envoyrls.Options{})

	var descs []*ratelimitv3.RateLimitDescriptor
	for _, n := range c.Nodes {
		descs = append(descs, desc("remote_address", ownedAddress(c, n.ID)))
	}
	descs = append(descs, desc("path", "/login"), desc("tenant", "a", "plan", "free"), desc("unknown", "x"))
	clients := make([]rlpb.RateLimitServiceClient, len(c.Nodes))
	for i, n := range c.Nodes {
		clients[i] = rlsClient(t, n.GRPCAddr)
	}
	for i := 0; i < 6; i++ {
		req := &rlpb.RateLimitRequest{Domain: "edge", Descriptors: descs}
		got, err := clients[i%3].ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		want, err := ref.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(normalize(got), normalize(want)) {
			t.Fatalf("call %d via %s:\n got %v\nwant %v", i, c.Nodes[i%3].ID, got, want)
		}
	}
	// Bad input: refused, naming the field, and nothing counted.
	for _, bad := range []*rlpb.RateLimitRequest{
		{Domain: "", Descriptors: descs},
		{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("remote_address", "10.9.9.9"), {Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}, Limit: &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1}}}},
	} {
		_, err := clients[0].ShouldRateLimit(ctx, bad)
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("bad request %v: %v, want InvalidArgument", bad, err)
		}
	}
	resp, err := clients[1].ShouldRateLimit(ctx, &rlpb.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("remote_address", "10.9.9.9")}})
	if err != nil || resp.GetStatuses()[0].GetLimitRemaining() != 2 {
		t.Fatalf("after refused requests the counter moved: %v %v", resp, err)
	}
}

func mustDomain(t *testing.T) *envoyrls.Domain {
	t.Helper()
	d, err := envoyrls.ParseDomain("edge.yaml", []byte(envoyYAML), envoyrls.Meta{})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// normalize drops duration_until_reset, which depends on the instant of
// each call.
func normalize(r *rlpb.RateLimitResponse) *rlpb.RateLimitResponse {
	r = proto.Clone(r).(*rlpb.RateLimitResponse)
	for _, s := range r.Statuses {
		if s.DurationUntilReset != nil {
			s.DurationUntilReset = durationpb.New(0)
		}
	}
	return r
}
