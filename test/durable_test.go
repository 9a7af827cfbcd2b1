//go:build multiprocess

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// argOf is the value of flag name in node id's arguments.
func (c *procCluster) argOf(id, name string) string {
	args := c.args[id]
	for i := range args[:len(args)-1] {
		if args[i] == name {
			return args[i+1]
		}
	}
	c.t.Fatalf("node %s has no %s", id, name)
	return ""
}

// metricSum adds up the samples of the metric named name on node id (0
// when it has none).
func (c *procCluster) metricSum(id, name string) float64 {
	resp, err := http.Get("http://" + c.argOf(id, "--http-addr") + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}

// fullView returns node id's routing view once it lists every node and
// id is ready (caught up with the Raft log: as an operator waits for
// /readyz after a restart, since a node still replaying its log answers
// callers NOT_READY).
func (c *procCluster) fullView(id string) *pb.ClusterView {
	c.t.Helper()
	var v *pb.ClusterView
	c.waitFor("a view of every node on "+id+", ready", 30*time.Second, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		var err error
		v, err = c.token(id).GetClusterView(ctx, &pb.GetClusterViewRequest{})
		return err == nil && len(v.GetMembers()) == len(c.ids) && v.GetReady()
	})
	return v
}

// TestDurableKillOwner: kill -9 of the owner of four keys of a durable
// 1,000-per-hour rule while they take 200 admissions/s in all: the next
// owner continues from its copy, so each key is over-admitted by at most
// what it was admitted in one replication interval (without durability
// it would start fresh and admit its 1,000 again).
func TestDurableKillOwner(t *testing.T) {
	const (
		limit    = 1000
		interval = time.Second
		perKey   = 20 * time.Millisecond // 50/s per key, 200/s in all
	)
	c := newProcCluster(t, 3, "--replication-interval", interval.String())
	c.putRuleEverywhere(&pb.Rule{Name: "hourly", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: limit, Period: durationpb.New(time.Hour), Durable: true})
	leader := c.leader("")
	var victim, entry string
	for _, id := range c.ids {
		switch {
		case id != leader && victim == "":
			victim = id
		case entry == "" && id != victim:
			entry = id
		}
	}
	if victim == "" || entry == "" {
		t.Fatalf("no victim or entry (leader %s)", leader)
	}
	keys := keysOf(c.fullView(entry), victim, "durable-", 4)

	var mu sync.Mutex
	admitted := map[string][]time.Time{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	start := time.Now()
	for _, k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(perKey)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				resp, err := c.token(entry).AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: "hourly", Key: k})
				cancel()
				if err == nil && resp.GetAllowed() {
					mu.Lock()
					admitted[k] = append(admitted[k], time.Now())
					mu.Unlock()
				}
			}
		}()
	}
	time.Sleep(8 * time.Second) // load time before the crash: 400 admissions per key
	killedAt := time.Now()
	c.kill(victim)
	time.Sleep(22 * time.Second) // past the limit on the successor
	close(stop)
	wg.Wait()
	elapsed := time.Since(start)
	refill := int64(float64(limit) * elapsed.Seconds() / time.Hour.Seconds()) // token bucket refill meanwhile
	for _, k := range keys {
		ts := admitted[k]
		var inInterval, before int64
		for _, at := range ts {
			if at.Before(killedAt) {
				before++
				if killedAt.Sub(at) <= interval {
					inInterval++
				}
			}
		}
		total := int64(len(ts))
		over := total - limit - refill
		// Generous: the copy is at most one interval (plus the tick's own
		// round trip) behind; allow half an interval more.
		bound := inInterval * 3 / 2
		t.Logf("key %s: admitted %d (%d before the kill, %d in the last interval before it), limit %d + refill %d: over-admission %d, bound %d",
			k, total, before, inInterval, limit, refill, over, bound)
		if total < limit {
			t.Errorf("key %s: admitted %d, below the limit %d: the test did not reach the limit", k, total, limit)
		}
		if over > bound {
			t.Errorf("key %s: over-admission %d is above what one replication interval admitted (%d, generous bound %d)", k, over, inInterval, bound)
		}
	}
}

// waitCheckpointed waits until every node has written a checkpoint and
// the checkpoints hold want buckets in all.
func (c *procCluster) waitCheckpointed(want int) {
	c.t.Helper()
	c.waitFor(fmt.Sprintf("%d buckets checkpointed", want), 20*time.Second, func() bool {
		var sum float64
		for _, id := range c.ids {
			if _, err := os.Stat(filepath.Join(c.argOf(id, "--data-dir"), "durable-buckets.ckpt")); err != nil {
				return false
			}
			sum += c.metricSum(id, "tokenserver_checkpoint_buckets")
		}
		return sum == float64(want)
	})
}

// join starts a new node id that joins the cluster through n0, with its
// data in dir, and connects to it.
func (c *procCluster) join(id, dir string) {
	c.t.Helper()
	c.grpc[id] = freePort(c.t)
	c.args[id] = append([]string{"--node-id", id, "--grpc-addr", c.grpc[id], "--http-addr", freePort(c.t), "--raft-addr", freePort(c.t),
		"--data-dir", filepath.Join(dir, id), "--join", c.grpc["n0"], "--stabilization-time", "1s"}, fastRaft...)
	c.start(id)
	conn, err := grpc.NewClient(c.grpc[id], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { conn.Close() })
	c.ids = append(c.ids, id)
	c.conns[id] = conn
}

// isHold reports whether resp is a new owner's answer while a key's state
// is on its way to it: a deny with the handoff's 20 ms retry_after.
func isHold(resp *pb.AcquireTokenResponse) bool {
	return !resp.GetAllowed() && resp.GetRetryAfterNs() == int64(20*time.Millisecond)
}

// TestDurableFullRestart: kill -9 of every node of a cluster with durable
// daily quotas half used, then a start of every node: each key resumes
// with what it had left (from the checkpoints), not a fresh quota.
func TestDurableFullRestart(t *testing.T) {
	const limit, used, nkeys = 100, 60, 30
	c := newProcCluster(t, 3, "--checkpoint-interval", "500ms")
	rules := []*pb.Rule{
		{Name: "daily-tb", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: limit, Period: durationpb.New(24 * time.Hour), Durable: true},
		{Name: "daily-sw", Algorithm: pb.Algorithm_SLIDING_WINDOW, Limit: limit, Period: durationpb.New(24 * time.Hour), Durable: true},
	}
	for _, r := range rules {
		c.putRuleEverywhere(r)
	}
	view := c.fullView(c.ids[0])
	var keys []string
	for i := 0; i < nkeys; i++ {
		keys = append(keys, fmt.Sprintf("tenant-%d", i))
	}
	acquire := func(id, ruleName, key string, permits int64) *pb.AcquireTokenResponse {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := c.token(id).AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: ruleName, Key: key, Permits: &permits})
		if err != nil {
			t.Fatalf("acquire %s/%s on %s: %v", ruleName, key, id, err)
		}
		return resp
	}
	// Straight to each key's owner: a forwarded call that times out is
	// decided again by the next owner, which this test does not measure.
	for _, k := range keys {
		for _, r := range rules {
			if resp := acquire(ownerOf(view, k), r.GetName(), k, used); !resp.GetAllowed() {
				t.Fatalf("%s/%s: first %d permits denied: %v", r.GetName(), k, used, resp)
			}
		}
	}
	// Wait until the checkpoints hold every bucket twice: on its owner
	// and, as a copy, on its next owner (each bucket changed once, so a
	// checkpoint that holds it holds its last state).
	c.waitCheckpointed(2 * nkeys * len(rules))
	for _, id := range c.ids {
		c.kill(id)
	}
	for _, id := range c.ids {
		c.start(id)
	}
	c.waitFor("a leader and a view of all nodes after the restart", 60*time.Second, func() bool { return c.liveCount() == len(c.ids) })
	for _, id := range c.ids {
		c.fullView(id)
	}
	var resumed, fresh int
	for i, k := range keys {
		for _, r := range rules {
			resp := acquire(c.ids[(i+1)%len(c.ids)], r.GetName(), k, 0) // a peek, through another node than before
			for end := time.Now().Add(5 * time.Second); isHold(resp) && time.Now().Before(end); {
				// The key's state is still on its way to its owner (the
				// nodes hand copies on once ready): retry, as a client
				// does after retry_after.
				time.Sleep(time.Duration(resp.GetRetryAfterNs()))
				resp = acquire(c.ids[(i+1)%len(c.ids)], r.GetName(), k, 0)
			}
			left := resp.GetRemaining()
			switch {
			case left >= limit-used && left <= limit-used+1:
				resumed++
			case left == limit:
				fresh++
				t.Errorf("%s/%s: started fresh (%d left) after the full restart, want %d", r.GetName(), k, left, limit-used)
			default:
				t.Errorf("%s/%s: %d left after the full restart, want %d", r.GetName(), k, left, limit-used)
			}
		}
	}
	t.Logf("after a full restart: %d of %d (rule, key) quotas resumed, %d started fresh", resumed, len(keys)*len(rules), fresh)
}
