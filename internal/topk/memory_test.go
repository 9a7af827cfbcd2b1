package topk

import (
	"fmt"
	"runtime"
	"testing"
)

// TestMemoryPerEntry fills every bucket of both windows and both sides of
// a default Sketch with 32-byte keys and checks the heap it holds against
// the documented bound, MaxEntries × (EntryBytes + key length).
// Run with -v for the figure.
func TestMemoryPerEntry(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation sizes")
	}
	const keyLen = 32
	cfg := DefaultConfig()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	next := 0
	fill := func(at int64) {
		for range cfg.Capacity {
			key := fmt.Sprintf("%0*d", keyLen, next)
			next++
			s.Observe(at, key, 1, false)
			s.Observe(at, key, 1, true)
		}
	}
	// Every hour bucket, then the last seven minute buckets.
	for i := range int64(cfg.Buckets(Hour)) {
		fill(i * int64(cfg.HourBucket))
	}
	end := int64(cfg.Buckets(Hour)-1) * int64(cfg.HourBucket)
	for i := range int64(cfg.Buckets(Minute)) {
		fill(end + i*int64(cfg.MinuteBucket))
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	held := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	entries := 0
	for _, w := range []Window{Minute, Hour} {
		for _, denied := range []bool{false, true} {
			now := end + int64(cfg.Buckets(Minute)-1)*int64(cfg.MinuteBucket)
			entries += len(s.Snapshot(now, w, denied).Entries) // distinct keys: one per counter
		}
	}
	runtime.KeepAlive(s)
	if entries != cfg.MaxEntries() {
		t.Fatalf("filled %d counters, want MaxEntries %d", entries, cfg.MaxEntries())
	}
	per := float64(held) / float64(entries)
	t.Logf("default config (%d keys x %d buckets x 2 sides = %d counters, %d-byte keys): %d bytes held, %.1f bytes per counter, %.1f without the key",
		cfg.Capacity, cfg.Buckets(Minute)+cfg.Buckets(Hour), entries, keyLen, held, per, per-keyLen)
	if bound := float64(EntryBytes + keyLen); per > bound {
		t.Errorf("%.1f bytes per counter, above the documented EntryBytes + key = %.0f", per, bound)
	}
}
