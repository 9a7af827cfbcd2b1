//go:build multiprocess && figures

package e2e

// The cost of replication (issue 18's figure "at 100k decisions/s per
// node: ≤ 10% for durable rules, ≤ 2% for others"), measured on a real
// 3-node cluster. Reported, never asserted.

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// TestFiguresReplicationCost drives one node at a fixed decision rate
// (REPL_RATE, default 100k/s; AcquireTokens batches of 1000 on 10k keys
// it owns, so nothing is forwarded) for REPL_DURATION (default 5 s), in
// three clusters: (a) a rule that is not durable, replication ticking
// every second; (b) the same with --replication-interval 1m (the
// longest: replication all but off); (c) a durable rule, every second.
// It reports the rate reached and the CPU seconds per decision of the
// owner and of all three server processes (utime + stime). The three run
// REPL_ROUNDS times (default 3), each round in another order (b a c,
// a c b, c b a), and the comparison is of medians: run in one fixed
// order, the later clusters ran hotter and the figure carried an order
// effect of up to 9%.
func TestFiguresReplicationCost(t *testing.T) {
	target := 100_000.0
	if r, err := strconv.ParseFloat(os.Getenv("REPL_RATE"), 64); err == nil && r > 0 {
		target = r
	}
	dur := 5 * time.Second
	if d, err := time.ParseDuration(os.Getenv("REPL_DURATION")); err == nil {
		dur = d
	}
	const batch, workers = 1000, 8
	type result struct {
		rate, owner, all float64 // decisions/s; CPU ns per decision
	}
	run := func(name string, durable bool, interval string) result {
		c := newProcCluster(t, 3, "--replication-interval", interval)
		defer func() {
			for _, id := range c.ids {
				c.stop(id)
			}
		}()
		owner := c.leader("")
		c.putRuleEverywhere(&pb.Rule{Name: "cost", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 1 << 40,
			Period: durationpb.New(time.Hour), Durable: durable})
		keys := keysOf(c.fullView(owner), owner, "cost-", 10000)
		token := c.token(owner)
		reqs := make([]*pb.AcquireTokensRequest, len(keys)/batch)
		for i := range reqs {
			reqs[i] = &pb.AcquireTokensRequest{}
			for _, k := range keys[i*batch : (i+1)*batch] {
				reqs[i].Requests = append(reqs[i].Requests, &pb.AcquireTokenRequest{Rule: "cost", Key: k})
			}
		}
		// Warm up: every key's bucket exists.
		for _, r := range reqs {
			if _, err := token.AcquireTokens(context.Background(), r); err != nil {
				t.Fatal(err)
			}
		}
		cpu := func() (own, all time.Duration) {
			for _, id := range c.ids {
				d := procCPU(t, c.procs[id].cmd.Process.Pid)
				if id == owner {
					own = d
				}
				all += d
			}
			return own, all
		}
		lim := rate.NewLimiter(rate.Limit(target), batch)
		ctx, cancel := context.WithTimeout(context.Background(), dur)
		defer cancel()
		var done atomic.Int64
		var wg sync.WaitGroup
		own0, all0 := cpu()
		start := time.Now()
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; ; i += workers {
					if lim.WaitN(ctx, batch) != nil {
						return
					}
					if _, err := token.AcquireTokens(ctx, reqs[i%len(reqs)]); err != nil {
						if ctx.Err() == nil {
							t.Errorf("acquire: %v", err)
						}
						return
					}
					done.Add(batch)
				}
			}()
		}
		wg.Wait()
		el := time.Since(start)
		own1, all1 := cpu()
		n := float64(done.Load())
		r := result{rate: n / el.Seconds(), owner: float64(own1-own0) / n, all: float64(all1-all0) / n}
		t.Logf("FIGURE replication cost, %s: %.0f decisions/s (target %.0f); server CPU per decision: owner %.0f ns, all three nodes %.0f ns",
			name, r.rate, target, r.owner, r.all)
		return r
	}
	rounds := 3
	if n, err := strconv.Atoi(os.Getenv("REPL_ROUNDS")); err == nil && n > 0 {
		rounds = n
	}
	modes := []struct {
		name     string
		durable  bool
		interval string
	}{
		{"(b) not durable, --replication-interval 1m", false, "1m"},
		{"(a) not durable, --replication-interval 1s", false, "1s"},
		{"(c) durable, --replication-interval 1s", true, "1s"},
	}
	got := make([][]result, len(modes))
	for r := range rounds {
		for j := range modes {
			m := (j + r) % len(modes)
			got[m] = append(got[m], run(fmt.Sprintf("%s, round %d", modes[m].name, r+1), modes[m].durable, modes[m].interval))
		}
	}
	median := func(rs []result, f func(result) float64) float64 {
		xs := make([]float64, len(rs))
		for i, r := range rs {
			xs[i] = f(r)
		}
		slices.Sort(xs)
		if len(xs)%2 == 1 {
			return xs[len(xs)/2]
		}
		return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
	}
	all := func(r result) float64 { return r.all }
	own := func(r result) float64 { return r.owner }
	off, plain, dur1 := got[0], got[1], got[2]
	for m := range modes {
		t.Logf("FIGURE replication cost, %s: median over %d rounds, server CPU per decision: owner %.0f ns, all three nodes %.0f ns",
			modes[m].name, rounds, median(got[m], own), median(got[m], all))
	}
	pctOf := func(x, base float64) string { return fmt.Sprintf("%+.1f%%", 100*(x-base)/base) }
	t.Logf("FIGURE replication cost per decision, medians of %d rounds, all nodes, against (b): not durable %s (target ≤ 2%%), durable %s (target ≤ 10%%); owner alone: %s, %s",
		rounds, pctOf(median(plain, all), median(off, all)), pctOf(median(dur1, all), median(off, all)),
		pctOf(median(plain, own), median(off, own)), pctOf(median(dur1, own), median(off, own)))
}
