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

// TestDurableFullRestartNewOwner: kill -9 of every node of a cluster with
// durable daily quotas 60% used, a start of every node, and then a new
// member joins before any key is used again. The keys the new member
// takes were never decided since the restart, so their state lives only
// as copies read back from the checkpoints of their old owner and next
// owner, neither of which is the new owner. Each must still resume with
// 40 left (before, the copies stayed where they were and the new owner
// started those keys fresh).
func TestDurableFullRestartNewOwner(t *testing.T) {
	const limit, used, nkeys = 100, 60, 40
	c := newProcCluster(t, 3, "--checkpoint-interval", "500ms")
	r := &pb.Rule{Name: "daily", Algorithm: pb.Algorithm_FIXED_WINDOW, Limit: limit, Period: durationpb.New(24 * time.Hour), Durable: true}
	c.putRuleEverywhere(r)
	view := c.fullView(c.ids[0])
	acquire := func(id, key string, permits int64) *pb.AcquireTokenResponse {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := c.token(id).AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: r.GetName(), Key: key, Permits: &permits})
		if err != nil {
			t.Fatalf("acquire %s on %s: %v", key, id, err)
		}
		return resp
	}
	var keys []string
	for i := range nkeys {
		k := fmt.Sprintf("tenant-%d", i)
		keys = append(keys, k)
		if resp := acquire(ownerOf(view, k), k, used); !resp.GetAllowed() {
			t.Fatalf("%s: first %d permits denied: %v", k, used, resp)
		}
	}
	c.waitCheckpointed(2 * nkeys)
	for _, id := range c.ids {
		c.kill(id)
	}
	for _, id := range c.ids {
		c.start(id)
	}
	c.waitFor("a view of the 3 nodes after the restart", 60*time.Second, func() bool { return c.liveCount() == 3 })
	// A new member joins; nothing was decided since the restart.
	id := "n3"
	c.join(id, t.TempDir())
	c.waitFor("a view of 4", 60*time.Second, func() bool { return c.liveCount() == 4 })
	after := c.fullView(id)
	var moved, resumed int
	for _, k := range keys {
		if ownerOf(after, k) == id {
			moved++
		}
	}
	if moved == 0 {
		t.Fatalf("no key of %d moved to the new member", nkeys)
	}
	for i, k := range keys {
		var left int64
		// The copies travel with the join's handoff: wait for it, then
		// a peek through a node that does not own the key.
		c.waitFor(k+" answered", 10*time.Second, func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			zero := int64(0)
			resp, err := c.token(c.ids[i%len(c.ids)]).AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: r.GetName(), Key: k, Permits: &zero})
			left = resp.GetRemaining()
			return err == nil && !isHold(resp)
		})
		switch {
		case left == limit-used:
			resumed++
		case left == limit:
			t.Errorf("%s (owner %s): started fresh after the full restart and the join, want %d left", k, ownerOf(after, k), limit-used)
		default:
			t.Errorf("%s (owner %s): %d left, want %d", k, ownerOf(after, k), left, limit-used)
		}
	}
	t.Logf("FIGURE full restart, then a join: %d of %d durable quotas resumed (%d on the new member)", resumed, nkeys, moved)
}
