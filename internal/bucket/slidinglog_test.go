package bucket

import (
	"math/rand/v2"
	"testing"
)

func TestSlidingLog(t *testing.T) {
	c := &Config{Algorithm: SlidingLog, Limit: 3, Period: sec}
	run(t, c, []step{
		idle(0, true),
		acquire(0, 1, Result{Allowed: true, Granted: 1, Remaining: 2, ResetAfter: sec}),
		acquire(400*ms, 2, Result{Allowed: true, Granted: 2, ResetAfter: sec}),
		// The entry at 0 counts until 1s, the one at 400ms until 1.4s.
		acquire(500*ms, 1, Result{RetryAfter: 500 * ms, ResetAfter: 900 * ms}),
		acquire(500*ms, 0, Result{RetryAfter: 500 * ms, ResetAfter: 900 * ms}),
		acquire(500*ms, 3, Result{RetryAfter: 900 * ms, ResetAfter: 900 * ms}),
		request(500*ms, Request{Permits: 1, MaxWait: sec}, Result{RetryAfter: 500 * ms, ResetAfter: 900 * ms}), // MaxWait ignored
		acquire(999*ms, 1, Result{RetryAfter: 1 * ms, ResetAfter: 401 * ms}),
		acquire(sec, 1, Result{Allowed: true, Granted: 1, ResetAfter: sec}),
		// Refill: only entries still logged, at most the entry and the grant.
		refill(sec, Grant{IssuedAt: 400 * ms, Permits: 2}, 1, 1),
		refill(sec, Grant{IssuedAt: 0, Permits: 1}, 1, 0),
		refill(sec, Grant{IssuedAt: 300 * ms, Permits: 1}, 1, 0), // no such entry
		// The clock jumps back: 700ms counts as 1s, merging with its entry.
		acquire(700*ms, 1, Result{Allowed: true, Granted: 1, ResetAfter: sec}),
		refill(sec, Grant{IssuedAt: sec, Permits: 2}, 5, 2),
		acquire(sec, 0, Result{Allowed: true, Remaining: 2, ResetAfter: 400 * ms}),
		refill(sec, Grant{IssuedAt: 400 * ms, Permits: 2}, 1, 1), // removes the entry
		acquire(sec, 0, Result{Allowed: true, Remaining: 3}),
		idle(sec, true),
		acquire(sec, 4, Result{Remaining: 3}), // above the limit: never
		request(sec, Request{Permits: 4, Partial: true}, Result{Allowed: true, Granted: 3, ResetAfter: sec}),
		idle(2*sec-1, false),
		idle(2*sec, true),
	})
}

// checkLogExact plays arrivals (nondecreasing times) against a sliding log
// and a brute-force model: every answer must be exactly the model's, and no
// interval of one Period may admit more than Limit.
func checkLogExact(t testing.TB, c *Config, times, permits []int64) {
	t.Helper()
	b := New(c, 0)
	var log []event  // every admission
	var live []event // the model: admissions that may still count
	for i, now := range times {
		n := permits[i]
		for len(live) > 0 && now-live[0].t >= c.Period { // times never go back
			live = live[1:]
		}
		// What counts at time x >= now.
		counted := func(x int64) (sum int64) {
			for _, e := range live {
				if x-e.t < c.Period {
					sum += e.count
				}
			}
			return sum
		}
		need := max(n, 1)
		wantOK := n <= c.Limit && counted(now)+need <= c.Limit
		var wantRetry int64
		if !wantOK && n <= c.Limit {
			for _, e := range live { // the answer is when some entry expires
				if x := e.t + c.Period; x > now && counted(x)+need <= c.Limit {
					wantRetry = x - now
					break
				}
			}
		}
		res := b.Acquire(c, now, Request{Permits: n})
		if res.Allowed != wantOK || res.RetryAfter != wantRetry || res.Remaining != c.Limit-counted(now)-res.Granted {
			t.Fatalf("request %d at %d for %d: got %+v, want allowed %v, retry_after %d (counted %v)", i, now, n, res, wantOK, wantRetry, live)
		}
		if res.Granted > 0 {
			log = append(log, event{now, res.Granted})
			live = append(live, event{now, res.Granted})
		}
	}
	if most, at := maxInWindow(log, c.Period); most > c.Limit {
		t.Fatalf("%d admitted in [%d, %d), limit %d", most, at, at+c.Period, c.Limit)
	}
	if lb := b.(*slidingLog); int64(lb.size) > c.Limit || int64(len(lb.buf)) > c.Limit {
		t.Fatalf("log holds %d entries in a ring of %d, limit %d", lb.size, len(lb.buf), c.Limit)
	}
}

func TestSlidingLogExact(t *testing.T) {
	for seed := range uint64(300) {
		rng := rand.New(rand.NewPCG(seed, 11))
		c := &Config{Algorithm: SlidingLog, Limit: 1 + rng.Int64N(10), Period: 1 + rng.Int64N(1000)}
		var times, permits []int64
		now := int64(0)
		for range 300 {
			if rng.IntN(3) > 0 {
				now += rng.Int64N(c.Period/c.Limit + 2)
			}
			times = append(times, now)
			permits = append(permits, rng.Int64N(c.Limit+2))
		}
		checkLogExact(t, c, times, permits)
	}
}

// FuzzSlidingLog checks the sliding log against a brute-force model over
// arbitrary arrival sequences: the first two bytes pick Limit and Period,
// then each pair of bytes is a time step and a request size.
func FuzzSlidingLog(f *testing.F) {
	f.Add([]byte{3, 10, 0, 1, 0, 2, 5, 1, 40, 3, 0, 1})
	f.Add([]byte{1, 0, 0, 1, 0, 1, 1, 1})
	f.Add([]byte{20, 255, 1, 5, 2, 7, 3, 20, 100, 21, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 2 || len(data) > 2+2*1024 {
			return
		}
		c := &Config{Algorithm: SlidingLog, Limit: 1 + int64(data[0]%32), Period: 1 + 10*int64(data[1])}
		var times, permits []int64
		now := int64(0)
		for data = data[2:]; len(data) >= 2; data = data[2:] {
			now += int64(data[0]) * c.Period / 64
			times = append(times, now)
			permits = append(permits, int64(data[1])%(c.Limit+2))
		}
		checkLogExact(t, c, times, permits)
	})
}

// TestSlidingLogMemory checks that the ring stops growing at Limit entries
// and that a full ring allocates nothing.
func TestSlidingLogMemory(t *testing.T) {
	c := &Config{Algorithm: SlidingLog, Limit: 100, Period: sec}
	b := New(c, 0)
	now := int64(0)
	for range 1000 {
		now += 10 * ms
		b.Acquire(c, now, Request{Permits: 1})
	}
	if n := len(b.(*slidingLog).buf); n != 100 {
		t.Fatalf("ring of %d entries, want 100", n)
	}
	allocs := testing.AllocsPerRun(1000, func() {
		now += 10 * ms
		b.Acquire(c, now, Request{Permits: 1})
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per acquire", allocs)
	}
}
