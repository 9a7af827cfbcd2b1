package client

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokenserver/tokenserver/internal/testcluster"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// TestAllowAllThreeOwnersConcurrent: org, team and user budgets whose
// keys live on three different nodes, asked for by 8 goroutines at once.
// The tightest level (org) decides how many wholes pass, exactly; the
// other levels are charged for those wholes only: what a denied whole
// took from them was given back.
func TestAllowAllThreeOwnersConcurrent(t *testing.T) {
	tc := testcluster.New(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	limits := map[string]int64{"org": 20, "team": 40, "user": 25}
	for name, limit := range limits {
		if _, err := tc.Leader().Admin().PutRule(ctx, &pb.PutRuleRequest{Rule: &pb.Rule{
			Name: name, Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: limit, Period: durationpb.New(24 * time.Hour)}}); err != nil {
			t.Fatal(err)
		}
		tc.WaitForRule(name)
	}
	keys := map[string]string{
		"org":  tc.KeyOwnedBy(tc.Nodes[0].ID, "acme"),
		"team": tc.KeyOwnedBy(tc.Nodes[1].ID, "acme/ml"),
		"user": tc.KeyOwnedBy(tc.Nodes[2].ID, "acme/ml/ann"),
	}
	c, _ := newClient(t, []string{tc.Nodes[0].GRPCAddr}, WithCallTimeout(5*time.Second))
	waitFor(t, 10*time.Second, "3 members", func() bool { return c.state.Load().view.Len() == 3 })
	items := []Item{{"user", keys["user"], 1}, {"team", keys["team"], 1}, {"org", keys["org"], 1}}

	var passed, denied atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 10; i++ {
				d, err := c.AllowAll(ctx, items...)
				if err != nil {
					t.Errorf("AllowAll: %v", err)
					return
				}
				if d.Allowed {
					passed.Add(1)
				} else {
					denied.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if passed.Load() != limits["org"] || denied.Load() != 80-limits["org"] {
		t.Errorf("%d wholes passed, %d denied; want %d passed (the org's limit)", passed.Load(), denied.Load(), limits["org"])
	}
	zero := int64(0)
	for name, key := range keys {
		resp, err := tc.Nodes[1].Token().AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: name, Key: key, Permits: &zero})
		if err != nil {
			t.Fatal(err)
		}
		if want := limits[name] - passed.Load(); resp.GetRemaining() != want {
			t.Errorf("%s remaining %d after %d wholes passed, want %d (a denied whole's permits given back)", name, resp.GetRemaining(), passed.Load(), want)
		}
	}
}
