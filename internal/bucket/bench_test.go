package bucket

import "testing"

// benchConfigs are one realistic rule per algorithm: 1000 per second,
// decided every 500µs, so about half the requests are denied.
var benchConfigs = []struct {
	name string
	c    Config
}{
	{"token-bucket", Config{Algorithm: TokenBucket, Limit: 1000, Period: sec, Burst: 100}},
	{"token-bucket-warmup", Config{Algorithm: TokenBucket, Limit: 1000, Period: sec, Warmup: 10 * sec}},
	{"leaky-bucket", Config{Algorithm: LeakyBucket, Limit: 1000, Period: sec}},
	{"fixed-window", Config{Algorithm: FixedWindow, Limit: 1000, Period: sec}},
	{"sliding-window", Config{Algorithm: SlidingWindow, Limit: 1000, Period: sec}},
	{"sliding-log", Config{Algorithm: SlidingLog, Limit: 1000, Period: sec}},
	{"concurrency", Config{Algorithm: Concurrency, Limit: 100, Period: 100 * ms}},
}

// BenchmarkAcquire is one decision per algorithm.
func BenchmarkAcquire(b *testing.B) {
	for _, bc := range benchConfigs {
		b.Run(bc.name, func(b *testing.B) {
			c := &bc.c
			bk := New(c, 0)
			now := int64(0)
			var id uint64
			b.ReportAllocs()
			for b.Loop() {
				now += 500 * us
				id++
				bk.Acquire(c, now, Request{Permits: 1, LeaseID: id})
			}
		})
	}
}

// BenchmarkAcquireShaped is a leaky bucket and a token bucket reserving
// with MaxWait.
func BenchmarkAcquireShaped(b *testing.B) {
	for _, bc := range benchConfigs[:3] {
		b.Run(bc.name, func(b *testing.B) {
			c := &bc.c
			bk := New(c, 0)
			now := int64(0)
			b.ReportAllocs()
			for b.Loop() {
				now += 500 * us
				bk.Acquire(c, now, Request{Permits: 1, MaxWait: 100 * ms})
			}
		})
	}
}

// BenchmarkRefill is a grant given back in part, as RefillToken does it
// to a bucket: acquire 2, refill 1, then peek for what remains. A decision
// every 10ms keeps every acquire granted, so that Refill and Commit see the
// same work.
func BenchmarkRefill(b *testing.B) {
	for _, bc := range benchConfigs {
		if !OffersCommit(bc.c.Algorithm) {
			continue
		}
		b.Run(bc.name, func(b *testing.B) {
			c := &bc.c
			bk := New(c, 0)
			now := int64(0)
			b.ReportAllocs()
			for b.Loop() {
				now += 10 * ms
				res := bk.Acquire(c, now, Request{Permits: 2})
				if res.Granted != 2 {
					b.Fatalf("denied: %+v", res)
				}
				bk.Refill(c, now, Grant{IssuedAt: now, Permits: res.Granted}, 1)
				bk.Acquire(c, now, Request{})
			}
		})
	}
}

// BenchmarkCommit is the same grant settled by Commit, which answers what
// remains itself: used 1 of 2 (under) and 3 of 2 (over, charging debt).
func BenchmarkCommit(b *testing.B) {
	for _, bc := range benchConfigs {
		if !OffersCommit(bc.c.Algorithm) {
			continue
		}
		for _, used := range []struct {
			name string
			n    int64
		}{{"under", 1}, {"over", 3}} {
			b.Run(bc.name+"/"+used.name, func(b *testing.B) {
				c := &bc.c
				bk := New(c, 0)
				now := int64(0)
				b.ReportAllocs()
				for b.Loop() {
					now += 10 * ms
					res := bk.Acquire(c, now, Request{Permits: 2})
					if res.Granted != 2 {
						b.Fatalf("denied: %+v", res)
					}
					if _, err := bk.Commit(c, now, Grant{IssuedAt: now, Permits: res.Granted}, used.n); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkAcquireCalendar is one decision of a calendar window in a time
// zone, mostly inside a window (no calendar arithmetic) and crossing a day
// boundary every 100,000 decisions.
func BenchmarkAcquireCalendar(b *testing.B) {
	c := &Config{Algorithm: FixedWindow, Limit: 1000, Calendar: CalendarDay, Location: mustZone("Europe/Berlin")}
	now := wall(c.Location, 2024, 3, 1, 0, 0)
	bk := New(c, now)
	b.ReportAllocs()
	for b.Loop() {
		now += 864 * ms
		bk.Acquire(c, now, Request{Permits: 1})
	}
}
