package testcluster

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// TestPartitionedLeader cuts the leader's Raft traffic: it stops
// acknowledging rule writes, the majority elects a new leader that takes
// writes, and after healing the old leader follows and has every rule.
func TestPartitionedLeader(t *testing.T) {
	nw := NewNetwork()
	t.Cleanup(nw.Close)
	c := NewWith(t, 3, nw.Use)
	nw.Register(c)
	if _, err := c.Leader().Admin().PutRule(ctx(t), &pb.PutRuleRequest{Rule: tokenBucket("before", 5)}); err != nil {
		t.Fatal(err)
	}
	old := c.Leader()
	nw.Isolate(old.ID)

	// The isolated leader cannot commit: a write on it is not acknowledged.
	wctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	_, err := old.Admin().PutRule(wctx, &pb.PutRuleRequest{Rule: tokenBucket("lost", 5)})
	cancel()
	if err == nil {
		t.Fatal("the isolated leader acknowledged a write")
	}
	c.WaitFor("a new leader in the majority", func() bool {
		for _, n := range c.Nodes {
			if n != old && n.Cluster().IsLeader() {
				return true
			}
		}
		return false
	})
	var majority *Node
	for _, n := range c.Nodes {
		if n != old {
			majority = n
		}
	}
	if _, err := majority.Admin().PutRule(ctx(t), &pb.PutRuleRequest{Rule: tokenBucket("after", 5)}); err != nil {
		t.Fatalf("write in the majority: %v", err)
	}
	// The minority keeps serving the data plane with the rules it has.
	if _, err := old.Token().AcquireToken(ctx(t), &pb.AcquireTokenRequest{Rule: "before", Key: c.KeyOwnedBy(old.ID, "mine")}); err != nil && status.Code(err) != codes.Unavailable {
		t.Fatalf("data plane on the isolated node: %v", err)
	}
	if err := nw.Heal(old.ID); err != nil {
		t.Fatal(err)
	}
	c.WaitFor("the old leader follows and catches up", func() bool {
		return !old.Cluster().IsLeader() && old.Cluster().Table().Get("after") != nil
	})
	if old.Cluster().Table().Get("lost") != nil {
		t.Fatal("the unacknowledged write of the isolated leader survived")
	}
}
