//go:build multiprocess && figures

package e2e

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// TestFiguresSDKKilledOwner: 10 kills (-9) of a key's owner (a follower)
// under SDK load, restarted after each: seconds of fallback decisions for
// its keys after the kill, and seconds until every key was decided by a
// server again; p50 and p99 (the max, of 10).
func TestFiguresSDKKilledOwner(t *testing.T) {
	c := newProcCluster(t, 3)
	c.putRuleEverywhere(&pb.Rule{Name: "kill", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 1_000_000, Period: durationpb.New(time.Second),
		Fallback: &pb.Fallback{Policy: pb.FallbackPolicy_DENY}})
	sdk, _ := sdkClient(t, []string{c.grpc["n0"], c.grpc["n1"], c.grpc["n2"]})
	var fallback, served []time.Duration
	for trial := 0; trial < 10; trial++ {
		f, s, _ := killTrial(t, c, sdk, "kill")
		fallback, served = append(fallback, f), append(served, s)
		t.Logf("kill %d: last fallback decision %v after the kill; every key decided by a server %v after it", trial, f.Round(time.Millisecond), s.Round(time.Millisecond))
	}
	t.Logf("FIGURE SDK, kill -9 of an owner (10 kills, 3 nodes, --down-after 2s): fallback after the kill p50 %v p99 %v; keys decided by a server again p50 %v p99 %v",
		pct(fallback, .5).Round(time.Millisecond), pct(fallback, .99).Round(time.Millisecond), pct(served, .5).Round(time.Millisecond), pct(served, .99).Round(time.Millisecond))
}

// TestFiguresSDKFrozenNode: the frozen watched node of TestSDKFrozenWatchedNode,
// for its FIGURE lines.
func TestFiguresSDKFrozenNode(t *testing.T) { TestSDKFrozenWatchedNode(t) }
