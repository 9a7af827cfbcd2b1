//go:build multiprocess

package e2e

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokenserver/tokenserver/client"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// TestSDKAgainstProcesses drives the Go SDK against 3 tokenserver
// processes: it learns the cluster from one seed, every owner's keys are
// limited exactly, a kill of every process sends it to the rule's LOCAL
// fallback within its deadline, and it returns to the servers once they are
// back.
func TestSDKAgainstProcesses(t *testing.T) {
	c := newProcCluster(t, 3)
	leader := c.leader("")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := c.admin(leader).PutRule(ctx, &pb.PutRuleRequest{Rule: &pb.Rule{
		Name: "sdk", Algorithm: pb.Algorithm_FIXED_WINDOW, Limit: 3, Period: durationpb.New(time.Hour),
		Fallback: &pb.Fallback{Policy: pb.FallbackPolicy_LOCAL, Limit: 2},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range c.ids {
		c.waitFor("the rule on "+id, 30*time.Second, func() bool {
			_, err := c.admin(id).GetRule(ctx, &pb.GetRuleRequest{Name: "sdk", Local: true})
			return err == nil
		})
	}
	sdk, err := client.New(ctx, []string{c.grpc[c.ids[1]]}, client.WithCallTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer sdk.Close()
	lim := sdk.Limiter("sdk")
	view, err := c.token(leader).GetClusterView(ctx, &pb.GetClusterViewRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// Keys of every owner: exactly the limit, decided by the servers.
	for _, m := range view.GetMembers() {
		key := ""
		for i := 0; key == ""; i++ {
			if k := fmt.Sprint("user-", i); ownerOf(view, k) == m.GetId() {
				key = k
			}
		}
		allowed := 0
		for i := 0; i < 5; i++ {
			d, err := lim.AllowN(ctx, key, 1)
			if err != nil || d.Source != client.SourceServer {
				t.Fatalf("key %s of %s: %+v %v", key, m.GetId(), d, err)
			}
			if d.Allowed {
				allowed++
			}
		}
		if allowed != 3 {
			t.Fatalf("key %s of %s: %d allowed, want 3", key, m.GetId(), allowed)
		}
	}

	// Every server killed: calls return within their deadline, from the
	// LOCAL fallback (2 per period for this client and key).
	for _, id := range c.ids {
		c.kill(id)
	}
	allowed := 0
	for i := 0; i < 10; i++ {
		start := time.Now()
		d, err := lim.AllowN(ctx, "fallback-key", 1)
		if took := time.Since(start); took > 100*time.Millisecond+500*time.Millisecond {
			t.Fatalf("call %d took %v with the servers down (deadline 100ms)", i, took)
		}
		if err != nil && !errors.Is(err, client.ErrUnavailable) {
			t.Fatalf("call %d: %v", i, err)
		}
		if d.Allowed {
			if d.Source != client.SourceFallback {
				t.Fatalf("call %d allowed by %v with the servers down", i, d.Source)
			}
			allowed++
		}
	}
	if allowed > 2 || !sdk.InFallback() {
		t.Fatalf("fallback admitted %d (LOCAL limit 2); in fallback: %v", allowed, sdk.InFallback())
	}

	// Back: the SDK uses the servers again.
	for _, id := range c.ids {
		c.start(id)
	}
	c.waitFor("the SDK back on the servers", 60*time.Second, func() bool {
		d, err := lim.AllowN(ctx, fmt.Sprint("back-", time.Now().UnixNano()), 1)
		return err == nil && d.Source == client.SourceServer && !sdk.InFallback()
	})
}
