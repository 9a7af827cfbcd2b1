package bucket

import (
	"fmt"
	"math"
	"testing"
	"time"
)

// TestIntegerEdges runs every algorithm at the edges of what Validate
// accepts (limits and bursts up to 2^53, periods from 1ns to 10 years, times
// near the int64 bounds): remaining is never negative nor above capacity,
// and no duration is negative.
func TestIntegerEdges(t *testing.T) {
	var cfgs []Config
	for _, a := range []Algorithm{TokenBucket, LeakyBucket, FixedWindow, SlidingWindow, SlidingLog, Concurrency} {
		limits := []int64{1, 3, MaxLimit}
		if a == SlidingLog || a == Concurrency {
			limits = []int64{1, 3, MaxLogLimit}
		}
		periods := []int64{1, 1000, MaxDuration}
		if a == Concurrency {
			periods = []int64{1, 1000, MaxConcurrencyPeriod}
		}
		if a == SlidingWindow {
			periods = []int64{1000, MaxDuration - MaxDuration%10}
		}
		for _, l := range limits {
			for _, p := range periods {
				for _, burst := range []int64{0, MaxLimit} {
					c := Config{Algorithm: a, Limit: l, Period: p, Burst: burst}
					if c.Validate() == nil {
						cfgs = append(cfgs, c)
					}
				}
				if a == TokenBucket && p >= 1000 {
					c := Config{Algorithm: a, Limit: l, Period: p, Warmup: p}
					if c.Validate() == nil {
						cfgs = append(cfgs, c)
					}
				}
			}
		}
	}
	for _, c := range cfgs {
		for _, now := range []int64{0, 1, math.MaxInt64 / 8, -math.MaxInt64 / 8} {
			t.Run(fmt.Sprintf("%s/l=%d/p=%d/b=%d/w=%d/now=%d", c.Algorithm, c.Limit, c.Period, c.Burst, c.Warmup, now), func(t *testing.T) {
				b := New(&c, now)
				capacity := c.Capacity()
				for i, r := range []Request{
					{Permits: 0}, {Permits: 1, LeaseID: 1}, {Permits: capacity, LeaseID: 2}, {Permits: capacity, MaxWait: c.Period, LeaseID: 3},
					{Permits: 1, Partial: OffersPartial(c.Algorithm), LeaseID: 4}, {Permits: 0},
				} {
					at := now + int64(i)*(c.Period/2)
					res := b.Acquire(&c, at, r)
					if res.Remaining < 0 || res.Remaining > capacity || res.Granted < 0 || res.Granted > capacity ||
						res.RetryAfter < 0 || res.ResetAfter < 0 || res.WaitBefore < 0 {
						t.Fatalf("step %d %+v: %+v (capacity %d)", i, r, res, capacity)
					}
					if n := b.Refill(&c, at, Grant{IssuedAt: at, Permits: capacity, LeaseID: 2}, capacity); n < 0 || n > capacity {
						t.Fatalf("step %d: refill gave back %d of capacity %d", i, n, capacity)
					}
				}
			})
		}
	}
}

// TestDebtEdges charges absurd overruns (up to MaxInt64 permits) to every
// algorithm that takes commits, at limits 1 and 2^53: durations saturate
// instead of wrapping, and nothing leaves its range.
func TestDebtEdges(t *testing.T) {
	var cfgs []Config
	for _, c := range commitConfigs() {
		for _, l := range []int64{1, MaxLimit} {
			c.Limit, c.Burst = l, 0
			if c.Validate() == nil {
				cfgs = append(cfgs, c)
			}
		}
	}
	cfgs = append(cfgs, Config{Algorithm: FixedWindow, Limit: 1, Calendar: CalendarMonth, Location: mustZone("Pacific/Apia")})
	for _, c := range cfgs {
		now := wall(time.UTC, 2024, 1, 1, 0, 0)
		for _, n := range []int64{1, MaxLimit, math.MaxInt64 / 2, math.MaxInt64} {
			b := New(&c, now)
			g := b.Acquire(&c, now, Request{Permits: 1})
			for i, res := range []CommitResult{
				must(b.Commit(&c, now, Grant{IssuedAt: now, Permits: g.Granted}, n)),
				must(b.Debit(&c, now+1, n)),
			} {
				if res.Remaining < 0 || res.Remaining > c.Capacity() || res.Debt < 0 || res.RetryAfter < 0 || res.RetryAfter > maxDur {
					t.Fatalf("%s/%s limit %d: charge %d, call %d: %+v", c.Algorithm, c.Calendar, c.Limit, n, i, res)
				}
			}
			r := b.Acquire(&c, now+2, Request{Permits: 1})
			if r.Allowed && n > 1 || r.RetryAfter < 0 || r.ResetAfter < 0 || r.RetryAfter > maxDur || r.ResetAfter > maxDur {
				t.Fatalf("%s/%s limit %d: after charging %d twice: %+v", c.Algorithm, c.Calendar, c.Limit, n, r)
			}
		}
	}
}

func must(res CommitResult, err error) CommitResult {
	if err != nil {
		panic(err)
	}
	return res
}
