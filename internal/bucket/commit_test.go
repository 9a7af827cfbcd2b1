package bucket

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestCommitTokenBucket(t *testing.T) {
	c := &Config{Algorithm: TokenBucket, Limit: 10, Period: sec} // one token per 100ms
	run(t, c, []step{
		acquire(0, 4, Result{Allowed: true, Granted: 4, Remaining: 6, ResetAfter: 400 * ms}),
		// Used less: the difference goes back.
		commitStep(0, Grant{IssuedAt: 0, Permits: 4}, 2, CommitResult{Returned: 2, Remaining: 8}),
		acquire(0, 8, Result{Allowed: true, Granted: 8, Remaining: 0, ResetAfter: sec}),
		// Used more: the extra is charged past zero, 5 tokens owed.
		commitStep(0, Grant{IssuedAt: 0, Permits: 8}, 13, CommitResult{Debited: 5, Debt: 5, RetryAfter: 600 * ms}),
		acquire(300*ms, 1, Result{RetryAfter: 300 * ms, ResetAfter: 1200 * ms}),
		// A shaping request queues behind the debt: it waits until it is repaid.
		request(300*ms, Request{Permits: 1, MaxWait: 500 * ms}, Result{Allowed: true, Granted: 1, WaitBefore: 300 * ms, ResetAfter: 1300 * ms}),
		idle(600*ms, false),
		acquire(600*ms, 1, Result{RetryAfter: 100 * ms, ResetAfter: sec}),
		// A debit without reservation (hits_addend) owes in the same way.
		debitStep(600*ms, 2, CommitResult{Debited: 2, Debt: 2, RetryAfter: 300 * ms}),
		acquire(900*ms-1, 1, Result{RetryAfter: 1, ResetAfter: 900*ms + 1}),
		acquire(900*ms, 1, Result{Allowed: true, Granted: 1, ResetAfter: sec}),
		// Used exactly: nothing moves.
		commitStep(900*ms, Grant{IssuedAt: 900 * ms, Permits: 1}, 1, CommitResult{RetryAfter: 100 * ms}),
		// A grant older than a Period gives nothing back (as Refill).
		commitStep(2*sec, Grant{IssuedAt: 900 * ms, Permits: 1}, 0, CommitResult{Remaining: 10}),
		idle(2*sec, true),
	})
}

func TestCommitTokenBucketWarmup(t *testing.T) {
	// Stable interval 100ms, cold 300ms; threshold 5 and maxPermits 10
	// stored permits, slope 40ms a permit, cool-down 100ms a permit.
	c := &Config{Algorithm: TokenBucket, Limit: 10, Period: sec, Warmup: sec}
	run(t, c, []step{
		// A cold permit costs (200ms + 9*40ms)/2 = 280ms, then 100ms to cool.
		acquire(0, 1, Result{Allowed: true, Granted: 1, ResetAfter: 380 * ms}),
		// An overrun of 2 pushes the next ticket as an acquire of 2 would:
		// by 2*(200ms + 6*40ms)/2 = 440ms, to 720ms (7.2 stable intervals).
		commitStep(0, Grant{IssuedAt: 0, Permits: 1}, 3, CommitResult{Debited: 2, Debt: 8, RetryAfter: 720 * ms}),
		acquire(719*ms, 1, Result{RetryAfter: ms, ResetAfter: 301 * ms}),
		idle(720*ms, false),
		// 7 stored: (200ms + 3*40ms)/2 = 160ms, then 4 permits to cool.
		acquire(720*ms, 1, Result{Allowed: true, Granted: 1, ResetAfter: 560 * ms}),
	})
}

func TestCommitLeakyBucket(t *testing.T) {
	c := &Config{Algorithm: LeakyBucket, Limit: 10, Period: sec, Burst: 5} // a slot every 100ms
	run(t, c, []step{
		acquire(0, 2, Result{Allowed: true, Granted: 2, ResetAfter: 200 * ms}),
		// The overrun's slots are queued: the queue is pushed out to 500ms.
		commitStep(0, Grant{IssuedAt: 0, Permits: 2}, 5, CommitResult{Debited: 3, Debt: 5, RetryAfter: 500 * ms}),
		acquire(250*ms, 1, Result{RetryAfter: 250 * ms, ResetAfter: 250 * ms}),
		request(250*ms, Request{Permits: 1, MaxWait: 300 * ms}, Result{Allowed: true, Granted: 1, WaitBefore: 250 * ms, ResetAfter: 350 * ms}),
		// Giving back the shaped grant frees its slot.
		commitStep(300*ms, Grant{IssuedAt: 250 * ms, Permits: 1}, 0, CommitResult{Returned: 1, Debt: 2, RetryAfter: 200 * ms}),
		debitStep(300*ms, 1, CommitResult{Debited: 1, Debt: 3, RetryAfter: 300 * ms}),
		idle(599*ms, false),
		idle(600*ms, true),
		acquire(600*ms, 5, Result{Allowed: true, Granted: 5, ResetAfter: 500 * ms}),
	})
}

func TestCommitFixedWindow(t *testing.T) {
	c := &Config{Algorithm: FixedWindow, Limit: 5, Period: sec}
	run(t, c, []step{
		acquire(100*ms, 3, Result{Allowed: true, Granted: 3, Remaining: 2, ResetAfter: 900 * ms}),
		// 9 in a window of 5: 4 owed, carried into the next window.
		commitStep(200*ms, Grant{IssuedAt: 100 * ms, Permits: 3}, 9, CommitResult{Debited: 6, Debt: 4, RetryAfter: 800 * ms}),
		acquire(200*ms, 1, Result{RetryAfter: 800 * ms, ResetAfter: 1800 * ms}),
		idle(sec, false),
		// Window 1 starts with the 4 carried: 1 left.
		acquire(sec, 2, Result{Remaining: 1, RetryAfter: sec, ResetAfter: sec}),
		acquire(sec, 1, Result{Allowed: true, Granted: 1, ResetAfter: sec}),
		// 17 held: 12 owed, repaid 5 a window; one permit passes in window 4.
		debitStep(1500*ms, 12, CommitResult{Debited: 12, Debt: 12, RetryAfter: 2500 * ms}),
		acquire(4*sec-1, 1, Result{RetryAfter: 1, ResetAfter: 1 + sec}),
		acquire(4*sec, 1, Result{Allowed: true, Granted: 1, Remaining: 2, ResetAfter: sec}),
		// Used less, in the grant's window: it goes back.
		commitStep(4500*ms, Grant{IssuedAt: 4 * sec, Permits: 1}, 0, CommitResult{Returned: 1, Remaining: 3}),
		idle(5*sec, true),
	})
}

func TestCommitFixedWindowReconfigure(t *testing.T) {
	c := &Config{Algorithm: FixedWindow, Limit: 5, Period: sec}
	run(t, c, []step{
		debitStep(0, 8, CommitResult{Debited: 8, Debt: 3, RetryAfter: sec}),
		// A smaller limit keeps the debt: 8 held at limit 4, 4 owed; one
		// permit passes after two windows.
		reconfigure(100*ms, &Config{Algorithm: FixedWindow, Limit: 4, Period: sec}),
		acquire(100*ms, 1, Result{RetryAfter: 1900 * ms, ResetAfter: 1900 * ms}),
		// A larger limit makes room for it.
		reconfigure(200*ms, &Config{Algorithm: FixedWindow, Limit: 10, Period: sec}),
		acquire(200*ms, 2, Result{Allowed: true, Granted: 2, ResetAfter: 800 * ms}),
		acquire(sec, 1, Result{Allowed: true, Granted: 1, Remaining: 9, ResetAfter: sec}),
	})
}

func TestCommitSlidingWindow(t *testing.T) {
	c := &Config{Algorithm: SlidingWindow, Limit: 4, Period: sec, SampleCount: 2} // sub-windows of 500ms
	run(t, c, []step{
		acquire(0, 2, Result{Allowed: true, Granted: 2, Remaining: 2, ResetAfter: sec}),
		acquire(600*ms, 1, Result{Allowed: true, Granted: 1, Remaining: 1, ResetAfter: 900 * ms}),
		// 5 more: 1 fits in the window, 4 are owed. The sub-windows that
		// leave at 1s and 1.5s are charged again (2 + 2), so the window
		// stays full until 2s.
		commitStep(600*ms, Grant{IssuedAt: 0, Permits: 2}, 7, CommitResult{Debited: 5, Debt: 4, RetryAfter: 1400 * ms}),
		idle(2499*ms, false),
		acquire(1999*ms, 1, Result{RetryAfter: ms, ResetAfter: 501 * ms}),
		acquire(2*sec, 1, Result{Allowed: true, Granted: 1, Remaining: 1, ResetAfter: sec}),
		// 1 fits, 2 owed: sub-window 3 leaves at 2.5s and repays them, and
		// sub-window 4 leaving at 3s makes room.
		debitStep(2*sec, 3, CommitResult{Debited: 3, Debt: 2, RetryAfter: sec}),
		// A grant given back while owing repays the debt first.
		commitStep(2*sec, Grant{IssuedAt: 2 * sec, Permits: 1}, 0, CommitResult{Returned: 1, Debt: 1, RetryAfter: 500 * ms}),
		idle(3499*ms, false),
		idle(3500*ms, true),
	})
}

func TestCommitRefused(t *testing.T) {
	for _, c := range []Config{
		{Algorithm: SlidingLog, Limit: 5, Period: sec},
		{Algorithm: Concurrency, Limit: 5, Period: sec},
	} {
		b := New(&c, 0)
		b.Acquire(&c, 0, Request{Permits: 2, LeaseID: 1})
		before := clone(b)
		if _, err := b.Commit(&c, 0, Grant{Permits: 2, LeaseID: 1}, 3); !errors.Is(err, ErrNoCommit) {
			t.Errorf("%s: Commit: %v, want ErrNoCommit", c.Algorithm, err)
		}
		if _, err := b.Debit(&c, 0, 1); !errors.Is(err, ErrNoCommit) {
			t.Errorf("%s: Debit: %v, want ErrNoCommit", c.Algorithm, err)
		}
		if got, want := b.Acquire(&c, 0, Request{}), before.Acquire(&c, 0, Request{}); got != want {
			t.Errorf("%s: a refused commit changed the state: %+v, was %+v", c.Algorithm, got, want)
		}
		if OffersCommit(c.Algorithm) {
			t.Errorf("OffersCommit(%s) = true", c.Algorithm)
		}
	}
	for _, c := range commitConfigs() {
		b := New(&c, 0)
		if _, err := b.Commit(&c, 0, Grant{Permits: 1}, -1); !errors.Is(err, ErrNegativeUsage) {
			t.Errorf("%s: Commit(-1): %v, want ErrNegativeUsage", c.Algorithm, err)
		}
		if _, err := b.Debit(&c, 0, -1); !errors.Is(err, ErrNegativeUsage) {
			t.Errorf("%s: Debit(-1): %v, want ErrNegativeUsage", c.Algorithm, err)
		}
		if !b.Idle(&c, 0) {
			t.Errorf("%s: a refused negative commit changed the state", c.Algorithm)
		}
	}
}

// commitConfigs are one configuration per algorithm that takes commits.
func commitConfigs() []Config {
	return []Config{
		{Algorithm: TokenBucket, Limit: 10, Period: sec, Burst: 6},
		{Algorithm: TokenBucket, Limit: 10, Period: sec, Warmup: 2 * sec},
		{Algorithm: LeakyBucket, Limit: 10, Period: sec, Burst: 4},
		{Algorithm: FixedWindow, Limit: 10, Period: sec},
		{Algorithm: FixedWindow, Limit: 10, Calendar: CalendarDay},
		{Algorithm: SlidingWindow, Limit: 10, Period: sec, SampleCount: 4},
	}
}

// TestUncommittedReservation: a reservation never committed stays charged
// at its estimate, exactly as one committed at its estimate.
func TestUncommittedReservation(t *testing.T) {
	for _, c := range commitConfigs() {
		a, b := New(&c, 0), New(&c, 0)
		ga := a.Acquire(&c, 0, Request{Permits: 3})
		gb := b.Acquire(&c, 0, Request{Permits: 3})
		if res, err := b.Commit(&c, 10*ms, Grant{IssuedAt: 0, Permits: gb.Granted}, gb.Granted); err != nil || res.Returned != 0 || res.Debited != 0 {
			t.Fatalf("%s: commit at the estimate: %+v, %v", c.Algorithm, res, err)
		}
		for _, at := range []int64{10 * ms, 300 * ms, sec, 3 * sec} {
			for _, r := range []Request{{}, {Permits: 1}, {Permits: c.Capacity()}} {
				if x, y := clone(a).Acquire(&c, at, r), clone(b).Acquire(&c, at, r); x != y {
					t.Errorf("%s: at %v %+v: uncommitted %+v, committed %+v (grant %+v)", c.Algorithm, time.Duration(at), r, x, y, ga)
				}
			}
		}
	}
}

// TestDebtIsNotIdle: eviction must not forgive debt. A bucket in debt is
// not idle when a bucket that only ran out would be, and it is idle again
// once the debt is repaid.
func TestDebtIsNotIdle(t *testing.T) {
	for _, c := range commitConfigs() {
		b := New(&c, 0)
		res, err := b.Debit(&c, 0, 3*c.Limit)
		if err != nil || res.RetryAfter <= 0 {
			t.Fatalf("%s: debit: %+v, %v", c.Algorithm, res, err)
		}
		span := c.Span()
		if b.Idle(&c, span) {
			t.Errorf("%s: idle one window after a debit of three windows' worth", c.Algorithm)
		}
		if got, fresh := clone(b).Acquire(&c, span, Request{Permits: 1}), New(&c, span).Acquire(&c, span, Request{Permits: 1}); got == fresh {
			t.Errorf("%s: answers %+v in debt, as a new bucket would", c.Algorithm, got)
		}
		if !b.Idle(&c, 10*span+4*c.Warmup) {
			t.Errorf("%s: still not idle long after the debt was repaid", c.Algorithm)
		}
	}
}

// boundCase is an algorithm with its bound without debt over a window: how
// many permits any window [s, e] may be charged, and whether s and e are
// in one window (fixed windows are judged per window).
type boundCase struct {
	c     Config
	bound func(c *Config, s, e int64) float64
	same  func(c *Config, s, e int64) bool
}

var boundCases = []boundCase{
	{Config{Algorithm: TokenBucket, Limit: 10, Period: sec, Burst: 5},
		func(c *Config, s, e int64) float64 { return float64(c.Capacity()) + refillIn(c, e-s) + 1e-9 },
		func(*Config, int64, int64) bool { return true }},
	{Config{Algorithm: LeakyBucket, Limit: 10, Period: sec, Burst: 4},
		func(c *Config, s, e int64) float64 { return float64(c.Capacity()) + float64((e-s)/(c.Period/c.Limit)) },
		func(*Config, int64, int64) bool { return true }},
	{Config{Algorithm: FixedWindow, Limit: 10, Period: sec},
		func(c *Config, _, _ int64) float64 { return float64(c.Limit) },
		func(c *Config, s, e int64) bool { return floorDiv(s, c.Period) == floorDiv(e, c.Period) }},
	{Config{Algorithm: FixedWindow, Limit: 10, Calendar: CalendarDay, Location: mustZone("Europe/Berlin")},
		func(c *Config, _, _ int64) float64 { return float64(c.Limit) },
		func(c *Config, s, e int64) bool { return calIndex(c, s) == calIndex(c, e) }},
	{Config{Algorithm: SlidingWindow, Limit: 10, Period: sec, SampleCount: 4},
		func(c *Config, _, _ int64) float64 { return float64(c.Limit) },
		func(c *Config, s, e int64) bool { return e-s < (c.Samples()-1)*(c.Period/c.Samples()) }},
}

// charge is what one call charged, at its time.
type charge struct{ at, n int64 }

// TestCommitBound is the over-admission property: over any window, the
// permits charged (grants, plus overruns, minus what went back) stay
// within the bound without debt plus the debt outstanding, which is one
// largest overrun with one reservation in flight per key, and the sum of
// the k largest with k in flight together. Debits are made only while the
// key owes nothing, so that each debt starts from one overrun.
func TestCommitBound(t *testing.T) {
	for _, bc := range boundCases {
		for _, inflight := range []int{1, 3} {
			for seed := range uint64(30) {
				c := bc.c
				start := wall(mustZone("Europe/Berlin"), 2024, 3, 29, 0, 0)
				charges, overruns := playCommits(t, &c, start, inflight, rand.New(rand.NewPCG(seed, 11)))
				slices.Sort(overruns)
				slices.Reverse(overruns)
				var extra int64
				for _, o := range overruns[:min(inflight, len(overruns))] {
					extra += o
				}
				for i := range charges {
					var sum int64
					for j := i; j < len(charges) && bc.same(&c, charges[i].at, charges[j].at); j++ {
						sum += charges[j].n
						if limit := bc.bound(&c, charges[i].at, charges[j].at) + float64(extra); float64(sum) > limit {
							t.Fatalf("%s/%s in flight %d seed %d: %d charged in [%d, %d], above %.3f (overruns %v)",
								c.Algorithm, c.Calendar, inflight, seed, sum, charges[i].at-start, charges[j].at-start, limit, overruns[:min(inflight, len(overruns))])
						}
					}
				}
			}
		}
	}
}

// playCommits reserves, commits (used up to twice the estimate) and, with
// one reservation in flight, debits, on a fake clock, and returns what was
// charged when, and every overrun.
func playCommits(t *testing.T, c *Config, now int64, inflight int, rng *rand.Rand) (charges []charge, overruns []int64) {
	t.Helper()
	span := c.Span()
	if c.Calendar != CalendarNone {
		span = int64(time.Hour)
	}
	b := New(c, now)
	var held []Grant
	for range 600 {
		now += rng.Int64N(span / 4)
		switch op := rng.IntN(10); {
		case op < 5 && len(held) < inflight:
			res := b.Acquire(c, now, Request{Permits: 1 + rng.Int64N(c.Capacity())})
			if res.Granted > 0 {
				held = append(held, Grant{IssuedAt: now, Permits: res.Granted})
				charges = append(charges, charge{now, res.Granted})
			}
		case op < 9 && len(held) > 0:
			i := rng.IntN(len(held))
			g := held[i]
			held = slices.Delete(held, i, i+1)
			res, err := b.Commit(c, now, g, rng.Int64N(2*g.Permits+1))
			if err != nil {
				t.Fatal(err)
			}
			charges = append(charges, charge{now, res.Debited - res.Returned})
			if res.Debited > 0 {
				overruns = append(overruns, res.Debited)
			}
		case inflight == 1 && len(held) == 0 && clone(b).Acquire(c, now, Request{Permits: 1}).Allowed:
			n := 1 + rng.Int64N(c.Capacity())
			if _, err := b.Debit(c, now, n); err != nil {
				t.Fatal(err)
			}
			charges = append(charges, charge{now, n})
			overruns = append(overruns, n)
		}
	}
	return charges, overruns
}
