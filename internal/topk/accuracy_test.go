package topk

import (
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"
)

// TestZipfAccuracy measures the figure quoted for issue 19: a stream of
// 1,000,000 decisions whose keys follow Zipf(s=1.1) over 1,000,000 keys,
// one permit each, read back as the top 20 and compared with exact counts.
// It logs recall and precision of the top 20, the largest difference
// between a reported and a true count, and the bound (Floor ≤ N/k).
// Run: go test -run TestZipfAccuracy -v ./internal/topk/
func TestZipfAccuracy(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("a million decisions per case: run without -short and -race (TestZipfProperty checks the same bounds under -race)")
	}
	const (
		n        = 1_000_000
		universe = 1_000_000
		top      = 20
	)
	r := rand.New(rand.NewPCG(1, 2))
	z := rand.NewZipf(r, 1.1, 1, universe-1)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "user-" + strconv.FormatUint(z.Uint64(), 10)
	}
	exact := map[string]int64{}
	for _, k := range keys {
		exact[k]++
	}
	want := make([]Entry, 0, len(exact))
	for k, c := range exact {
		want = append(want, Entry{Key: k, Count: c})
	}
	slices.SortFunc(want, func(a, b Entry) int {
		if c := cmp.Compare(b.Count, a.Count); c != 0 {
			return c
		}
		return cmp.Compare(a.Key, b.Key)
	})
	t.Logf("stream: %d decisions, %d distinct keys, hottest %d, 20th %d, 21st %d",
		n, len(exact), want[0].Count, want[top-1].Count, want[top].Count)

	tests := []struct {
		name      string
		capacity  int
		w         Window
		span      time.Duration // the stream is spread evenly over span
		minRecall float64
		sample    int // Config.SampleEvery (ExactPerBucket 10,000)
	}{
		{"one 10s bucket, k=128", 128, Minute, 10*time.Second - 1, 0, 0},
		{"one 10s bucket, k=256", 256, Minute, 10*time.Second - 1, 1, 0},
		{"minute window (6 buckets), k=64", 64, Minute, time.Minute - 1, 0, 0},
		{"minute window (6 buckets), k=128", 128, Minute, time.Minute - 1, 0, 0},
		{"minute window (6 buckets), k=256", 256, Minute, time.Minute - 1, 1, 0},
		{"hour window (12 buckets), k=256", 256, Hour, time.Hour - 1, 1, 0},
		// The server's settings: k=64, 1 in 16 sampled past 10,000
		// decisions per bucket.
		{"minute window, k=64, sampled 1/16", 64, Minute, time.Minute - 1, 0, 16},
		{"minute window, k=256, sampled 1/16", 256, Minute, time.Minute - 1, 0.9, 16},
		{"hour window, k=64, sampled 1/16", 64, Hour, time.Hour - 1, 0, 16},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Capacity = tt.capacity
			cfg.SampleEvery, cfg.ExactPerBucket = tt.sample, 10000
			s, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			span := int64(tt.span)
			for i, k := range keys {
				s.Observe(span*int64(i)/n, k, 1, false)
			}
			snap := s.Snapshot(span, tt.w, false)
			if tt.sample > 1 {
				checkSampled(t, snap, exact, n, int64(tt.capacity), int64(tt.sample))
			} else {
				checkSummary(t, snap, exact, n, n/int64(tt.capacity))
			}
			got := snap.Top(top)
			inTrue := map[string]bool{}
			for _, e := range want[:top] {
				inTrue[e.Key] = true
			}
			hits := 0
			var maxDiff, maxErr int64
			for _, e := range got {
				if inTrue[e.Key] {
					hits++
				}
				maxDiff = max(maxDiff, e.Count-exact[e.Key])
				maxErr = max(maxErr, e.Error)
			}
			recall := float64(hits) / top
			precision := float64(hits) / float64(len(got))
			t.Logf("k=%d %v sample=1/%d: top-%d recall %.2f precision %.2f; max(count-true) %d, max reported error %d, floor %d, N/k %d (20th true count %d)",
				tt.capacity, tt.w, max(tt.sample, 1), top, recall, precision, maxDiff, maxErr, snap.Floor, n/int64(tt.capacity), want[top-1].Count)
			if recall < tt.minRecall {
				t.Errorf("recall %.2f below %.2f: %v", recall, tt.minRecall, fmt.Sprint(got))
			}
		})
	}
}
