package testcluster

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// laggingFollower starts 3 nodes on a Network and cuts a follower off
// from Raft, then writes rule "fresh" through the leader: the follower's
// table lacks a rule the leader has acknowledged until nw.Heal.
func laggingFollower(t *testing.T) (nw *Network, c *Cluster, f *Node) {
	t.Helper()
	nw = NewNetwork()
	t.Cleanup(nw.Close)
	c = NewWith(t, 3, nw.Use)
	nw.Register(c)
	f = c.Follower()
	nw.Isolate(f.ID)
	if _, err := c.Leader().Admin().PutRule(ctx(t), &pb.PutRuleRequest{Rule: tokenBucket("fresh", 5)}); err != nil {
		t.Fatal(err)
	}
	return nw, c, f
}

// TestPutOverrideOnStaleFollowerRegression: a follower whose table lacks
// a rule the leader has acknowledged (it lags, here cut off from Raft)
// must not answer NotFound for an override of that rule: the leader
// judges the rule. Bug: `rule put` then `override set` through a follower
// failed with "rule not found" until the follower caught up.
func TestPutOverrideOnStaleFollowerRegression(t *testing.T) {
	nw, c, f := laggingFollower(t)
	wctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := f.Admin().PutOverride(wctx, &pb.PutOverrideRequest{Override: &pb.RuleOverride{Rule: "fresh", Key: "vip", Limit: 50}})
	if status.Code(err) == codes.NotFound {
		t.Fatalf("PutOverride through a lagging follower: %v; the rule exists on the leader", err)
	}
	if err := nw.Heal(f.ID); err != nil {
		t.Fatal(err)
	}
	c.WaitFor("the follower back with the rule", func() bool {
		_, err := f.Admin().GetRule(ctx(t), &pb.GetRuleRequest{Name: "fresh", Local: true})
		return err == nil
	})
	if _, err := f.Admin().PutOverride(ctx(t), &pb.PutOverrideRequest{Override: &pb.RuleOverride{Rule: "fresh", Key: "vip", Limit: 50}}); err != nil {
		t.Fatalf("PutOverride through the follower once it caught up: %v", err)
	}
	_, err = f.Admin().PutOverride(ctx(t), &pb.PutOverrideRequest{Override: &pb.RuleOverride{Rule: "nosuch", Key: "vip", Limit: 50}})
	wantCode(t, "PutOverride of a rule that exists nowhere", err, codes.NotFound)
}
