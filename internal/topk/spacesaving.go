package topk

import "strings"

// counter is one monitored key of a Space-Saving sketch. Its true count
// lies in [count-err, count].
type counter struct {
	key   string
	hash  uint64 // the Sketch's maphash of key
	count int64
	err   int64
	pos   int32 // index of this counter in spaceSaving.heap
}

// spaceSaving is the weighted Space-Saving sketch of Metwally, Agrawal and
// El Abbadi (2005) over at most capacity keys. counters never move; table
// is an open-addressing hash index (linear probing, at most half full,
// entries are counter index + 1, 0 is empty) from a key's hash to its
// counter; heap orders the counters by count (smallest first) and each
// counter remembers its heap position. An increment is one probe and a sift
// that rarely moves a hot key. The caller hashes the key once for both
// windows, which is why the index is not a Go map.
//
// Guarantees, with N the sum of weights added and m the smallest count
// when the sketch is full (0 before): every monitored key's true count is
// in [count-err, count]; err ≤ m; every key not monitored has a true count
// ≤ m; and m ≤ N/capacity, because the counts always sum to N.
type spaceSaving struct {
	table    []int32
	counters []counter
	heap     []int32
	total    int64
}

// find returns the table position holding key, or the empty position where
// it would go. The table must have an empty position.
func (s *spaceSaving) find(h uint64, key string) (pos int, ok bool) {
	mask := len(s.table) - 1
	for i := int(h) & mask; ; i = (i + 1) & mask {
		v := s.table[i]
		if v == 0 {
			return i, false
		}
		if c := &s.counters[v-1]; c.hash == h && c.key == key {
			return i, true
		}
	}
}

// remove empties table position i and shifts later entries of its probe
// run back, so lookups never stop early at a hole (no tombstones).
func (s *spaceSaving) remove(i int) {
	mask := len(s.table) - 1
	j := i
	for {
		s.table[i] = 0
		for {
			j = (j + 1) & mask
			v := s.table[j]
			if v == 0 {
				return
			}
			home := int(s.counters[v-1].hash) & mask
			// The entry at j may fill the hole at i unless its home lies
			// cyclically in (i, j].
			if i <= j {
				if i < home && home <= j {
					continue
				}
			} else if i < home || home <= j {
				continue
			}
			s.table[i] = v
			i = j
			break
		}
	}
}

// grow doubles the table (from 8 positions) and reinserts every counter.
func (s *spaceSaving) grow() {
	n := max(8, 2*len(s.table))
	s.table = make([]int32, n)
	mask := n - 1
	for ci := range s.counters {
		i := int(s.counters[ci].hash) & mask
		for s.table[i] != 0 {
			i = (i + 1) & mask
		}
		s.table[i] = int32(ci + 1)
	}
}

// add counts w (> 0) for key, whose hash is h. A key already monitored
// costs one probe and no allocation; its string is not copied. A new key
// copies its string (the caller's may alias a larger buffer) and, when the
// sketch is full, takes the smallest counter's place: count min+w, err min.
func (s *spaceSaving) add(h uint64, key string, w int64, capacity int) {
	s.total += w
	if len(s.table) > 0 {
		if p, ok := s.find(h, key); ok {
			c := &s.counters[s.table[p]-1]
			c.count += w
			s.down(int(c.pos))
			return
		}
	}
	key = strings.Clone(key)
	if len(s.counters) < capacity {
		if 2*(len(s.counters)+1) > len(s.table) {
			s.grow()
		}
		p, _ := s.find(h, key)
		i := int32(len(s.counters))
		s.counters = append(s.counters, counter{key: key, hash: h, count: w, pos: int32(len(s.heap))})
		s.heap = append(s.heap, i)
		s.table[p] = i + 1
		s.up(len(s.heap) - 1)
		return
	}
	i := s.heap[0]
	c := &s.counters[i]
	old, _ := s.find(c.hash, c.key)
	s.remove(old)
	p, _ := s.find(h, key)
	s.table[p] = i + 1
	m := c.count
	c.key, c.hash, c.count, c.err = key, h, m+w, m
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
	clear(s.table)
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
