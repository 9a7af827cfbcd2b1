//go:build multiprocess

package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// TestHandoffCommitsAndRequestLimits reserves on 30 keys and spends
// another 30 under a request's limit of 5 (the rule's is 100 a day), then
// drains a node (SIGTERM: its keys are handed over) and brings it back
// (they are handed back): the reservations made before each move commit
// on the key's owner after it, their overruns are charged once (a retried
// commit changes nothing), and the keys spent under their request's
// limit stay spent.
func TestHandoffCommitsAndRequestLimits(t *testing.T) {
	c := newProcCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rule := &pb.Rule{Name: "cost", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 100, Period: durationpb.New(24 * time.Hour),
		Inline: &pb.InlinePolicy{MaxLimit: 100}}
	if _, err := c.admin(c.leader("")).PutRule(ctx, &pb.PutRuleRequest{Rule: rule}); err != nil {
		t.Fatal(err)
	}
	const keys = 30
	via := c.token("n1") // forwards to each key's owner
	ten, five := int64(10), int64(5)
	grants := make([]string, keys)
	for i := range keys {
		var r *pb.AcquireTokenResponse
		c.waitFor("the rule on n1", 10*time.Second, func() bool {
			var err error
			r, err = via.AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: "cost", Key: fmt.Sprint("r-", i), Permits: &ten})
			return err == nil
		})
		if !r.GetAllowed() {
			t.Fatalf("reserve r-%d: %v", i, r)
		}
		grants[i] = r.GetGrantId()
		s, err := via.AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: "cost", Key: fmt.Sprint("l-", i), Permits: &five, Limit: &pb.InlineLimit{Limit: 5}})
		if err != nil || !s.GetAllowed() {
			t.Fatalf("spend l-%d under a limit of 5: %v %v", i, s, err)
		}
	}
	check := func(what string, commits int) {
		t.Helper()
		for i := range keys {
			for try := range commits {
				// 10 reserved, 30 used: 20 more, charged once.
				r, err := via.CommitToken(ctx, &pb.CommitTokenRequest{Rule: "cost", Key: fmt.Sprint("r-", i), GrantId: grants[i], Used: 30})
				if err != nil || r.GetRemaining() != 70 {
					t.Fatalf("%s: commit %d of r-%d = %v, %v; want 70 left (the overrun charged once)", what, try, i, r, err)
				}
			}
			one := int64(1)
			s, err := via.AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: "cost", Key: fmt.Sprint("l-", i), Permits: &one, Limit: &pb.InlineLimit{Limit: 5}})
			if err != nil || s.GetAllowed() {
				t.Fatalf("%s: l-%d, spent under its limit of 5, is granted again: %v %v", what, i, s, err)
			}
		}
	}
	c.stop("n0")
	c.waitFor("n0 out of the view", 30*time.Second, func() bool { return c.liveCount() == 2 })
	check("after n0 drained", 2)
	c.start("n0")
	c.waitFor("n0 back in the view", 60*time.Second, func() bool { return c.liveCount() == 3 })
	check("after n0 came back", 1)
}
