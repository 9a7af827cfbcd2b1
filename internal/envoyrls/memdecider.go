package envoyrls

import (
	"context"
	"sync"
	"time"
)

// MemDecider counts in memory with the reference's semantics: one counter
// per CounterKey and epoch-aligned window, incremented by every hit even past
// the limit (as Redis INCRBY is), over when the count after the hit exceeds
// requests_per_unit. It ignores Algorithm and Burst. It serves tests and a
// single process; memory grows with the number of distinct keys seen in the
// current windows.
type MemDecider struct {
	mu       sync.Mutex
	counters map[string]*memCounter
}

type memCounter struct {
	window int64
	count  uint64
}

// NewMemDecider returns an empty MemDecider.
func NewMemDecider() *MemDecider {
	return &MemDecider{counters: map[string]*memCounter{}}
}

// Decide implements Decider.
func (m *MemDecider) Decide(_ context.Context, now time.Time, hits []Hit) ([]Decision, error) {
	nowUnix := now.Unix()
	out := make([]Decision, len(hits))
	m.mu.Lock()
	defer m.mu.Unlock()
	for i, h := range hits {
		l := h.Limit
		key := l.CounterKey()
		w := WindowStart(l.Unit, nowUnix)
		c := m.counters[key]
		if c == nil {
			c = &memCounter{window: w}
			m.counters[key] = c
		}
		if c.window != w {
			c.window, c.count = w, 0
		}
		before := c.count
		c.count += h.Hits
		d := Decision{Before: before, After: c.count}
		limit := uint64(l.RequestsPerUnit)
		if d.After > limit {
			d.Over = true
		} else {
			d.Remaining = uint32(limit - d.After)
		}
		out[i] = d
	}
	return out, nil
}
