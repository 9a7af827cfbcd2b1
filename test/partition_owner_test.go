//go:build multiprocess

package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestIssue20Item17_HealthyKeysNeverMoveAfterHeal: a follower is cut off
// for 20 s and healed; the keys of the two nodes that stayed healthy,
// each spent to zero on a rule of one per hour before the cut, get no
// grant anywhere after the heal, through the healed node or the others:
// a healed node with broken connections to a healthy owner must not have
// a third node decide that owner's keys from a fresh bucket.
func TestIssue20Item17_HealthyKeysNeverMoveAfterHeal(t *testing.T) {
	t.Parallel() // mostly waiting: runs beside the other waiting tests (Makefile: -parallel 4)
	c := newNSCluster(t, 3)
	hourly := &pb.Rule{Name: "hourly", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 1, Period: durationpb.New(time.Hour)}
	if _, err := call(func(ctx context.Context) (*pb.PutRuleResponse, error) {
		return c.admin(0).PutRule(ctx, &pb.PutRuleRequest{Rule: hourly})
	}); err != nil {
		t.Fatal(err)
	}
	l := c.leader(0)
	if l < 0 {
		t.Fatal("no leader")
	}
	victim := (l + 1) % 3
	v, err := call(func(ctx context.Context) (*pb.ClusterView, error) {
		return c.token(l).GetClusterView(ctx, &pb.GetClusterViewRequest{})
	})
	if err != nil || len(v.GetMembers()) != 3 {
		t.Fatalf("view: %v, %v", v, err)
	}
	// Keys of the healthy nodes in the full view: they stay with their
	// owner while the victim leaves the view and when it comes back.
	owners := map[string]int{}
	var keys []string
	for k := 0; len(keys) < 28 && k < 10000; k++ {
		key := fmt.Sprint("user-", k)
		var o int
		fmt.Sscanf(ownerOf(v, key), "n%d", &o)
		if o != victim {
			owners[key] = o
			keys = append(keys, key)
		}
	}
	c.waitFor("every node ready", 20*time.Second, func() bool { return c.ready(0) && c.ready(1) && c.ready(2) })
	for _, key := range keys { // spend each key's one token on its owner
		resp, err := call(func(ctx context.Context) (*pb.AcquireTokenResponse, error) {
			return c.token(owners[key]).AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: "hourly", Key: key})
		})
		if err != nil || !resp.GetAllowed() {
			t.Fatalf("first acquire of %s on its owner n%d: %v, %v", key, owners[key], resp, err)
		}
	}

	c.lab.cut(victim)
	other := 3 - l - victim
	c.waitFor("the majority drops the cut-off node", 20*time.Second, func() bool {
		live, err := c.liveOn(other, victim)
		return err == nil && !live
	})
	for cut := time.Now(); time.Since(cut) < 20*time.Second; {
		time.Sleep(250 * time.Millisecond) // the partition's length is the test's input
	}
	c.lab.heal(victim)
	healed := time.Now()

	// For 15 s after the heal, ask for every key through every node,
	// the healed one first: nothing may be granted.
	over := map[string]string{}
	for time.Since(healed) < 15*time.Second {
		for _, via := range []int{victim, l, other} {
			for _, key := range keys {
				resp, err := call(func(ctx context.Context) (*pb.AcquireTokenResponse, error) {
					return c.token(via).AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: "hourly", Key: key})
				})
				if err == nil && resp.GetAllowed() {
					if _, seen := over[key]; !seen {
						over[key] = fmt.Sprintf("granted again via n%d %v after the heal (owner n%d)", via, time.Since(healed).Round(time.Millisecond), owners[key])
					}
				}
			}
		}
	}
	for key, what := range over {
		t.Errorf("key %s of a healthy node: %s", key, what)
	}
}
