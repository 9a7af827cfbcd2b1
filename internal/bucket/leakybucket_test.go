package bucket

import "testing"

func TestLeakyBucket(t *testing.T) {
	// One permit per 100ms; a request takes at most 10.
	c := &Config{Algorithm: LeakyBucket, Limit: 10, Period: sec}
	run(t, c, []step{
		idle(0, true),
		acquire(0, 1, Result{Allowed: true, Granted: 1, ResetAfter: 100 * ms}),
		acquire(0, 1, Result{RetryAfter: 100 * ms, ResetAfter: 100 * ms}),
		idle(0, false),
		// Shaping: each reservation takes the next free slot, exactly one
		// interval after the previous one.
		request(0, Request{Permits: 1, MaxWait: 300 * ms}, Result{Allowed: true, Granted: 1, ResetAfter: 200 * ms, WaitBefore: 100 * ms}),
		request(0, Request{Permits: 1, MaxWait: 300 * ms}, Result{Allowed: true, Granted: 1, ResetAfter: 300 * ms, WaitBefore: 200 * ms}),
		request(0, Request{Permits: 1, MaxWait: 300 * ms}, Result{Allowed: true, Granted: 1, ResetAfter: 400 * ms, WaitBefore: 300 * ms}),
		request(0, Request{Permits: 1, MaxWait: 300 * ms}, Result{RetryAfter: 100 * ms, ResetAfter: 400 * ms}),
		request(0, Request{MaxWait: 300 * ms}, Result{RetryAfter: 100 * ms, ResetAfter: 400 * ms}), // peek
		request(0, Request{MaxWait: 400 * ms}, Result{Allowed: true, ResetAfter: 400 * ms}),
		// Refill gives back future slots only, never before now.
		refill(50*ms, Grant{IssuedAt: 0, Permits: 1}, 5, 1),
		// The clock jumps back: 20ms counts as 50ms.
		request(20*ms, Request{Permits: 1, MaxWait: 300 * ms}, Result{Allowed: true, Granted: 1, ResetAfter: 350 * ms, WaitBefore: 250 * ms}),
		acquire(400*ms, 3, Result{Allowed: true, Granted: 3, ResetAfter: 300 * ms}),
		refill(450*ms, Grant{IssuedAt: 400 * ms, Permits: 3}, 5, 2), // 250ms left: two whole slots
		acquire(450*ms, 0, Result{RetryAfter: 50 * ms, ResetAfter: 50 * ms}),
		acquire(500*ms, 1, Result{Allowed: true, Granted: 1, ResetAfter: 100 * ms}),
		refill(600*ms, Grant{IssuedAt: 500 * ms, Permits: 1}, 1, 0), // its slot has passed
		// No accumulation while idle: after a long pause, still one at a
		// time (no burst of queued-up permits).
		acquire(10*sec, 1, Result{Allowed: true, Granted: 1, ResetAfter: 100 * ms}),
		acquire(10*sec, 1, Result{RetryAfter: 100 * ms, ResetAfter: 100 * ms}),
		// Above capacity: never; with partial: cut to capacity.
		acquire(11*sec, 11, Result{Remaining: 10}),
		request(11*sec, Request{Permits: 11, Partial: true}, Result{Allowed: true, Granted: 10, ResetAfter: sec}),
		// A wait longer than MaxWait is denied, retry when it fits.
		request(11*sec, Request{Permits: 1, MaxWait: 400 * ms}, Result{RetryAfter: 600 * ms, ResetAfter: sec}),
		idle(12*sec-1, false),
		idle(12*sec, true),
	})
}

// TestLeakyBucketSpacing checks that shaped requests leave exactly one
// interval apart, even for a rate that does not divide the period evenly.
func TestLeakyBucketSpacing(t *testing.T) {
	c := &Config{Algorithm: LeakyBucket, Limit: 7, Period: sec}
	interval := c.Period / c.Limit // 142857142ns
	b := New(c, 0)
	now := int64(0)
	for i := range int64(11) { // the 12th would wait more than MaxWait
		res := b.Acquire(c, now, Request{Permits: 1, MaxWait: c.Period})
		if !res.Allowed {
			t.Fatalf("request %d denied: %+v", i, res)
		}
		if at := now + res.WaitBefore; at != i*interval {
			t.Fatalf("request %d leaves at %d, want %d", i, at, i*interval)
		}
		now += interval / 3 // requests arrive three times faster than they leave
	}
	if res := b.Acquire(c, now, Request{Permits: 1, MaxWait: c.Period}); res.Allowed || now+res.RetryAfter+c.Period != 11*interval {
		t.Fatalf("12th request: %+v, want a retry when its slot (%d) is MaxWait away", res, 11*interval)
	}
	// Without MaxWait, back-to-back requests are admitted exactly one
	// interval apart.
	b = New(c, 0)
	var admitted []int64
	for now := int64(0); now < 2*sec; now += ms / 7 {
		if b.Acquire(c, now, Request{Permits: 1}).Allowed {
			admitted = append(admitted, now)
		}
	}
	for i := 1; i < len(admitted); i++ {
		if d := admitted[i] - admitted[i-1]; d < interval || d > interval+ms/7 {
			t.Fatalf("admissions %d and %d are %dns apart, want %d", i-1, i, d, interval)
		}
	}
}

func TestLeakyBucketReconfigure(t *testing.T) {
	c := &Config{Algorithm: LeakyBucket, Limit: 10, Period: sec}
	fast := &Config{Algorithm: LeakyBucket, Limit: 100, Period: sec, Burst: 2}
	run(t, c, []step{
		request(0, Request{Permits: 10, MaxWait: sec}, Result{Allowed: true, Granted: 10, ResetAfter: sec}),
		request(0, Request{Permits: 5, MaxWait: sec}, Result{Allowed: true, Granted: 5, ResetAfter: 1500 * ms, WaitBefore: sec}),
		// The queue is cut to one full request of the new rule: 2 * 10ms.
		reconfigure(0, fast),
		acquire(0, 0, Result{RetryAfter: 20 * ms, ResetAfter: 20 * ms}),
	})
}
