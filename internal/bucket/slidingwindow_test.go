package bucket

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

func TestSlidingWindow(t *testing.T) {
	// 4 per second in 4 sub-windows of 250ms.
	c := &Config{Algorithm: SlidingWindow, Limit: 4, Period: sec, SampleCount: 4}
	run(t, c, []step{
		idle(0, true),
		acquire(0, 2, Result{Allowed: true, Granted: 2, Remaining: 2, ResetAfter: sec}),
		acquire(300*ms, 2, Result{Allowed: true, Granted: 2, ResetAfter: 950 * ms}),
		// Sub-window 0 leaves the count at 1s.
		acquire(500*ms, 1, Result{RetryAfter: 500 * ms, ResetAfter: 750 * ms}),
		acquire(999*ms, 0, Result{RetryAfter: 1 * ms, ResetAfter: 251 * ms}),
		acquire(999*ms, 3, Result{RetryAfter: 251 * ms, ResetAfter: 251 * ms}),
		acquire(sec, 2, Result{Allowed: true, Granted: 2, ResetAfter: sec}),
		request(sec, Request{Permits: 3, Partial: true}, Result{RetryAfter: 250 * ms, ResetAfter: sec}),
		// Refill: only while the grant's sub-window still counts.
		refill(sec, Grant{IssuedAt: 300 * ms, Permits: 2}, 1, 1),
		refill(sec, Grant{IssuedAt: 0, Permits: 2}, 2, 0),
		// The clock jumps back: 900ms counts as 1s.
		request(900*ms, Request{Permits: 3, Partial: true}, Result{Allowed: true, Granted: 1, ResetAfter: sec}),
		refill(sec+10*ms, Grant{IssuedAt: sec, Permits: 1}, 5, 1),
		refill(sec+10*ms, Grant{IssuedAt: sec, Permits: 2}, 5, 2),
		refill(sec+10*ms, Grant{IssuedAt: sec, Permits: 2}, 5, 0), // never below 0
		acquire(sec+10*ms, 0, Result{Allowed: true, Remaining: 3, ResetAfter: 240 * ms}),
		acquire(1250*ms, 5, Result{Remaining: 4}), // above the limit: never
		idle(1250*ms, true),
	})
}

// TestSlidingWindowBound checks the overshoot bound stated on
// slidingWindow against random arrivals, for several sample counts: at most
// Limit in any interval of (K-1)/K of a Period, at most 2*Limit in any
// Period, and 2*Limit reachable within (K-1)/K of a Period plus 2ns.
func TestSlidingWindowBound(t *testing.T) {
	const w = 1000 * us // sub-window width
	for _, k := range []int64{1, 2, 3, 4, 5, 10} {
		t.Run(fmt.Sprint("K=", k), func(t *testing.T) {
			period := k * w
			for seed := range uint64(50) {
				rng := rand.New(rand.NewPCG(seed, uint64(k)))
				c := &Config{Algorithm: SlidingWindow, Limit: 1 + rng.Int64N(8), Period: period, SampleCount: k}
				fixed := &Config{Algorithm: FixedWindow, Limit: c.Limit, Period: period}
				b, f := New(c, 0), New(fixed, 0)
				var admitted []event
				now := int64(0)
				for range 400 {
					switch rng.IntN(6) {
					case 0: // same time
					case 1:
						now++
					case 2: // to the last nanosecond of this sub-window
						now = (now/w+1)*w - 1
					case 3: // to the start of the next one
						now = (now/w + 1) * w
					default:
						now += rng.Int64N(2 * w)
					}
					r := Request{Permits: 1 + rng.Int64N(3), Partial: rng.IntN(3) == 0}
					res := b.Acquire(c, now, r)
					if k == 1 { // one sample is the fixed window
						if fr := f.Acquire(fixed, now, r); fr != res {
							t.Fatalf("at %d %+v: sliding K=1 %+v, fixed window %+v", now, r, res, fr)
						}
					}
					if res.Granted > 0 {
						admitted = append(admitted, event{now, res.Granted})
					}
				}
				if k > 1 {
					if n, at := maxInWindow(admitted, (k-1)*period/k); n > c.Limit {
						t.Fatalf("limit %d: %d admitted in [%d, %d)", c.Limit, n, at, at+(k-1)*period/k)
					}
				}
				if n, at := maxInWindow(admitted, period); n > 2*c.Limit {
					t.Fatalf("limit %d: %d admitted in the period [%d, %d)", c.Limit, n, at, at+period)
				}
			}
			// The adversarial sequence: Limit at the last nanosecond of
			// sub-window 0, Limit again when sub-window 0 leaves the count.
			c := &Config{Algorithm: SlidingWindow, Limit: 10, Period: period, SampleCount: k}
			b := New(c, 0)
			first, second := w-1, k*w
			if res := b.Acquire(c, first, Request{Permits: 10}); !res.Allowed {
				t.Fatalf("first burst denied: %+v", res)
			}
			if res := clone(b).Acquire(c, second-1, Request{Permits: 1}); res.Allowed {
				t.Fatalf("admitted before sub-window 0 left: %+v", res)
			}
			if res := b.Acquire(c, second, Request{Permits: 10}); !res.Allowed {
				t.Fatalf("second burst denied: %+v", res)
			}
			if span := second - first + 1; span != (k-1)*period/k+2 || span > period && k > 1 {
				t.Fatalf("2*Limit within %dns, want (K-1)/K of the period plus 2ns", span)
			}
		})
	}
}

// event is count permits admitted at time t.
type event struct{ t, count int64 }

// maxInWindow is the most admitted in any [a, a+length), by brute force
// over windows starting at an admission (the maximum is always at one), and
// where that window starts. events are in nondecreasing time.
func maxInWindow(events []event, length int64) (most, at int64) {
	for i := range events {
		var n int64
		for j := i; j < len(events) && events[j].t < events[i].t+length; j++ {
			n += events[j].count
		}
		if n > most {
			most, at = n, events[i].t
		}
	}
	return most, at
}

func TestSlidingWindowReconfigure(t *testing.T) {
	c := &Config{Algorithm: SlidingWindow, Limit: 4, Period: sec, SampleCount: 4}
	run(t, c, []step{
		acquire(0, 1, Result{Allowed: true, Granted: 1, Remaining: 3, ResetAfter: sec}),
		acquire(600*ms, 2, Result{Allowed: true, Granted: 2, Remaining: 1, ResetAfter: 900 * ms}),
		// A new layout carries the total (3) into the current sub-window.
		reconfigure(600*ms, &Config{Algorithm: SlidingWindow, Limit: 4, Period: sec, SampleCount: 10}),
		acquire(600*ms, 2, Result{Remaining: 1, RetryAfter: sec, ResetAfter: sec}),
		// A new limit alone keeps the ring.
		reconfigure(700*ms, &Config{Algorithm: SlidingWindow, Limit: 5, Period: sec, SampleCount: 10}),
		acquire(700*ms, 2, Result{Allowed: true, Granted: 2, ResetAfter: sec}),
	})
}
