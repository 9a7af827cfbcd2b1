package client

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/tokenserver/tokenserver/internal/rule"
)

// leaseBenchLimiter is a limiter on a rule so generous that a hot key is
// always served from its lease.
func leaseBenchLimiter(b *testing.B) *Limiter {
	ts := newTestServer(b)
	r := tokenBucket("bench", 1_000_000_000, time.Second, 1_000_000_000)
	r.Lease = rule.Lease{MaxBatch: 10_000_000, TTL: time.Second}
	ts.put(r)
	c, _ := newClient(b, []string{ts.addr}, WithCallTimeout(time.Second))
	waitRule(b, c, "bench")
	lim := c.Limiter("bench", WithLease(0, 0))
	ctx := context.Background()
	for i := 0; i < 100; i++ { // make the key hot and leased
		lim.Allow(ctx, "k")
	}
	if d, _ := lim.AllowN(ctx, "k", 1); d.Source != SourceLease {
		b.Fatalf("not leased: %+v", d)
	}
	return lim
}

// BenchmarkLeaseAllow is the local fast path: Allow served from a lease.
func BenchmarkLeaseAllow(b *testing.B) {
	lim := leaseBenchLimiter(b)
	ctx := context.Background()
	b.Run("single", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if !lim.Allow(ctx, "k") {
				b.Fatal("denied")
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				lim.Allow(ctx, "k")
			}
		})
	})
	b.Run("parallel-keys", func(b *testing.B) {
		var id atomic.Int64
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			k := fmt.Sprint("k", id.Add(1))
			for i := 0; i < 100; i++ {
				lim.Allow(ctx, k)
			}
			for pb.Next() {
				lim.Allow(ctx, k)
			}
		})
	})
}

// BenchmarkRateAllow is golang.org/x/time/rate's Allow, for comparison.
func BenchmarkRateAllow(b *testing.B) {
	l := rate.NewLimiter(rate.Inf, 1)
	b.ReportAllocs()
	for b.Loop() {
		l.Allow()
	}
}

// BenchmarkAllow is Allow against an in-process server, 64 goroutines per
// core on distinct keys, with and without coalescing: it reports RPCs per
// call.
func BenchmarkAllow(b *testing.B) {
	ts := newTestServer(b)
	ts.put(tokenBucket("rpc", 1_000_000_000, time.Second, 1_000_000_000))
	for _, w := range []time.Duration{0, DefaultCoalesceWindow} {
		name := "uncoalesced"
		if w > 0 {
			name = "coalesced"
		}
		b.Run(name, func(b *testing.B) {
			c, _ := newClient(b, []string{ts.addr}, WithCoalesceWindow(w), WithCallTimeout(5*time.Second))
			waitRule(b, c, "rpc")
			lim := c.Limiter("rpc")
			var id atomic.Int64
			before := acquireRPCs(c)
			b.ReportAllocs()
			b.SetParallelism(64)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				k := fmt.Sprint("k", id.Add(1))
				ctx := context.Background()
				for pb.Next() {
					if d, err := lim.AllowN(ctx, k, 1); err != nil || d.Source != SourceServer {
						b.Errorf("%+v %v", d, err)
						return
					}
				}
			})
			b.ReportMetric((acquireRPCs(c)-before)/float64(b.N), "rpcs/op")
			c.Close()
		})
	}
}

// TestFigureFallbackEnterLeave measures how long after the server dies the
// client is in fallback (50ms call timeout, a call every millisecond), and
// how long after it returns the client is back on it. It logs the
// figures; the bounds are generous.
func TestFigureFallbackEnterLeave(t *testing.T) {
	ts := newTestServer(t)
	ts.put(tokenBucket("fig", 1_000_000, time.Second, 1_000_000))
	c, _ := newClient(t, []string{ts.addr})
	waitRule(t, c, "fig")
	lim := c.Limiter("fig")
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			lim.Allow(context.Background(), fmt.Sprint("k", i%16))
			time.Sleep(time.Millisecond)
		}
	}()
	const rounds = 12
	var enter, leave []time.Duration
	for i := 0; i < rounds; i++ {
		waitFor(t, 10*time.Second, "on the server", func() bool { return !c.InFallback() })
		time.Sleep(20 * time.Millisecond)
		ts.stop()
		enter = append(enter, waitFor(t, 5*time.Second, "in fallback", c.InFallback))
		time.Sleep(100 * time.Millisecond)
		ts.restart(false)
		leave = append(leave, waitFor(t, 10*time.Second, "back on the server", func() bool { return !c.InFallback() }))
	}
	close(stop)
	<-done
	q := func(ds []time.Duration, p float64) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[min(len(s)-1, int(p*float64(len(s))))]
	}
	t.Logf("enter fallback after the server died: p50 %v p99 %v max %v (%d rounds)", q(enter, .5), q(enter, .99), slices.Max(enter), rounds)
	t.Logf("back on the server after it returned: p50 %v p99 %v max %v", q(leave, .5), q(leave, .99), slices.Max(leave))
}
