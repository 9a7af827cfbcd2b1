package topk

import (
	"fmt"
	"testing"
	"time"
)

// FuzzSketch feeds two Sketches an arbitrary stream (keys from a small
// set, permits 0 to 7, denied or not, time jumping forward by up to an
// hour or back by up to 20 s) and checks, at intervals and at the end, for
// each window and side of each Sketch, of their Merge and of its
// truncation: totals are exact, every listed key's true count lies in
// [Count-Error, Count], every unlisted key is at most Floor, and Floor ≤
// N/Capacity (before truncation).
func FuzzSketch(f *testing.F) {
	f.Add(uint8(1), []byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11})
	f.Add(uint8(2), []byte{200, 17, 33, 250, 1, 2, 255, 99, 100, 7, 7, 7, 40, 41, 42})
	f.Add(uint8(3), []byte{5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5})
	f.Fuzz(func(t *testing.T, capByte uint8, ops []byte) {
		cfg := Config{Capacity: 1 + int(capByte%4), MinuteBucket: 10 * time.Second, HourBucket: 5 * time.Minute}
		k := int64(cfg.Capacity)
		var sketches [2]*Sketch
		var models [2]*model
		for i := range sketches {
			s, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			sketches[i], models[i] = s, newModel(cfg)
		}
		now := [2]int64{}
		check := func() {
			t.Helper()
			at := max(now[0], now[1])
			for _, w := range []Window{Minute, Hour} {
				for _, denied := range []bool{false, true} {
					var snaps []Summary
					sum, total := map[string]int64{}, int64(0)
					for i, s := range sketches {
						snap := s.Snapshot(at, w, denied)
						exact, n := models[i].exact(at, w, denied)
						checkSummary(t, snap, exact, n, n/k)
						snaps = append(snaps, snap)
						for key, c := range exact {
							sum[key] += c
						}
						total += n
					}
					merged := Merge(snaps...)
					checkSummary(t, merged, sum, total, total/k)
					checkSummary(t, merged.Truncate(int(k)), sum, total, -1)
				}
			}
		}
		for i := 0; i+1 < len(ops); i += 2 {
			a, b := ops[i], ops[i+1]
			n := int(b & 1) // which sketch
			switch {
			case a == 255:
				now[n] += int64(time.Hour) + int64(b)*int64(time.Second)
			case a >= 240:
				now[n] -= int64(a-239) * int64(time.Second) // back up to 16 s
			default:
				now[n] += int64(a) * int64(100*time.Millisecond)
			}
			key := fmt.Sprint("k", b>>1&15)
			permits := int64(b >> 5)
			denied := a&1 == 1
			sketches[n].Observe(now[n], key, permits, denied)
			models[n].observe(now[n], key, permits, denied)
			if i%32 == 30 {
				check()
			}
		}
		check()
	})
}
