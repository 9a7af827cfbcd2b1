//go:build multiprocess && figures

package e2e

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokenserver/tokenserver/client"
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
	total := 0
	for trial := 0; trial < 10; trial++ {
		f, s, n, _ := killTrial(t, c, sdk, "kill")
		fallback, served = append(fallback, f), append(served, s)
		total += n
		t.Logf("kill %d: every key decided by a server %v after the kill; %d fallback decisions, the last %v after it", trial, s.Round(time.Millisecond), n, f.Round(time.Millisecond))
	}
	t.Logf("FIGURE SDK, kill -9 of an owner (10 kills, 3 nodes, --down-after 2s, call timeout 50ms, a call every ms on 4 of its keys): keys decided by a server again p50 %v p99 %v; last fallback decision after the kill p50 %v p99 %v; %d fallback decisions in all",
		pct(served, .5).Round(time.Millisecond), pct(served, .99).Round(time.Millisecond), pct(fallback, .5).Round(time.Millisecond), pct(fallback, .99).Round(time.Millisecond), total)
}

// TestFiguresSDKFrozenNode: the frozen watched node of TestSDKFrozenWatchedNode,
// for its FIGURE lines.
func TestFiguresSDKFrozenNode(t *testing.T) { TestSDKFrozenWatchedNode(t) }

// TestFiguresViewStreamsCPU: CPU of one tokenserver process (3-node
// cluster member, 20 rules) serving 1,000 idle WatchClusterView streams
// (one heartbeat view per second each), over 1,000 connections and over 10,
// against the same process with none.
func TestFiguresViewStreamsCPU(t *testing.T) {
	c := newProcCluster(t, 3)
	for i := 0; i < 20; i++ {
		c.putRuleEverywhere(rulePB(fmt.Sprint("r", i), 100))
	}
	id := "n1"
	pid := c.procs[id].cmd.Process.Pid
	measure := func() float64 {
		time.Sleep(2 * time.Second)
		start, cpu0 := time.Now(), procCPU(t, pid)
		time.Sleep(10 * time.Second)
		return float64(procCPU(t, pid)-cpu0) / float64(time.Since(start)) * 100
	}
	idle := measure()
	for _, conns := range []int{1000, 10} {
		ctx, cancel := context.WithCancel(context.Background())
		var cs []*grpc.ClientConn
		for i := 0; i < conns; i++ {
			// The SDK's window options (no BDP pings per message).
			conn, err := grpc.NewClient(c.grpc[id], grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithInitialWindowSize(1<<20), grpc.WithInitialConnWindowSize(1<<20))
			if err != nil {
				t.Fatal(err)
			}
			cs = append(cs, conn)
		}
		var wg sync.WaitGroup
		var got atomic.Int64
		for i := 0; i < 1000; i++ {
			st, err := pb.NewTokenServiceClient(cs[i%conns]).WatchClusterView(ctx, &pb.GetClusterViewRequest{})
			if err != nil {
				t.Fatal(err)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					if _, err := st.Recv(); err != nil {
						return
					}
					got.Add(1)
				}
			}()
		}
		got.Store(0)
		busy := measure()
		views := got.Load()
		cancel()
		wg.Wait()
		for _, conn := range cs {
			conn.Close()
		}
		t.Logf("FIGURE 1,000 idle WatchClusterView streams over %d connections: server CPU %.2f%% of a core (%.2f%% with none); %d views received in the 12 s (heartbeat 1 s)", conns, busy, idle, views)
	}
}

// TestFiguresSDKRollingRestart: each node of 3 in turn stopped with SIGTERM
// (it leaves the routing view first), started again and waited for back in
// the view, under SDK load on 30 keys of a DENY rule: fallback decisions
// per step, and the time from the first to the last of them.
func TestFiguresSDKRollingRestart(t *testing.T) {
	c := newProcCluster(t, 3)
	c.putRuleEverywhere(&pb.Rule{Name: "roll", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 1_000_000, Period: durationpb.New(time.Second),
		Fallback: &pb.Fallback{Policy: pb.FallbackPolicy_DENY}})
	sdk, _ := sdkClient(t, []string{c.grpc["n0"], c.grpc["n1"], c.grpc["n2"]})
	var keys []string
	for i := 0; i < 30; i++ {
		keys = append(keys, fmt.Sprint("roll-", i))
	}
	stop := make(chan struct{})
	seen := loadLoop(sdk.Limiter("roll"), keys, time.Millisecond, stop)
	time.Sleep(300 * time.Millisecond)
	type step struct {
		id         string
		start, end time.Time
	}
	var steps []step
	for _, id := range c.ids {
		s := step{id: id, start: time.Now()}
		c.stop(id)
		c.start(id)
		c.waitFor(id+" back in the view", 60*time.Second, func() bool { return c.liveCount() == 3 })
		s.end = time.Now()
		steps = append(steps, s)
	}
	close(stop)
	all := <-seen
	for _, s := range steps {
		var n, calls int
		var first, last time.Time
		for _, d := range all {
			if d.at.Before(s.start) || d.at.After(s.end) {
				continue
			}
			calls++
			if d.source == client.SourceFallback {
				if n == 0 {
					first = d.at
				}
				n, last = n+1, d.at
			}
		}
		t.Logf("FIGURE SDK rolling restart, step %s (SIGTERM, start, back in the view: %v): %d calls, %d fallback decisions (DENY: ErrUnavailable), spanning %v",
			s.id, s.end.Sub(s.start).Round(time.Millisecond), calls, n, last.Sub(first).Round(time.Millisecond))
	}
}
