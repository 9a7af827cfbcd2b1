package topk

import (
	"testing"
)

// model counts exactly what a Sketch should approximate: permits per
// window, side, bucket number and key, with the Sketch's rule for a clock
// going back (a time before the latest counts as the latest).
type model struct {
	cfg    Config
	latest int64
	seen   bool
	counts map[Window]*[2]map[int64]map[string]int64
}

func newModel(cfg Config) *model {
	m := &model{cfg: cfg, counts: map[Window]*[2]map[int64]map[string]int64{}}
	for _, w := range []Window{Minute, Hour} {
		m.counts[w] = &[2]map[int64]map[string]int64{{}, {}}
	}
	return m
}

func (m *model) width(w Window) int64 {
	if w == Minute {
		return int64(m.cfg.MinuteBucket)
	}
	return int64(m.cfg.HourBucket)
}

func (m *model) clock(now int64) int64 {
	if !m.seen || now > m.latest {
		m.latest, m.seen = now, true
	}
	return m.latest
}

func (m *model) observe(now int64, key string, permits int64, denied bool) {
	if permits <= 0 {
		return
	}
	now = m.clock(now)
	side := 0
	if denied {
		side = 1
	}
	for w, sides := range m.counts {
		e := floorDiv(now, m.width(w))
		byKey := sides[side][e]
		if byKey == nil {
			byKey = map[string]int64{}
			sides[side][e] = byKey
		}
		byKey[key] += permits
	}
}

// exact returns the true counts and total of window w on one side at now.
func (m *model) exact(now int64, w Window, denied bool) (map[string]int64, int64) {
	if m.seen && m.latest > now {
		now = m.latest
	}
	side := 0
	if denied {
		side = 1
	}
	last := floorDiv(now, m.width(w))
	out := map[string]int64{}
	var total int64
	for e, byKey := range m.counts[w][side] {
		if e <= last && e > last-int64(m.cfg.Buckets(w)) {
			for k, c := range byKey {
				out[k] += c
				total += c
			}
		}
	}
	return out, total
}

// checkSummary checks a Summary against exact counts: its invariants, the
// total, every listed key's true count within [Count-Error, Count], every
// unlisted key at most Floor, and (when maxFloor ≥ 0) Floor ≤ maxFloor.
func checkSummary(t testing.TB, s Summary, exact map[string]int64, total, maxFloor int64) {
	t.Helper()
	if err := s.Validate(); err != nil {
		t.Fatalf("summary invalid: %v", err)
	}
	if s.Total != total {
		t.Fatalf("total %d, want %d", s.Total, total)
	}
	if maxFloor >= 0 && s.Floor > maxFloor {
		t.Fatalf("floor %d above its bound %d (total %d)", s.Floor, maxFloor, total)
	}
	listed := make(map[string]bool, len(s.Entries))
	for i, e := range s.Entries {
		listed[e.Key] = true
		if tc := exact[e.Key]; tc > e.Count || tc < e.Count-e.Error {
			t.Fatalf("key %q: true %d outside [%d-%d, %d]", e.Key, tc, e.Count, e.Error, e.Count)
		}
		if i > 0 && s.Entries[i-1].Count < e.Count {
			t.Fatalf("entries not hottest first at %d: %d then %d", i, s.Entries[i-1].Count, e.Count)
		}
	}
	for k, c := range exact {
		if !listed[k] && c > s.Floor {
			t.Fatalf("key %q with true count %d > floor %d not listed", k, c, s.Floor)
		}
	}
}
