package topk

import (
	"fmt"
	"math"
	"testing"
	"time"
)

// TestSampledZipfProperty is TestZipfProperty with sampling on: on Zipf
// streams, for each window and side, every key whose true count exceeds
// 2N/k is reported and every reported count lies within its Error plus
// six standard deviations of the sampling noise, √(3R × true) with
// permits of 1 to 3; Total lies within six standard deviations of N. The
// chance that any check fails on a correct sketch is far below 1e-6.
func TestSampledZipfProperty(t *testing.T) {
	const every = 16
	cfg := Config{Capacity: 32, MinuteBucket: 10 * time.Second, HourBucket: 5 * time.Minute, SampleEvery: every, ExactPerBucket: 500}
	k := int64(cfg.Capacity)
	for seed := range uint64(3) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			s, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			m := newModel(cfg)
			// 200,000 decisions over 70 minutes: about 480 per minute
			// bucket, so buckets sample once the one before reached 500.
			stream := zipfStream(seed+100, 200000, 10000, 0, 70*minute)
			for _, o := range stream {
				s.Observe(o.at, o.key, o.permits, o.denied)
				m.observe(o.at, o.key, o.permits, o.denied)
			}
			end := stream[len(stream)-1].at
			for _, w := range []Window{Minute, Hour} {
				for _, denied := range []bool{false, true} {
					snap := s.Snapshot(end, w, denied)
					exact, total := m.exact(end, w, denied)
					checkSampled(t, snap, exact, total, k, every)
				}
			}
		})
	}
}

// checkSampled checks a sampled Summary against exact counts.
func checkSampled(t *testing.T, s Summary, exact map[string]int64, total, k, every int64) {
	t.Helper()
	if err := s.Validate(); err != nil {
		t.Fatalf("summary invalid: %v", err)
	}
	noise := func(n int64) float64 { return 6 * math.Sqrt(float64(3*every*max(n, 1))) }
	if d := math.Abs(float64(s.Total - total)); d > noise(total) {
		t.Fatalf("total %d, true %d: off by more than %.0f", s.Total, total, noise(total))
	}
	listed := make(map[string]bool, len(s.Entries))
	for _, e := range s.Entries {
		listed[e.Key] = true
		tc := exact[e.Key]
		if float64(tc) > float64(e.Count)+noise(tc) || float64(tc) < float64(e.Count-e.Error)-noise(tc) {
			t.Fatalf("key %q: true %d outside [%d-%d, %d] ± %.0f", e.Key, tc, e.Count, e.Error, e.Count, noise(tc))
		}
	}
	for key, c := range exact {
		if !listed[key] && c > 2*total/k {
			t.Fatalf("key %q with true count %d > 2N/k = %d not listed", key, c, 2*total/k)
		}
	}
}

// TestSamplingSwitch: a quiet bucket counts exactly; a bucket that
// reaches ExactPerBucket samples from then on, and so does the bucket
// right after it; a bucket after an idle gap is exact again.
func TestSamplingSwitch(t *testing.T) {
	cfg := Config{Capacity: 8, MinuteBucket: 10 * time.Second, HourBucket: 5 * time.Minute, SampleEvery: 4, ExactPerBucket: 100}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	sec := int64(time.Second)
	for i := range 99 {
		s.Observe(0, fmt.Sprint("k", i%5), 1, false)
	}
	if s.sampling.Load() {
		t.Fatal("sampling after 99 of 100 exact decisions")
	}
	if got := s.Snapshot(0, Minute, false).Total; got != 99 {
		t.Fatalf("total %d, want exactly 99", got)
	}
	s.Observe(0, "k0", 1, false)
	if !s.sampling.Load() {
		t.Fatal("not sampling after 100 decisions")
	}
	s.Observe(10*sec, "k0", 1, false) // the next bucket, after a busy one
	s.Observe(10*sec, "k0", 1, false)
	if !s.sampling.Load() {
		t.Fatal("not sampling in the bucket after a busy one")
	}
	// After an idle gap, the first decision sampled (weight 4) turns
	// sampling off; the next ones count exactly.
	for s.sampling.Load() {
		s.Observe(90*sec, "k1", 1, false)
	}
	s.Observe(90*sec, "k2", 1, false)
	got := s.Snapshot(90*sec, Minute, false)
	if got.Total != 5 || len(got.Entries) != 2 || got.Entries[0] != (Entry{"k1", 4, 0}) || got.Entries[1] != (Entry{"k2", 1, 0}) {
		t.Fatalf("after an idle gap: %+v, want k1 sampled once at weight 4 and k2 counted exactly", got)
	}
}
