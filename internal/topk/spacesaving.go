package topk

import "strings"

// counter is one monitored key of a Space-Saving sketch. Its true count
// lies in [count-err, count].
type counter struct {
	key   string
	count int64
	err   int64
	pos   int32 // index of this counter in spaceSaving.heap
}

// spaceSaving is the weighted Space-Saving sketch of Metwally, Agrawal and
// El Abbadi (2005) over at most capacity keys. counters never move, so
// index maps a key to a stable slot; heap orders those slots by count
// (smallest first) and each counter remembers its heap position, so an
// increment is one map lookup and a sift that rarely moves a hot key.
//
// Guarantees, with N the sum of weights added and m the smallest count
// when the sketch is full (0 before): every monitored key's true count is
// in [count-err, count]; err ≤ m; every key not monitored has a true count
// ≤ m; and m ≤ N/capacity, because the counts always sum to N.
type spaceSaving struct {
	index    map[string]int32
	counters []counter
	heap     []int32
	total    int64
}

// add counts w (> 0) for key. A key already monitored costs a map lookup
// and no allocation; its string is not copied. A new key copies its string
// (the caller's may alias a larger buffer) and, when the sketch is full,
// takes the smallest counter's place: count min+w, err min.
func (s *spaceSaving) add(key string, w int64, capacity int) {
	s.total += w
	if i, ok := s.index[key]; ok {
		c := &s.counters[i]
		c.count += w
		s.down(int(c.pos))
		return
	}
	if s.index == nil {
		s.index = make(map[string]int32)
	}
	key = strings.Clone(key)
	if len(s.counters) < capacity {
		i := int32(len(s.counters))
		s.counters = append(s.counters, counter{key: key, count: w, pos: int32(len(s.heap))})
		s.heap = append(s.heap, i)
		s.index[key] = i
		s.up(len(s.heap) - 1)
		return
	}
	i := s.heap[0]
	c := &s.counters[i]
	delete(s.index, c.key)
	m := c.count
	c.key, c.count, c.err = key, m+w, m
	s.index[key] = i
	s.down(0)
}

// floor is an upper bound on the true count of any key not monitored: the
// smallest count once the sketch is full, 0 before.
func (s *spaceSaving) floor(capacity int) int64 {
	if len(s.counters) < capacity || len(s.heap) == 0 {
		return 0
	}
	return s.counters[s.heap[0]].count
}

// reset empties the sketch and keeps its memory for the next bucket.
func (s *spaceSaving) reset() {
	clear(s.index)
	clear(s.counters) // drop the key strings
	s.counters = s.counters[:0]
	s.heap = s.heap[:0]
	s.total = 0
}

// summary copies the sketch into a Summary (entries unsorted).
func (s *spaceSaving) summary(capacity int) Summary {
	out := Summary{Floor: s.floor(capacity), Total: s.total}
	if len(s.counters) > 0 {
		out.Entries = make([]Entry, len(s.counters))
		for i, c := range s.counters {
			out.Entries[i] = Entry{Key: c.key, Count: c.count, Error: c.err}
		}
	}
	return out
}

func (s *spaceSaving) less(a, b int) bool {
	return s.counters[s.heap[a]].count < s.counters[s.heap[b]].count
}

func (s *spaceSaving) swap(a, b int) {
	h := s.heap
	h[a], h[b] = h[b], h[a]
	s.counters[h[a]].pos = int32(a)
	s.counters[h[b]].pos = int32(b)
}

func (s *spaceSaving) up(j int) {
	for j > 0 {
		p := (j - 1) / 2
		if !s.less(j, p) {
			return
		}
		s.swap(j, p)
		j = p
	}
}

func (s *spaceSaving) down(j int) {
	n := len(s.heap)
	for {
		l := 2*j + 1
		if l >= n {
			return
		}
		c := l
		if r := l + 1; r < n && s.less(r, l) {
			c = r
		}
		if !s.less(c, j) {
			return
		}
		s.swap(j, c)
		j = c
	}
}
