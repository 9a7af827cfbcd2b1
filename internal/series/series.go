// Package series keeps the last hour of one rule's decision counters at one
// second resolution in a fixed ring, written here because Prometheus
// counters hold no in-process history and the ring is a few dozen lines.
//
// A Series counts, for each second, the decisions a node admitted, denied
// and denied only in shadow mode, and the permits it admitted. Time is an
// argument: every method takes `now`, int64 monotonic nanoseconds chosen by
// the caller, as internal/bucket does. A `now` earlier than the latest one
// a Series has seen counts as that latest one, so a clock that jumps back
// never rewrites history. Utilisation is not stored: Point.Utilisation
// computes it on read from the rule's limit, which may have changed.
//
// Memory: SlotBytes (40) per second times Slots (3600) is 144,000 bytes per
// rule, allocated on the first Add, so a rule that never decides costs a
// few dozen bytes. A Series is safe for simultaneous use by multiple
// goroutines; Add takes a mutex for a handful of additions.
package series

import (
	"slices"
	"sync"
	"time"
)

const (
	// Slots is how many seconds a Series remembers: one hour.
	Slots = 3600
	// SlotBytes is the memory of one second's counters.
	SlotBytes = 40
	// Resolution is the width of one slot.
	Resolution = time.Second
)

// Point is one second of counters. Time is the start of the second in the
// caller's monotonic nanoseconds.
type Point struct {
	// Time is the first nanosecond of the second the counters cover.
	Time int64
	// Admitted counts admitted decisions.
	Admitted int64
	// Denied counts denied decisions (shadow denials excluded).
	Denied int64
	// ShadowDenied counts decisions a shadow rule would have denied and
	// admitted instead.
	ShadowDenied int64
	// Permits sums the permits admitted.
	Permits int64
}

// Utilisation is the admitted permits of this second over what the rule
// allows in one second: Permits ÷ (limit × 1 s ÷ period). It is 0 when the
// limit or period is not positive. Above 1 means the second admitted more
// than the average rate allows (a burst, or shadow mode).
func (p Point) Utilisation(limit int64, period time.Duration) float64 {
	if limit <= 0 || period <= 0 {
		return 0
	}
	perSecond := float64(limit) * float64(Resolution) / float64(period)
	return float64(p.Permits) / perSecond
}

// slot is one second of the ring; sec tells which second it holds, so a
// slot left from an earlier lap reads as zeros.
type slot struct {
	sec                                     int64
	admitted, denied, shadowDenied, permits int64
}

// Series is one rule's last hour of counters on one node. The zero value is
// ready to use.
type Series struct {
	mu     sync.Mutex
	slots  []slot // Slots long once allocated, indexed by second mod Slots
	latest int64  // the latest second seen, valid when slots != nil
}

// secondOf is the second holding nanosecond t, rounding towards minus
// infinity so negative monotonic times bucket like positive ones.
func secondOf(t int64) int64 {
	s := t / int64(Resolution)
	if t%int64(Resolution) < 0 {
		s--
	}
	return s
}

func index(sec int64) int {
	i := sec % Slots
	if i < 0 {
		i += Slots
	}
	return int(i)
}

// Add counts decisions at now: admitted, denied and shadowDenied decisions
// and permits admitted permits. A now earlier than the latest one seen
// counts in the latest second.
func (s *Series) Add(now, admitted, denied, shadowDenied, permits int64) {
	sec := secondOf(now)
	s.mu.Lock()
	if s.slots == nil {
		s.slots = make([]slot, Slots)
		for i := range s.slots {
			s.slots[i].sec = -1 << 63 // no second: reads as empty
		}
		s.latest = sec
	}
	if sec < s.latest {
		sec = s.latest
	} else {
		s.latest = sec
	}
	sl := &s.slots[index(sec)]
	if sl.sec != sec {
		*sl = slot{sec: sec}
	}
	sl.admitted += admitted
	sl.denied += denied
	sl.shadowDenied += shadowDenied
	sl.permits += permits
	s.mu.Unlock()
}

// Range returns one Point per second from the second holding from to the
// second holding to, both included, oldest first, clipped to the hour
// ending at now (or at the latest time seen, if later). Seconds without
// traffic read as zeros. It returns nil when the clipped range is empty.
func (s *Series) Range(now, from, to int64) []Point {
	first, last := secondOf(from), secondOf(to)
	s.mu.Lock()
	defer s.mu.Unlock()
	end := secondOf(now)
	if s.slots != nil && s.latest > end {
		end = s.latest
	}
	last = min(last, end)
	first = max(first, end-Slots+1)
	if first > last {
		return nil
	}
	out := make([]Point, last-first+1)
	i := index(first)
	for j := range out {
		sec := first + int64(j)
		out[j].Time = sec * int64(Resolution)
		if s.slots != nil {
			if sl := &s.slots[i]; sl.sec == sec {
				out[j].Admitted, out[j].Denied = sl.admitted, sl.denied
				out[j].ShadowDenied, out[j].Permits = sl.shadowDenied, sl.permits
			}
		}
		if i++; i == Slots {
			i = 0
		}
	}
	return out
}

// Merge sums several nodes' points by second: the result has one Point per
// distinct Time in the inputs, oldest first. Inputs are not modified.
func Merge(nodes ...[]Point) []Point {
	n := 0
	for _, ps := range nodes {
		n += len(ps)
	}
	all := make([]Point, 0, n)
	for _, ps := range nodes {
		all = append(all, ps...)
	}
	slices.SortStableFunc(all, func(a, b Point) int {
		switch {
		case a.Time < b.Time:
			return -1
		case a.Time > b.Time:
			return 1
		}
		return 0
	})
	out := all[:0]
	for _, p := range all {
		if k := len(out) - 1; k >= 0 && out[k].Time == p.Time {
			out[k].Admitted += p.Admitted
			out[k].Denied += p.Denied
			out[k].ShadowDenied += p.ShadowDenied
			out[k].Permits += p.Permits
			continue
		}
		out = append(out, p)
	}
	return out
}

// Sums returns the points from the second holding from to the second
// holding to summed in buckets of width seconds (≥ 1), oldest first: the
// bucket i holds the seconds from first+i×width, and its Time is the
// first of them; the last bucket may be cut short by to. Seconds outside
// the hour ending at now (or at the latest time seen, if later) read as
// zeros. Unlike Range it allocates one Point per bucket, not per second,
// so a rules list can read an hour of many rules cheaply. It returns nil
// when from is after to.
func (s *Series) Sums(now, from, to int64, width int64) []Point {
	first, last := secondOf(from), secondOf(to)
	if first > last || width < 1 {
		return nil
	}
	out := make([]Point, (last-first)/width+1)
	for i := range out {
		out[i].Time = (first + int64(i)*width) * int64(Resolution)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.slots == nil {
		return out
	}
	end := max(secondOf(now), s.latest)
	lo, hi := max(first, end-Slots+1), min(last, end)
	for sec := lo; sec <= hi; sec++ {
		sl := &s.slots[index(sec)]
		if sl.sec != sec {
			continue
		}
		p := &out[(sec-first)/width]
		p.Admitted += sl.admitted
		p.Denied += sl.denied
		p.ShadowDenied += sl.shadowDenied
		p.Permits += sl.permits
	}
	return out
}
