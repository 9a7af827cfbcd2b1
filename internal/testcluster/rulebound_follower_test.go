package testcluster

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// TestRuleBoundOnLaggingFollowerRegression: RuleBound through a follower
// whose table does not yet hold a rule the leader acknowledged waits for
// it, as the data plane does (readindex.go), instead of answering
// NotFound. Bug (seen in CI): the console's rule page, opened right after
// `rule put`, showed "rule not found" and no bound.
func TestRuleBoundOnLaggingFollowerRegression(t *testing.T) {
	nw, _, f := laggingFollower(t)
	// The follower catches up while the call waits for it.
	heal := time.AfterFunc(300*time.Millisecond, func() { _ = nw.Heal(f.ID) })
	t.Cleanup(func() { heal.Stop() })
	wctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rb, err := f.Admin().RuleBound(wctx, &pb.RuleBoundRequest{Rule: "fresh"})
	if err != nil {
		t.Fatalf("RuleBound through a lagging follower: %v; the rule exists on the leader", err)
	}
	if len(rb.GetNodes()) != 3 {
		t.Fatalf("bound of %d nodes, want 3 (missing %v)", len(rb.GetNodes()), rb.GetMissingNodes())
	}
	_, err = f.Admin().RuleBound(ctx(t), &pb.RuleBoundRequest{Rule: "nosuch"})
	wantCode(t, "RuleBound of a rule that exists nowhere", err, codes.NotFound)
}
