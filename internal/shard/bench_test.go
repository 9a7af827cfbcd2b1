package shard

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
)

// BenchmarkAcquireParallel is the hit path: 10k hot token-bucket keys that
// already have buckets, from b.RunParallel goroutines. Run with -cpu 1,2 to
// see the scaling; the shard count is the sub-benchmark.
func BenchmarkAcquireParallel(b *testing.B) {
	const keys = 10_000
	names := make([]string, keys)
	for i := range names {
		names[i] = fmt.Sprintf("user-%06d", i)
	}
	for _, shards := range []int{1, 16, 64, 256} {
		b.Run(fmt.Sprintf("shards=%d", shards), func(b *testing.B) {
			r := tb("api", 1<<40)
			r.Period = time.Hour
			_, get := store(b, r)
			c := get("api")
			m := New(Config{Shards: shards})
			for _, k := range names {
				if _, err := m.Acquire(c, k, bucket.Request{Permits: 1}, sec); err != nil {
					b.Fatal(err)
				}
			}
			var clock atomic.Int64
			clock.Store(sec)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := int(clock.Add(7919))
				for pb.Next() {
					i++
					if _, err := m.Acquire(c, names[i%keys], bucket.Request{Permits: 1}, 2*sec); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkMemoryPerKey reports the heap held per live key with 1M keys of
// 16 bytes ("user-0000000" under rule "api"), for each algorithm after one
// acquire of one permit: B/key is heap after creating them minus heap
// before, after GC; counted-B/key is what the bucket memory budget counts.
func BenchmarkMemoryPerKey(b *testing.B) {
	const n = 1_000_000
	for _, a := range []bucket.Algorithm{bucket.TokenBucket, bucket.LeakyBucket, bucket.FixedWindow, bucket.SlidingWindow, bucket.SlidingLog, bucket.Concurrency} {
		b.Run(a.String(), func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				r := tb("api", 100)
				r.Algorithm = a
				r.MaxKeys = n
				_, get := store(b, r)
				c := get("api")
				keys := make([]string, n)
				for j := range keys {
					keys[j] = fmt.Sprintf("user-%07d", j)
				}
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				m := New(Config{})
				for _, k := range keys {
					if _, err := m.Acquire(c, k, bucket.Request{Permits: 1}, sec); err != nil {
						b.Fatal(err)
					}
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				if m.Live() != n {
					b.Fatalf("live %d", m.Live())
				}
				b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "B/key")
				b.ReportMetric(float64(m.Bytes())/n, "counted-B/key")
				runtime.KeepAlive(m)
				runtime.KeepAlive(keys)
			}
		})
	}
}
