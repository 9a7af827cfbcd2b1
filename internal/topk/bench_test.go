package topk

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

func benchSketch(b *testing.B) *Sketch {
	b.Helper()
	s, err := New(DefaultConfig())
	if err != nil {
		b.Fatal(err)
	}
	return s
}

func benchKeys(n int, zipf bool) []string {
	r := rand.New(rand.NewPCG(7, 8))
	z := rand.NewZipf(r, 1.1, 1, 1_000_000-1)
	keys := make([]string, n)
	for i := range keys {
		id := uint64(i)
		if zipf {
			id = z.Uint64()
		}
		keys[i] = fmt.Sprintf("user-%08d", id)
	}
	return keys
}

// BenchmarkObserve is the cost a decision pays:
//   - tracked: a key already monitored in both windows (the hot path:
//     mutex, two map lookups, two sifts; no allocation, no key copy);
//   - zipf: Zipf(1.1) keys over 1M users at 100,000 decisions/s of fake
//     time, so buckets rotate and cold keys evict;
//   - new-key: every key new, each one evicting the smallest counter in
//     both windows (copies the key once).
func BenchmarkObserve(b *testing.B) {
	b.Run("tracked", func(b *testing.B) {
		s := benchSketch(b)
		keys := benchKeys(200, false) // fewer than Capacity: all stay monitored
		for _, k := range keys {
			s.Observe(0, k, 1, false)
		}
		b.ReportAllocs()
		i := 0
		cpu := cpuNanos()
		for b.Loop() {
			s.Observe(0, keys[i%len(keys)], 1, false)
			i++
		}
		reportCPU(b, cpu)
	})
	b.Run("zipf", func(b *testing.B) {
		s := benchSketch(b)
		keys := benchKeys(1<<16, true)
		b.ReportAllocs()
		i := 0
		now := int64(0)
		cpu := cpuNanos()
		for b.Loop() {
			now += 10 * int64(time.Microsecond)
			s.Observe(now, keys[i&(1<<16-1)], 1, i%8 == 0)
			i++
		}
		reportCPU(b, cpu)
	})
	b.Run("new-key", func(b *testing.B) {
		s := benchSketch(b)
		keys := benchKeys(1<<20, false)
		b.ReportAllocs()
		i := 0
		cpu := cpuNanos()
		for b.Loop() {
			s.Observe(0, keys[i&(1<<20-1)], 1, false)
			i++
		}
		reportCPU(b, cpu)
	})
}

// BenchmarkObserveParallel is the tracked hot path from every core on one
// rule's Sketch (one mutex).
func BenchmarkObserveParallel(b *testing.B) {
	s := benchSketch(b)
	keys := benchKeys(200, false)
	for _, k := range keys {
		s.Observe(0, k, 1, false)
	}
	b.ReportAllocs()
	cpu := cpuNanos()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			s.Observe(0, keys[i%len(keys)], 1, false)
			i++
		}
	})
	reportCPU(b, cpu)
}

// BenchmarkTop is the read: a full default Sketch (every bucket holding
// Capacity keys) merged over the window and cut to the top 20.
func BenchmarkTop(b *testing.B) {
	s := benchSketch(b)
	keys := benchKeys(1<<16, true)
	i := 0
	span := int64(time.Hour)
	for now := int64(0); now < span; now += int64(time.Second) / 10 {
		s.Observe(now, keys[i&(1<<16-1)], 1, false)
		i++
	}
	for _, w := range []Window{Minute, Hour} {
		b.Run(w.String(), func(b *testing.B) {
			b.ReportAllocs()
			cpu := cpuNanos()
			for b.Loop() {
				s.Top(span, w, false, 20)
			}
			reportCPU(b, cpu)
		})
	}
}

// BenchmarkMergeNodes is the answering node's merge of three nodes' hour
// Snapshots, each truncated to 1,024 entries for the wire.
func BenchmarkMergeNodes(b *testing.B) {
	snaps := make([]Summary, 3)
	for n := range snaps {
		s := benchSketch(b)
		r := rand.New(rand.NewPCG(uint64(n), 1))
		z := rand.NewZipf(r, 1.1, 1, 1_000_000-1)
		for now := int64(0); now < int64(time.Hour); now += int64(time.Second) / 10 {
			s.Observe(now, fmt.Sprintf("user-%08d", z.Uint64()), 1, false)
		}
		snaps[n] = s.Snapshot(int64(time.Hour), Hour, false).Truncate(1024)
	}
	b.ReportAllocs()
	cpu := cpuNanos()
	for b.Loop() {
		Merge(snaps...).Top(20)
	}
	reportCPU(b, cpu)
}
