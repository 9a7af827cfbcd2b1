package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/server"
	"github.com/tokenserver/tokenserver/internal/shard"
	"github.com/tokenserver/tokenserver/internal/testcluster"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// freezeEnvoyCounter hands the Envoy counter of key counterKey over on n
// (shard.Map.HandOver: later decisions on it there fail with
// shard.ErrMoved), as a view change that moved it would.
func freezeEnvoyCounter(t *testing.T, n *testcluster.Node, counterKey string) {
	t.Helper()
	frozen := 0
	err := n.Buckets().HandOver(time.Now().UnixNano(), func(_, key string) bool { return key == counterKey },
		func(shard.BucketState) error { frozen++; return nil })
	if err != nil || frozen != 1 {
		t.Fatalf("freeze %q on %s: %d buckets, %v", counterKey, n.ID, frozen, err)
	}
}

const movedYAML = `domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: day
      requests_per_unit: 3
  - key: tenant
    algorithm: token-bucket
    rate_limit:
      unit: day
      requests_per_unit: 3
`

// envoyHitBatch is one hit on counterKey of a limit of 3 a day of
// algorithm alg, as one node forwards it to the counter's owner (the wire
// format of envoy_decide.go).
func envoyHitBatch(counterKey string, alg bucket.Algorithm) *rlpb.RateLimitRequest {
	return &rlpb.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries:    []*ratelimitv3.RateLimitDescriptor_Entry{{Key: counterKey, Value: fmt.Sprintf("%d/0", alg)}},
		Limit:      &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 3, Unit: typev3.RateLimitUnit_DAY},
		HitsAddend: wrapperspb.UInt64(1),
	}}}
}

// TestEnvoyHandedOverCounterGoesToItsOwner: a hit on an Envoy counter
// this node handed over (frozen: shard.ErrMoved) is decided by the key's
// owner in the view, as AcquireToken's decideMoved does (regression: the
// algorithm extension failed Unavailable, and a fixed window counted on
// the frozen bucket, a count its owner never saw). Forwarded to a node
// that handed the counter over, the hit goes on to the owner; when the
// view gives the key back to the node that froze it, the counter goes on
// from the state it left with.
func TestEnvoyHandedOverCounterGoesToItsOwner(t *testing.T) {
	c := testcluster.New(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	put, err := c.Leader().Admin().PutEnvoyDomain(ctx, &pb.PutEnvoyDomainRequest{Yaml: movedYAML, Source: "edge.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		c.WaitFor("domain everywhere", func() bool { return n.Cluster().EnvoyIndex() >= put.GetDomain().GetVersion() })
	}
	c.WaitFor("views agree", func() bool { return c.ViewsAgree(2) })
	// owned is a value of descriptor key whose counter node id owns, a
	// new one each time.
	seq := 0
	owned := func(key, id string) string {
		for ; ; seq++ {
			if v := fmt.Sprintf("10.0.0.%d", seq); c.OwnerOf("edge_"+key+"_"+v+"_").ID == id {
				seq++
				return v
			}
		}
	}
	remaining := func(t *testing.T, n *testcluster.Node, key, value string, want uint32) {
		t.Helper()
		resp, err := rlsClient(t, n.GRPCAddr).ShouldRateLimit(ctx, &rlpb.RateLimitRequest{Domain: "edge",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{desc(key, value)}})
		if err != nil {
			t.Fatalf("ShouldRateLimit %s=%s via %s: %v", key, value, n.ID, err)
		}
		if got := resp.GetStatuses()[0].GetLimitRemaining(); got != want {
			t.Fatalf("ShouldRateLimit %s=%s via %s: remaining %d, want %d", key, value, n.ID, got, want)
		}
	}
	a, b := c.Nodes[0], c.Nodes[1]
	for _, tc := range []struct {
		name, key, suffix string
		alg               bucket.Algorithm
	}{
		{"fixed window", "remote_address", "_DAY", bucket.FixedWindow},
		{"algorithm extension", "tenant", "_DAY_token-bucket", bucket.TokenBucket},
	} {
		t.Run(tc.name+"/forwarded to the node that handed it over", func(t *testing.T) {
			v := owned(tc.key, b.ID)
			counter := "edge_" + tc.key + "_" + v + "_" + tc.suffix[1:]
			// A node that took a for the owner sends it the hit; a holds
			// the counter (one hit) and hands it over.
			hits := rlsClient(t, a.GRPCAddr)
			fctx := metadata.AppendToOutgoingContext(ctx, server.ForwardedHeader, "1", "x-tokenserver-envoy-hits", "1")
			if _, err := hits.ShouldRateLimit(fctx, envoyHitBatch(counter, tc.alg)); err != nil {
				t.Fatal(err)
			}
			freezeEnvoyCounter(t, a, counter)
			if _, err := hits.ShouldRateLimit(fctx, envoyHitBatch(counter, tc.alg)); err != nil {
				t.Fatalf("a hit on the handed-over counter: %v, want it decided by %s", err, b.ID)
			}
			remaining(t, b, tc.key, v, 1) // b decided it: with this call, 2 of 3 spent there
		})
		t.Run(tc.name+"/the view gives it back", func(t *testing.T) {
			v := owned(tc.key, b.ID)
			remaining(t, b, tc.key, v, 2)
			freezeEnvoyCounter(t, b, "edge_"+tc.key+"_"+v+"_"+tc.suffix[1:])
			remaining(t, b, tc.key, v, 1) // on from the state it left with, not fresh
			remaining(t, a, tc.key, v, 0)
		})
	}
}
