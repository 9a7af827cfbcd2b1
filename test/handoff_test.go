//go:build multiprocess && figures

package e2e

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// TestFiguresHandoffRollingRestart restarts each node of a 3-node cluster in turn
// (SIGTERM: drain, handoff, restart) under raw gRPC load on 1,000 keys
// with a 100-per-day rule of each counting algorithm: the buckets move
// with their keys, so no key is admitted more than its 100. (Before the
// handoff, every moved key started fresh and could take up to 3x.)
// Not in `make test` yet: the last runs admitted 101-110 for 85 of 5,000
// (rule, key) pairs (one request of 10 over the limit), so the handoff
// still leaves a window around a view change; `make figures` runs it and
// the round's notes report it.
func TestFiguresHandoffRollingRestart(t *testing.T) {
	c := newProcCluster(t, 3)
	algs := map[string]pb.Algorithm{
		"tb": pb.Algorithm_TOKEN_BUCKET, "fw": pb.Algorithm_FIXED_WINDOW, "sw": pb.Algorithm_SLIDING_WINDOW,
		"sl": pb.Algorithm_SLIDING_LOG, "lb": pb.Algorithm_LEAKY_BUCKET,
	}
	const limit, keys, permits = 100, 1000, 10
	for name, alg := range algs {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		r := &pb.Rule{Name: name, Algorithm: alg, Limit: limit, Period: durationpb.New(24 * time.Hour), MaxKeys: 2 * keys}
		if _, err := c.admin(c.ids[0]).PutRule(ctx, &pb.PutRuleRequest{Rule: r}); err != nil {
			t.Fatalf("put %s: %v", name, err)
		}
		cancel()
	}
	var mu sync.Mutex
	admitted := map[string]int64{}
	var calls atomic.Int64
	// round sends one acquire of `permits` for every (rule, key) through
	// node id, in batches.
	round := func(id string) {
		var items []*pb.AcquireTokenRequest
		flush := func() {
			if len(items) == 0 {
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			resp, err := c.token(id).AcquireTokens(ctx, &pb.AcquireTokensRequest{Requests: items})
			calls.Add(1)
			if err == nil {
				mu.Lock()
				for i, r := range resp.GetResults() {
					if r.GetResponse().GetAllowed() {
						admitted[items[i].GetRule()+"/"+items[i].GetKey()] += r.GetResponse().GetGranted()
					}
				}
				mu.Unlock()
			}
			items = items[:0]
		}
		for name := range algs {
			for k := 0; k < keys; k++ {
				p := int64(permits)
				items = append(items, &pb.AcquireTokenRequest{Rule: name, Key: fmt.Sprintf("user-%d", k), Permits: &p})
				if len(items) == 500 {
					flush()
				}
			}
		}
		flush()
	}
	// Use up most of every key first.
	for i := 0; i < 8; i++ {
		round(c.ids[i%3])
	}
	ctx, stopLoad := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var running sync.Map // node id -> true while up
	for _, id := range c.ids {
		running.Store(id, true)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			id := c.ids[i%3]
			if up, _ := running.Load(id); up == true {
				round(id)
			}
		}
	}()
	for _, id := range c.ids {
		running.Store(id, false)
		start := time.Now()
		c.stop(id)
		t.Logf("stopped %s in %v", id, time.Since(start))
		c.start(id)
		running.Store(id, true)
		c.waitFor("all 3 back in the view", 60*time.Second, func() bool { return c.liveCount() == 3 })
		time.Sleep(2 * time.Second) // load runs on the new view (and its handoff)
	}
	stopLoad()
	wg.Wait()
	over := 0
	worst, worstKey := int64(0), ""
	for k, n := range admitted {
		if n > worst {
			worst, worstKey = n, k
		}
		if n > limit {
			over++
		}
	}
	t.Logf("FIGURE handoff rolling restart: %d keys x %d rules, %d calls, worst key %s admitted %d/%d, %d keys over", keys, len(algs), calls.Load(), worstKey, worst, limit, over)
	if over > 0 {
		t.Fatalf("%d (rule, key) pairs admitted more than %d; worst %s: %d", over, limit, worstKey, worst)
	}
}
