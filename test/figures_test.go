//go:build multiprocess && figures

package e2e

// The figures of the Raft issue, measured on real processes: `make figures`.
// They are reported, never asserted (the machines are shared and noisy).

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

func pct(d []time.Duration, p float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(p * float64(len(s)-1))
	return s[i]
}

// TestFiguresFailover: kill -9 of the leader to a new leader and to the
// first accepted rule write, 10 trials, with fast and production timeouts.
func TestFiguresFailover(t *testing.T) {
	for _, mode := range []struct {
		name string
		args []string
	}{
		{"fast (heartbeat/election 300ms, lease 150ms)", nil},
		{"production (heartbeat/election 1s, lease 500ms)", []string{"--raft-heartbeat-timeout", "1s", "--raft-election-timeout", "1s", "--raft-leader-lease-timeout", "500ms"}},
	} {
		c := newProcCluster(t, 3, mode.args...)
		var toLeader, toWrite []time.Duration
		for trial := 0; trial < 10; trial++ {
			leader := c.leader("")
			var survivor string
			for _, id := range c.ids {
				if id != leader {
					survivor = id
				}
			}
			killed := time.Now()
			c.kill(leader)
			c.waitFor("a new leader", 30*time.Second, func() bool { return c.leader(leader) != "" })
			toLeader = append(toLeader, time.Since(killed))
			c.waitFor("a rule write accepted", 30*time.Second, func() bool {
				ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
				defer cancel()
				_, err := c.admin(survivor).PutRule(ctx, &pb.PutRuleRequest{Rule: rulePB(fmt.Sprint("trial-", trial), 10)})
				return err == nil
			})
			toWrite = append(toWrite, time.Since(killed))
			c.start(leader)
			c.waitFor("the killed node back in the view", 60*time.Second, func() bool { return c.liveCount() == 3 })
		}
		t.Logf("FIGURE failover, %s, 10 trials: new leader median %v max %v; first accepted write median %v max %v",
			mode.name, pct(toLeader, 0.5).Round(time.Millisecond), pct(toLeader, 1).Round(time.Millisecond),
			pct(toWrite, 0.5).Round(time.Millisecond), pct(toWrite, 1).Round(time.Millisecond))
		for _, id := range c.ids {
			c.stop(id)
		}
	}
}

// TestFiguresLatency: forwarded against direct AcquireToken, and rule
// writes, on a 3-node cluster (sequential calls from one client).
func TestFiguresLatency(t *testing.T) {
	c := newProcCluster(t, 3)
	leader := c.leader("")
	ctx := context.Background()
	if _, err := c.admin(leader).PutRule(ctx, &pb.PutRuleRequest{Rule: rulePB("lat", 1<<40)}); err != nil {
		t.Fatal(err)
	}
	view, err := c.token(leader).GetClusterView(ctx, &pb.GetClusterViewRequest{})
	if err != nil {
		t.Fatal(err)
	}
	owner := view.GetMembers()[0].GetId()
	other := view.GetMembers()[1].GetId()
	key := ""
	for i := 0; key == ""; i++ {
		k := fmt.Sprint("k", i)
		resp, err := c.token(owner).AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: "lat", Key: k, Permits: new(int64)})
		if err == nil && resp.GetEpoch() != 0 && ownerOf(view, k) == owner {
			key = k
		}
	}
	measure := func(via string) []time.Duration {
		var d []time.Duration
		for i := 0; i < 5000; i++ {
			s := time.Now()
			if _, err := c.token(via).AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: "lat", Key: key}); err != nil {
				t.Fatal(err)
			}
			d = append(d, time.Since(s))
		}
		return d
	}
	measure(owner) // warm up both paths
	measure(other)
	direct, fwd := measure(owner), measure(other)
	t.Logf("FIGURE AcquireToken direct p50 %v p99 %v; forwarded p50 %v p99 %v; extra p50 %v p99 %v",
		pct(direct, .5), pct(direct, .99), pct(fwd, .5), pct(fwd, .99), pct(fwd, .5)-pct(direct, .5), pct(fwd, .99)-pct(direct, .99))

	var writes []time.Duration
	for i := 0; i < 1000; i++ {
		s := time.Now()
		if _, err := c.admin(leader).PutRule(ctx, &pb.PutRuleRequest{Rule: rulePB(fmt.Sprint("w", i%50), int64(i+1))}); err != nil {
			t.Fatal(err)
		}
		writes = append(writes, time.Since(s))
	}
	t.Logf("FIGURE rule write on the leader of 3 nodes: p50 %v p99 %v (1000 sequential PutRule)", pct(writes, .5), pct(writes, .99))
}
