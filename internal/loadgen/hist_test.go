package loadgen

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestHistogramBuckets(t *testing.T) {
	// Every value lands in a bucket that contains it and is at most 1/128
	// of the value wide; buckets are contiguous.
	check := func(v int64) {
		t.Helper()
		i := bucketOf(v)
		lo, hi := bucketRange(i)
		if v < lo || v > hi {
			t.Fatalf("value %d in bucket %d = [%d, %d]", v, i, lo, hi)
		}
		if width := hi - lo + 1; width > 1 && float64(width) > float64(v)/histSubCount {
			t.Fatalf("value %d: bucket [%d, %d] is wider than 1/%d of it", v, lo, hi, histSubCount)
		}
	}
	for v := int64(0); v < 100_000; v++ {
		check(v)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 100_000 {
		check(rng.Int64N(histMaxValue))
	}
	check(histMaxValue)
	if got := bucketOf(histMaxValue); got != histBuckets-1 {
		t.Errorf("the largest value is in bucket %d, want the last, %d", got, histBuckets-1)
	}
	for i := 1; i < histBuckets; i++ {
		_, prevHi := bucketRange(i - 1)
		lo, _ := bucketRange(i)
		if lo != prevHi+1 {
			t.Fatalf("bucket %d starts at %d, bucket %d ends at %d", i, lo, i-1, prevHi)
		}
	}
}

func TestHistogramQuantiles(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values func(rng *rand.Rand) int64
	}{
		{"uniform 1µs-10ms", func(rng *rand.Rand) int64 { return 1_000 + rng.Int64N(10_000_000) }},
		{"exponential mean 200µs", func(rng *rand.Rand) int64 { return int64(rng.ExpFloat64() * 200_000) }},
		{"small exact values", func(rng *rand.Rand) int64 { return rng.Int64N(200) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(3, 4))
			const n = 200_000
			// Record in 4 histograms, as bench's workers do, and merge.
			var parts [4]histogram
			all := make([]int64, n)
			for i := range all {
				all[i] = tc.values(rng)
				parts[i%4].record(all[i])
			}
			var h histogram
			for i := range parts {
				h.merge(&parts[i])
			}
			slices.Sort(all)
			if h.count() != n {
				t.Fatalf("count %d, want %d", h.count(), n)
			}
			for _, q := range []float64{0.5, 0.9, 0.99, 0.999} {
				exact := all[int(math.Ceil(q*n))-1]
				got := h.quantile(q)
				if diff := math.Abs(float64(got - exact)); diff > 0.01*float64(exact) && diff > 1 {
					t.Errorf("p%v = %d, exact %d: off by more than 1%%", q*100, got, exact)
				}
			}
			if h.quantile(0) != all[0] || h.quantile(1) != all[n-1] {
				t.Errorf("min/max = %d/%d, want %d/%d", h.quantile(0), h.quantile(1), all[0], all[n-1])
			}
		})
	}
}

func TestHistogramEdges(t *testing.T) {
	var h histogram
	if h.quantile(0.5) != 0 || h.mean() != 0 {
		t.Error("an empty histogram should report 0")
	}
	h.record(-5) // counts as 0
	h.record(math.MaxInt64)
	if h.quantile(0) != 0 || h.quantile(1) != histMaxValue {
		t.Errorf("min %d max %d", h.quantile(0), h.quantile(1))
	}
	var one histogram
	one.record(1_234_567)
	for _, q := range []float64{0.5, 0.99} {
		if got := one.quantile(q); got != 1_234_567 {
			t.Errorf("one value: p%v = %d, want the value itself", q*100, got)
		}
	}
}

func TestHistogramRecordAllocs(t *testing.T) {
	h := new(histogram)
	v := int64(12345)
	if n := testing.AllocsPerRun(1000, func() { h.record(v); v += 7919 }); n != 0 {
		t.Errorf("record allocates %v times", n)
	}
}

func BenchmarkHistogramRecord(b *testing.B) {
	b.ReportAllocs()
	h := new(histogram)
	v := int64(1)
	for b.Loop() {
		h.record(v)
		v = v*6364136223846793005 + 1442695040888963407
		if v < 0 {
			v = -v
		}
	}
}
