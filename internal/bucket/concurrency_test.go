package bucket

import "testing"

func TestConcurrency(t *testing.T) {
	c := &Config{Algorithm: Concurrency, Limit: 2, Period: sec}
	lease := func(id uint64, permits int64) Request { return Request{Permits: permits, LeaseID: id} }
	run(t, c, []step{
		idle(0, true),
		request(0, lease(1, 1), Result{Allowed: true, Granted: 1, Remaining: 1, ResetAfter: sec}),
		request(100*ms, lease(2, 1), Result{Allowed: true, Granted: 1, ResetAfter: sec}),
		request(200*ms, lease(3, 1), Result{RetryAfter: 800 * ms, ResetAfter: 900 * ms}),
		renew(500*ms, Grant{LeaseID: 1}, true), // lease 1 now expires at 1.5s, after lease 2
		request(600*ms, lease(3, 1), Result{RetryAfter: 500 * ms, ResetAfter: 900 * ms}),
		request(600*ms, lease(3, 2), Result{RetryAfter: 900 * ms, ResetAfter: 900 * ms}),
		request(600*ms, lease(3, 3), Result{ResetAfter: 900 * ms}), // above the limit: never
		// Release ends the lease and returns its permits, once.
		refill(700*ms, Grant{LeaseID: 2, Permits: 1}, 1, 1),
		refill(700*ms, Grant{LeaseID: 2, Permits: 1}, 1, 0),
		request(700*ms, lease(4, 1), Result{Allowed: true, Granted: 1, ResetAfter: sec}),
		// The clock jumps back: 650ms counts as 700ms.
		request(650*ms, Request{}, Result{RetryAfter: 800 * ms, ResetAfter: sec}),
		// An expired lease can be neither renewed nor released.
		renew(1600*ms, Grant{LeaseID: 1}, false),
		refill(1600*ms, Grant{LeaseID: 1, Permits: 1}, 1, 0),
		request(1600*ms, lease(5, 1), Result{Allowed: true, Granted: 1, ResetAfter: sec}),
		idle(2600*ms-1, false),
		idle(2600*ms, true),
		// A partial release keeps the rest of the lease.
		request(3*sec, lease(6, 2), Result{Allowed: true, Granted: 2, ResetAfter: sec}),
		refill(3*sec, Grant{LeaseID: 6, Permits: 2}, 1, 1),
		request(3*sec, Request{}, Result{Allowed: true, Remaining: 1, ResetAfter: sec}),
		refill(3*sec, Grant{LeaseID: 6, Permits: 2}, 5, 1),
		idle(3*sec, true),
		request(3*sec, Request{Permits: 5, Partial: true, LeaseID: 7}, Result{Allowed: true, Granted: 2, ResetAfter: sec}),
	})
}

// TestConcurrencyLeaseExpiry checks that a lease lives Period unless
// renewed, and as long as it keeps being renewed.
func TestConcurrencyLeaseExpiry(t *testing.T) {
	c := &Config{Algorithm: Concurrency, Limit: 1, Period: sec}
	b := New(c, 0)
	if !b.Acquire(c, 0, Request{Permits: 1, LeaseID: 1}).Allowed {
		t.Fatal("first lease denied")
	}
	now := int64(0)
	for range 10 {
		now += 900 * ms
		if !b.Renew(c, now, Grant{LeaseID: 1}) {
			t.Fatalf("renewal at %d failed", now)
		}
		if res := b.Acquire(c, now, Request{Permits: 1, LeaseID: 2}); res.Allowed || res.RetryAfter != sec {
			t.Fatalf("at %d: %+v, want denied until the lease expires", now, res)
		}
	}
	// Not renewed any more: it expires one Period after the last renewal.
	if res := b.Acquire(c, now+sec-1, Request{Permits: 1, LeaseID: 2}); res.Allowed {
		t.Fatalf("admitted before the lease expired: %+v", res)
	}
	if b.Renew(c, now+sec, Grant{LeaseID: 1}) {
		t.Fatal("renewed an expired lease")
	}
	if res := b.Acquire(c, now+sec, Request{Permits: 1, LeaseID: 2}); !res.Allowed {
		t.Fatalf("denied after the lease expired: %+v", res)
	}
}

func TestConcurrencyReconfigure(t *testing.T) {
	c := &Config{Algorithm: Concurrency, Limit: 3, Period: 10 * sec}
	run(t, c, []step{
		request(0, Request{Permits: 2, LeaseID: 1}, Result{Allowed: true, Granted: 2, Remaining: 1, ResetAfter: 10 * sec}),
		// Leases are kept; none outlives the new period.
		reconfigure(sec, &Config{Algorithm: Concurrency, Limit: 2, Period: sec}),
		request(sec, Request{Permits: 1, LeaseID: 2}, Result{RetryAfter: sec, ResetAfter: sec}),
		request(2*sec, Request{Permits: 1, LeaseID: 2}, Result{Allowed: true, Granted: 1, Remaining: 1, ResetAfter: sec}),
	})
}
