//go:build multiprocess

package e2e

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokenserver/tokenserver/internal/server"
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

// TestAllOrNothingGiveBacksDuringMoves runs refused all-or-nothing
// batches (two items of 10 permits on keys half spent, and one item that
// is always denied) while a node drains, then while it comes back. Over
// the drain, every granted item is given back to the key's bucket,
// wherever it moved in between, and none twice, so each key ends
// exactly half spent. Over the rejoin, the same: no grant is given back
// twice (never more than 50 left), and none is lost: the joining node
// expects its keys back even when its first view already holds it, so a
// give-back does not reach a bucket it made before the key's state came.
func TestAllOrNothingGiveBacksDuringMoves(t *testing.T) {
	c := newProcCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	day := durationpb.New(24 * time.Hour)
	for _, r := range []*pb.Rule{
		{Name: "org", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 100, Period: day},
		{Name: "tiny", Algorithm: pb.Algorithm_FIXED_WINDOW, Limit: 1, Period: day},
	} {
		if _, err := c.admin(c.leader("")).PutRule(ctx, &pb.PutRuleRequest{Rule: r}); err != nil {
			t.Fatal(err)
		}
	}
	const keys = 30
	via := []pb.TokenServiceClient{c.token("n1"), c.token("n2")}
	acquire := func(rule, key string, n int64) *pb.AcquireTokenResponse {
		t.Helper()
		var r *pb.AcquireTokenResponse
		c.waitFor("an answer for "+rule, 10*time.Second, func() bool {
			var err error
			r, err = via[0].AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: rule, Key: key, Permits: &n})
			return err == nil
		})
		return r
	}
	for i := range keys {
		if r := acquire("org", fmt.Sprint("k-", i), 50); !r.GetAllowed() {
			t.Fatalf("spend half of k-%d: %v", i, r)
		}
	}
	acquire("tiny", "x", 1) // spent: every batch is refused
	// load runs refused batches until move returns, and counts them.
	load := func(move func()) int64 {
		var stopped atomic.Bool // not a cancel: a cut call may lose a grant's id (the stated under-admission)
		var batches, granted atomic.Int64
		done := make(chan struct{})
		for g := range 4 {
			go func() {
				defer func() { done <- struct{}{} }()
				ten, one := int64(10), int64(1)
				for i := 0; !stopped.Load(); i++ {
					a, b := fmt.Sprint("k-", (g*7+i)%keys), fmt.Sprint("k-", (g*11+i*3+1)%keys)
					if a == b {
						continue
					}
					r, err := via[i%2].AcquireTokens(ctx, &pb.AcquireTokensRequest{AllOrNothing: true, Requests: []*pb.AcquireTokenRequest{
						{Rule: "org", Key: a, Permits: &ten}, {Rule: "org", Key: b, Permits: &ten}, {Rule: "tiny", Key: "x", Permits: &one}}})
					if err != nil {
						continue
					}
					batches.Add(1)
					for _, res := range r.GetResults() {
						if res.GetResponse().GetAllowed() {
							granted.Add(1)
						}
					}
				}
			}()
		}
		move()
		stopped.Store(true)
		for range 4 {
			<-done
		}
		if granted.Load() != 0 {
			t.Fatalf("%d items of refused all-or-nothing batches were answered granted", granted.Load())
		}
		return batches.Load()
	}
	// left lists the keys not at 50 left, once the give-backs (which run
	// within AllOrNothingGiveBack of their batch) are done; lost counts
	// the permits under 50, over those above.
	left := func() (bad []string, lost, over int64) {
		end := time.Now().Add(2 * server.AllOrNothingGiveBack)
		for {
			bad, lost, over = nil, 0, 0
			for i := range keys {
				r := acquire("org", fmt.Sprint("k-", i), 0).GetRemaining()
				if r != 50 {
					bad = append(bad, fmt.Sprintf("k-%d: %d", i, r))
					lost += max(0, 50-r)
					over += max(0, r-50)
				}
			}
			if len(bad) == 0 || time.Now().After(end) {
				return bad, lost, over
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	n := load(func() {
		c.stop("n0")
		c.waitFor("n0 out of the view", 30*time.Second, func() bool { return c.liveCount() == 2 })
	})
	if bad, _, _ := left(); len(bad) > 0 {
		t.Errorf("drain: after %d refused batches, keys not back to 50 left (each grant given back once): %v", n, bad)
	}
	t.Logf("FIGURE all-or-nothing give-backs during a drain: %d refused batches on %d keys, every key back to 50/100", n, keys)
	n = load(func() {
		c.start("n0")
		c.waitFor("n0 back in the view", 60*time.Second, func() bool { return c.liveCount() == 3 })
	})
	bad, lost, over := left()
	if over > 0 {
		t.Errorf("rejoin: after %d refused batches, grants given back twice: %v", n, bad)
	}
	if lost > 0 { // the rejoin gap: a give-back reached n0 before the key's state
		t.Errorf("rejoin: after %d refused batches, %d permits not given back: %v", n, lost, bad)
	}
	t.Logf("FIGURE all-or-nothing give-backs during a rejoin: %d refused batches, %d permits not given back (under-admission) on %d of %d keys, 0 given back twice", n, lost, len(bad), keys)
}
