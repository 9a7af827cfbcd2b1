package bucket

import "testing"

func TestFixedWindow(t *testing.T) {
	c := &Config{Algorithm: FixedWindow, Limit: 3, Period: sec}
	run(t, c, []step{
		idle(0, true),
		acquire(0, 2, Result{Allowed: true, Granted: 2, Remaining: 1, ResetAfter: sec}),
		acquire(500*ms, 2, Result{Remaining: 1, RetryAfter: 500 * ms, ResetAfter: 500 * ms}),
		request(500*ms, Request{Permits: 2, Partial: true}, Result{Allowed: true, Granted: 1, ResetAfter: 500 * ms}),
		acquire(600*ms, 0, Result{RetryAfter: 400 * ms, ResetAfter: 400 * ms}), // peek
		request(600*ms, Request{Permits: 2, Partial: true}, Result{RetryAfter: 400 * ms, ResetAfter: 400 * ms}),
		// Refill: at most the grant, at most the count.
		refill(700*ms, Grant{IssuedAt: 0, Permits: 2}, 5, 2),
		// The clock jumps back: 100ms counts as 700ms.
		acquire(100*ms, 2, Result{Allowed: true, Granted: 2, ResetAfter: 300 * ms}),
		refill(700*ms, Grant{IssuedAt: 500 * ms, Permits: 1}, 1, 1),
		refill(700*ms, Grant{IssuedAt: 700 * ms, Permits: 2}, 9, 2),
		refill(700*ms, Grant{IssuedAt: 700 * ms, Permits: 2}, 9, 0), // count is 0: nothing to give back
		idle(700*ms, true),
		acquire(800*ms, 3, Result{Allowed: true, Granted: 3, ResetAfter: 200 * ms}),
		// Not once its window has passed.
		refill(sec, Grant{IssuedAt: 800 * ms, Permits: 3}, 3, 0),
		acquire(sec, 3, Result{Allowed: true, Granted: 3, ResetAfter: sec}),
		acquire(sec, 4, Result{ResetAfter: sec}),                                                            // above the limit: never
		request(sec+1, Request{Permits: 1, MaxWait: sec}, Result{RetryAfter: sec - 1, ResetAfter: sec - 1}), // MaxWait ignored
		idle(2*sec-1, false),
		idle(2*sec, true),
	})
}

// TestFixedWindowBoundaryBurst shows the fixed window's known weakness:
// Limit at the end of one window and Limit at the start of the next pass
// within 2ns, 2*Limit in far less than a Period.
func TestFixedWindowBoundaryBurst(t *testing.T) {
	c := &Config{Algorithm: FixedWindow, Limit: 10, Period: sec}
	b := New(c, 0)
	if res := b.Acquire(c, sec-1, Request{Permits: 10}); !res.Allowed {
		t.Fatalf("end of window 0: %+v", res)
	}
	if res := b.Acquire(c, sec, Request{Permits: 10}); !res.Allowed {
		t.Fatalf("start of window 1: %+v", res)
	}
	if res := b.Acquire(c, 2*sec-1, Request{Permits: 1}); res.Allowed {
		t.Fatalf("window 1 admitted more than its limit: %+v", res)
	}
}

func TestFixedWindowReconfigure(t *testing.T) {
	c := &Config{Algorithm: FixedWindow, Limit: 5, Period: sec}
	run(t, c, []step{
		acquire(100*ms, 4, Result{Allowed: true, Granted: 4, Remaining: 1, ResetAfter: 900 * ms}),
		// A lower limit keeps the count: nothing more until the window ends.
		reconfigure(200*ms, &Config{Algorithm: FixedWindow, Limit: 3, Period: sec}),
		acquire(200*ms, 1, Result{RetryAfter: 800 * ms, ResetAfter: 800 * ms}),
		// A new period moves the count to the current new window.
		reconfigure(300*ms, &Config{Algorithm: FixedWindow, Limit: 5, Period: 400 * ms}),
		acquire(300*ms, 2, Result{Remaining: 1, RetryAfter: 100 * ms, ResetAfter: 100 * ms}),
		acquire(400*ms, 2, Result{Allowed: true, Granted: 2, Remaining: 3, ResetAfter: 400 * ms}),
	})
}
