package shard

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
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

// BenchmarkFloodRSS floods one node with 2M distinct keys of the costliest
// algorithm per key (a sliding window of 1000 sub-windows, about 8 KB) on a
// one-hour rule, so nothing becomes evictable, against a 256 MiB bucket
// budget, with the server's GC settings (GOGC 400, GOMEMLIMIT at budget +
// 64 MiB). It reports the peak process RSS above the RSS before the flood,
// and the bucket memory counted.
func BenchmarkFloodRSS(b *testing.B) {
	const budget, keys = 256 << 20, 2_000_000
	defer debug.SetGCPercent(debug.SetGCPercent(400))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(budget + 64<<20))
	for i := 0; i < b.N; i++ {
		r := tb("api", 100)
		r.Algorithm, r.Period, r.SampleCount = bucket.SlidingWindow, time.Hour, 1000
		_, get := store(b, r)
		c := get("api")
		runtime.GC()
		base := rssBytes(b)
		m := New(Config{MaxBytes: budget})
		peak, refused := base, 0
		buf := make([]byte, 0, 32)
		for j := range keys {
			buf = fmt.Appendf(buf[:0], "flood-%07d", j)
			if _, err := m.Acquire(c, string(buf), bucket.Request{Permits: 1}, sec+int64(j)); err != nil {
				refused++
			}
			if j%20_000 == 0 {
				peak = max(peak, rssBytes(b))
			}
		}
		peak = max(peak, rssBytes(b))
		b.ReportMetric(float64(peak-base)/(1<<20), "peak-RSS-MiB")
		b.ReportMetric(float64(m.Bytes())/(1<<20), "counted-MiB")
		b.ReportMetric(float64(refused), "refused")
		runtime.KeepAlive(m)
	}
}

// rssBytes reads the process's resident set size from /proc/self/status.
func rssBytes(b *testing.B) int64 {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Skip("no /proc/self/status:", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb << 10
		}
	}
	b.Skip("no VmRSS")
	return 0
}
