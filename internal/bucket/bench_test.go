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
