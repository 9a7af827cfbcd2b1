package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tokenserver/tokenserver/internal/testcluster"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

const aiYAML = `domain: ai
descriptors:
  - key: tenant
    algorithm: token-bucket
    rate_limit:
      unit: hour
      requests_per_unit: 100
  - key: user
    rate_limit:
      unit: hour
      requests_per_unit: 100
`

// TestEnvoyResponsePathDebits: a descriptor's own hits_addend (the cost
// Envoy reports on the response path) is a commit without a reservation
// on the same bucket as the request path: charged even past the limit,
// so that the next request is over until the debt is repaid
// (regression: the algorithm extension decided it as an acquire, and a
// cost above what was left, or above the limit, was refused and never
// charged). It holds through forwarding to the counter's owner. Fixed
// windows count every hit, as the reference does.
func TestEnvoyResponsePathDebits(t *testing.T) {
	c := testcluster.New(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	put, err := c.Leader().Admin().PutEnvoyDomain(ctx, &pb.PutEnvoyDomainRequest{Yaml: aiYAML, Source: "ai.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		c.WaitFor("domain everywhere", func() bool { return n.Cluster().EnvoyIndex() >= put.GetDomain().GetVersion() })
	}
	owned := func(key, id string) string {
		for i := 0; ; i++ {
			v := fmt.Sprint("t", i)
			if n := c.OwnerOf("ai_" + key + "_" + v + "_"); n != nil && n.ID == id {
				return v
			}
		}
	}
	via := rlsClient(t, c.Nodes[0].GRPCAddr)
	ask := func(key, value string, addend *wrapperspb.UInt64Value) rlpb.RateLimitResponse_Code {
		t.Helper()
		d := desc(key, value)
		d.HitsAddend = addend
		r, err := via.ShouldRateLimit(ctx, &rlpb.RateLimitRequest{Domain: "ai", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetOverallCode()
	}
	ok, over := rlpb.RateLimitResponse_OK, rlpb.RateLimitResponse_OVER_LIMIT
	for _, owner := range []string{c.Nodes[0].ID, c.Nodes[1].ID} {
		for _, key := range []string{"tenant", "user"} {
			v := owned(key, owner)
			for i, s := range []struct {
				addend *wrapperspb.UInt64Value
				want   rlpb.RateLimitResponse_Code
			}{
				{wrapperspb.UInt64(0), ok},     // request path: a check
				{nil, ok},                      // a plain request: 1
				{wrapperspb.UInt64(150), over}, // response path: 150 more than the limit, charged
				{wrapperspb.UInt64(0), over},   // owed: over
				{nil, over},                    // and refused
			} {
				if got := ask(key, v, s.addend); got != s.want {
					t.Fatalf("%s %s (owner %s) step %d: %v, want %v", key, v, owner, i, got, s.want)
				}
			}
		}
	}
}
