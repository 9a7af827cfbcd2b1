package bucket

import (
	"testing"
)

func TestTokenBucket(t *testing.T) {
	// 10 per second: one token per 100ms, capacity 3.
	c := &Config{Algorithm: TokenBucket, Limit: 10, Period: sec, Burst: 3}
	run(t, c, []step{
		idle(0, true),
		acquire(0, 1, Result{Allowed: true, Granted: 1, Remaining: 2, ResetAfter: 100 * ms}),
		acquire(0, 2, Result{Allowed: true, Granted: 2, Remaining: 0, ResetAfter: 300 * ms}),
		acquire(0, 1, Result{RetryAfter: 100 * ms, ResetAfter: 300 * ms}),
		acquire(0, 0, Result{RetryAfter: 100 * ms, ResetAfter: 300 * ms}), // peek: would 1 pass?
		idle(0, false),
		acquire(100*ms, 1, Result{Allowed: true, Granted: 1, ResetAfter: 300 * ms}),
		// The clock jumps back: 50ms counts as 100ms, no tokens are minted
		// or lost.
		acquire(50*ms, 1, Result{RetryAfter: 100 * ms, ResetAfter: 300 * ms}),
		acquire(150*ms, 0, Result{RetryAfter: 50 * ms, ResetAfter: 250 * ms}),
		// Partial takes floor(1.5).
		request(250*ms, Request{Permits: 2, Partial: true}, Result{Allowed: true, Granted: 1, ResetAfter: 250 * ms}),
		request(250*ms, Request{Permits: 2, Partial: true}, Result{RetryAfter: 50 * ms, ResetAfter: 250 * ms}),
		// Reservation: 0.5 tokens, borrow up to what refills in 100ms.
		request(250*ms, Request{Permits: 1, MaxWait: 100 * ms}, Result{Allowed: true, Granted: 1, ResetAfter: 350 * ms, WaitBefore: 50 * ms}),
		request(250*ms, Request{Permits: 1, MaxWait: 100 * ms}, Result{RetryAfter: 50 * ms, ResetAfter: 350 * ms}),
		request(250*ms, Request{MaxWait: 100 * ms}, Result{RetryAfter: 50 * ms, ResetAfter: 350 * ms}),
		request(300*ms, Request{Permits: 1, MaxWait: 100 * ms}, Result{Allowed: true, Granted: 1, ResetAfter: 400 * ms, WaitBefore: 100 * ms}),
		// Back to the queue: a request with a longer wait waits behind.
		request(300*ms, Request{Permits: 2, MaxWait: 300 * ms}, Result{Allowed: true, Granted: 2, ResetAfter: 600 * ms, WaitBefore: 300 * ms}),
		// Above capacity: can never pass, no retry_after.
		acquire(300*ms, 4, Result{ResetAfter: 600 * ms}),
		acquire(sec, 3, Result{Allowed: true, Granted: 3, ResetAfter: 300 * ms}),
		// Refill: at most what the grant took, never above capacity.
		refill(sec, Grant{IssuedAt: sec, Permits: 2}, 5, 2),
		refill(sec, Grant{IssuedAt: sec, Permits: 3}, 3, 1),
		refill(sec, Grant{IssuedAt: sec, Permits: 3}, 3, 0),
		acquire(sec, 2, Result{Allowed: true, Granted: 2, Remaining: 1, ResetAfter: 200 * ms}),
		// Not once the grant is a Period old.
		refill(2*sec, Grant{IssuedAt: sec, Permits: 2}, 2, 0),
		acquire(2*sec, 3, Result{Allowed: true, Granted: 3, ResetAfter: 300 * ms}),
		refill(2*sec+999*ms, Grant{IssuedAt: 2 * sec, Permits: 3}, 3, 0), // full again by itself
		acquire(3*sec, 0, Result{Allowed: true, Remaining: 3}),
		// Partial above capacity takes what is there.
		request(3*sec, Request{Permits: 9, Partial: true}, Result{Allowed: true, Granted: 3, ResetAfter: 300 * ms}),
		refill(3*sec+50*ms, Grant{IssuedAt: 3 * sec, Permits: 3}, 1, 1),
		acquire(3*sec+50*ms, 0, Result{Allowed: true, Remaining: 1, ResetAfter: 150 * ms}),
		idle(3*sec+200*ms, true),
	})
}

func TestTokenBucketReconfigure(t *testing.T) {
	c := &Config{Algorithm: TokenBucket, Limit: 10, Period: sec, Burst: 10}
	small := &Config{Algorithm: TokenBucket, Limit: 1, Period: sec, Burst: 4}
	run(t, c, []step{
		acquire(0, 2, Result{Allowed: true, Granted: 2, Remaining: 8, ResetAfter: 200 * ms}),
		// Tokens are kept, clamped to the new capacity, and refill at the
		// new rate.
		reconfigure(0, small),
		acquire(0, 4, Result{Allowed: true, Granted: 4, ResetAfter: 4 * sec}),
		acquire(sec, 1, Result{Allowed: true, Granted: 1, ResetAfter: 4 * sec}),
		reconfigure(sec, c),
		acquire(sec, 0, Result{RetryAfter: 100 * ms, ResetAfter: sec}),
	})
}

// TestTokenBucketNoBurstAfterReservation checks that reserved tokens are
// paid back before anything else passes.
func TestTokenBucketReservationQueue(t *testing.T) {
	c := &Config{Algorithm: TokenBucket, Limit: 1, Period: sec}
	b := New(c, 0)
	for i := range int64(10) {
		res := b.Acquire(c, 0, Request{Permits: 1, MaxWait: sec})
		wantOK := i < 2 // the token there, then one that refills within 1s
		if res.Allowed != wantOK {
			t.Fatalf("request %d: allowed %v, want %v (%+v)", i, res.Allowed, wantOK, res)
		}
		if wantOK && res.WaitBefore != i*sec {
			t.Fatalf("request %d: wait %v, want %v", i, res.WaitBefore, i*sec)
		}
	}
}

// TestTokenBucketWarmup shows the ramp: a cold key is admitted at about a
// third of the rate, sustained load warms it to the full rate after about
// Warmup, and after Warmup of idleness it is cold again.
func TestTokenBucketWarmup(t *testing.T) {
	c := &Config{Algorithm: TokenBucket, Limit: 10, Period: sec, Warmup: 10 * sec}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	b := New(c, 0)
	// perSecond polls every millisecond from start for secs seconds and
	// counts admissions per second.
	perSecond := func(start int64, secs int) []int {
		counts := make([]int, secs)
		for now := start; now < start+int64(secs)*sec; now += ms {
			res := b.Acquire(c, now, Request{Permits: 1, MaxWait: sec}) // MaxWait is ignored
			if res.WaitBefore != 0 {
				t.Fatalf("warm-up reserved: %+v", res)
			}
			if res.Allowed {
				counts[(now-start)/sec]++
			} else if res.RetryAfter <= 0 {
				t.Fatalf("denied without retry_after: %+v", res)
			}
		}
		return counts
	}
	counts := perSecond(0, 20)
	t.Logf("admitted per second, cold start: %v", counts)
	if n := counts[0]; n < 3 || n > 4 { // Limit/3, plus the first one
		t.Errorf("first second admitted %d, want about %d", n, c.Limit/ColdFactor)
	}
	// Ramping up: the stored permits above the threshold (50) are spent in
	// about Warmup, at an average of half the full rate (the trapezoid).
	var first, second, ramp int
	for i := range 10 {
		ramp += counts[i]
		if i < 5 {
			first += counts[i]
		} else {
			second += counts[i]
		}
	}
	if ramp < 45 || ramp > 55 {
		t.Errorf("admitted %d during the warm-up period, want about %d", ramp, 50)
	}
	if first >= second {
		t.Errorf("admitted %d in the first 5s and %d in the next 5s: not ramping up", first, second)
	}
	for i := 12; i < 20; i++ { // warm: the full rate
		if n := counts[i]; n < 9 || n > 10 {
			t.Errorf("second %d admitted %d, want about %d", i, n, c.Limit)
		}
	}
	if b.Idle(c, 20*sec) {
		t.Error("warm bucket reports idle")
	}
	// Idle for a while: cools down, and is back at its initial state.
	res := b.Acquire(c, 20*sec, Request{})
	if !b.Idle(c, 20*sec+res.ResetAfter) || b.Idle(c, 20*sec+res.ResetAfter-1) {
		t.Errorf("reset_after %v does not match Idle", res.ResetAfter)
	}
	if res.ResetAfter > 11*sec { // Warmup plus at most one interval
		t.Errorf("reset_after %v, want about the warm-up period", res.ResetAfter)
	}
	start := 20*sec + res.ResetAfter
	counts = perSecond(start, 2)
	t.Logf("admitted per second after cooling down: %v", counts)
	if n := counts[0]; n < 3 || n > 4 {
		t.Errorf("first second after idle admitted %d, want about %d", n, c.Limit/ColdFactor)
	}
}

// TestTokenBucketWarmupSteps pins the warm-up arithmetic (Guava
// SmoothWarmingUp with stable interval 100ms, cold 300ms, threshold 50,
// maxPermits 100).
func TestTokenBucketWarmupSteps(t *testing.T) {
	c := &Config{Algorithm: TokenBucket, Limit: 10, Period: sec, Warmup: 10 * sec}
	w := warmupOf(c)
	if w.stable != float64(100*ms) || w.cold != float64(300*ms) || w.threshold != 50 || w.maxPermits != 100 {
		t.Fatalf("warmup = %+v", w)
	}
	// Taking the first stored permit costs the trapezoid between 300ms
	// and 296ms; the next request waits for it.
	first := int64((300*ms + 296*ms) / 2)
	run(t, c, []step{
		acquire(0, 1, Result{Allowed: true, Granted: 1, ResetAfter: first + 100*ms}),
		acquire(0, 1, Result{RetryAfter: first, ResetAfter: first + 100*ms}),
		acquire(0, 0, Result{RetryAfter: first, ResetAfter: first + 100*ms}),
		request(0, Request{Permits: 1, MaxWait: sec}, Result{RetryAfter: first, ResetAfter: first + 100*ms}),
		acquire(0, 11, Result{ResetAfter: first + 100*ms}), // above capacity
		refill(0, Grant{IssuedAt: 0, Permits: 1}, 1, 1),    // gives back one stable interval
		// One stored permit short of cold: one cool-down interval (100ms).
		acquire(first-100*ms, 0, Result{Allowed: true, Remaining: 10, ResetAfter: 100 * ms}),
		idle(first-1, false),
		idle(first, true),
	})
}
