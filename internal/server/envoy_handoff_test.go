package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tokenserver/tokenserver/internal/testcluster"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// TestEnvoyCountersContinueAcrossDrain drains the owner of Envoy
// counters: its handoff carries them to their new owner, which installs
// them under the rules it makes for Envoy limits (they are in no rule
// table), so the counts go on there. Regression: shard.Map.Import looked
// the rule up in the rule table only and dropped every handed-over Envoy
// counter, so each started fresh on its new owner after a drain.
func TestEnvoyCountersContinueAcrossDrain(t *testing.T) {
	c := testcluster.New(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	put, err := c.Leader().Admin().PutEnvoyDomain(ctx, &pb.PutEnvoyDomainRequest{Yaml: movedYAML, Source: "edge.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes {
		c.WaitFor("domain everywhere", func() bool { return n.Cluster().EnvoyIndex() >= put.GetDomain().GetVersion() })
	}
	c.WaitFor("views agree", func() bool { return c.ViewsAgree(3) })
	leader := c.Leader()
	var owner int
	for i, n := range c.Nodes {
		if n != leader {
			owner = i // drain a follower: the test is about the counters
		}
	}
	via := leader // asks the counters' owners, whoever they are
	ownerID := c.Nodes[owner].ID
	cases := []struct{ name, key string }{
		{"fixed window", "remote_address"},
		{"algorithm extension", "tenant"},
	}
	values := make([]string, len(cases))
	for i, tc := range cases {
		for j := 0; ; j++ {
			v := fmt.Sprintf("10.1.%d.%d", i, j)
			if c.OwnerOf("edge_"+tc.key+"_"+v+"_").ID == ownerID {
				values[i] = v
				break
			}
		}
	}
	rls := rlsClient(t, via.GRPCAddr)
	hit := func(t *testing.T, key, value string) *rlpb.RateLimitResponse_DescriptorStatus {
		t.Helper()
		resp, err := rls.ShouldRateLimit(ctx, &rlpb.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc(key, value)}})
		if err != nil {
			t.Fatalf("ShouldRateLimit %s=%s: %v", key, value, err)
		}
		return resp.GetStatuses()[0]
	}
	for i, tc := range cases {
		for want := uint32(2); want >= 1; want-- { // 2 of 3 a day spent on the owner
			if got := hit(t, tc.key, values[i]).GetLimitRemaining(); got != want {
				t.Fatalf("%s: remaining %d before the drain, want %d", tc.name, got, want)
			}
		}
	}
	c.Stop(owner) // drains: the counters are handed over
	c.WaitFor("views agree without the drained node", func() bool { return c.ViewsAgree(2) })
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := c.OwnerOf("edge_" + tc.key + "_" + values[i] + "_"); got == nil || got.ID == ownerID {
				t.Fatalf("the counter did not move off the drained node")
			}
			if s := hit(t, tc.key, values[i]); s.GetCode() != rlpb.RateLimitResponse_OK || s.GetLimitRemaining() != 0 {
				t.Fatalf("the third hit of 3 a day after the drain: %v, remaining %d; want OK, 0 (the count went on from 2)", s.GetCode(), s.GetLimitRemaining())
			}
			if s := hit(t, tc.key, values[i]); s.GetCode() != rlpb.RateLimitResponse_OVER_LIMIT {
				t.Fatalf("the fourth hit of 3 a day after the drain: %v, want OVER_LIMIT", s.GetCode())
			}
		})
	}
}
