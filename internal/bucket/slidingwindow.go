package bucket

// slidingWindow is a SlidingWindow bucket (Sentinel's LeapArray): K =
// SampleCount sub-windows of width w = Period/K, sub-window i covering
// [i*w, (i+1)*w). A request at now, in sub-window cur = now/w, fits while
// the sub-windows cur-K+1 .. cur hold at most Limit including it. Memory is
// K counters (8K bytes) plus 48 bytes.
//
// Overshoot bound, as a function of K: any interval of length
// (K-1)*Period/K admits at most Limit, since it touches at most K
// consecutive sub-windows, all of which are still counted when its last
// admission is decided. An interval 2 ns longer, and so any interval of a
// full Period when K >= 2, can admit 2*Limit: Limit at the last nanosecond
// of sub-window s, and Limit again at the first nanosecond of sub-window
// s+K, when s has just left the count and s+1 .. s+K-1 are empty. No
// interval of length Period admits more than 2*Limit. K = 1 is the fixed
// window (its 2*Limit pass within 2 ns across a boundary); a larger K
// only shortens the 2*Limit burst's spread from nothing to (K-1)/K of a
// Period, it never removes it. TestSlidingWindowBound checks both.
type slidingWindow struct {
	counts []int64 // counts[i mod K] is sub-window i, for i in (head-K, head]
	head   int64   // index of the newest sub-window in counts
	total  int64   // sum of counts
	last   int64   // latest now seen
}

func newSlidingWindow(c *Config, now int64) *slidingWindow {
	k := c.Samples()
	return &slidingWindow{counts: make([]int64, k), head: floorDiv(now, c.Period/k), last: now}
}

// advance rolls the ring to the sub-window of now (clamped to the latest
// now seen), dropping sub-windows that left the count, and returns the
// effective now, the sub-window width and K.
func (s *slidingWindow) advance(c *Config, now int64) (int64, int64, int64) {
	k := c.Samples()
	w := c.Period / k
	now = max(now, s.last)
	s.last = now
	if int64(len(s.counts)) != k { // Reconfigure was skipped; start over
		*s = *newSlidingWindow(c, now)
	}
	cur := floorDiv(now, w)
	if cur <= s.head {
		return now, w, k
	}
	if cur-s.head >= k {
		clear(s.counts)
		s.total = 0
	} else {
		for i := s.head + 1; i <= cur; i++ {
			slot := floorMod(i, k)
			s.total -= s.counts[slot]
			s.counts[slot] = 0
		}
	}
	s.head = cur
	return now, w, k
}

// Acquire implements Bucket.
func (s *slidingWindow) Acquire(c *Config, now int64, r Request) Result {
	now, w, k := s.advance(c, now)
	n := r.Permits
	free := c.Limit - s.total
	slot := floorMod(s.head, k)
	switch {
	case max(n, 1) <= free:
		s.counts[slot] += n
		s.total += n
		return s.result(now, w, k, c, Result{Allowed: true, Granted: n})
	case r.Partial && n > 0 && free >= 1:
		s.counts[slot] += free
		s.total += free
		return s.result(now, w, k, c, Result{Allowed: true, Granted: free})
	case n > c.Limit && !r.Partial:
		return s.result(now, w, k, c, Result{}) // can never be granted
	}
	need := max(n, 1)
	if r.Partial {
		need = 1
	}
	// Walk from the oldest sub-window until enough has left the count.
	excess := s.total + need - c.Limit
	var freed int64
	for i := s.head - k + 1; i <= s.head; i++ {
		freed += s.counts[floorMod(i, k)]
		if freed >= excess {
			return s.result(now, w, k, c, Result{RetryAfter: (i+k)*w - now})
		}
	}
	return s.result(now, w, k, c, Result{}) // unreachable while total <= Limit
}

func (s *slidingWindow) result(now, w, k int64, c *Config, res Result) Result {
	res.Remaining = max(0, c.Limit-s.total)
	if s.total > 0 {
		for i := s.head; i > s.head-k; i-- {
			if s.counts[floorMod(i, k)] != 0 {
				res.ResetAfter = (i+k)*w - now
				break
			}
		}
	}
	return res
}

// Refill implements Bucket: it takes up to min(permits, g.Permits) off the
// sub-window of g.IssuedAt while that sub-window is still counted, never
// more than it holds.
func (s *slidingWindow) Refill(c *Config, now int64, g Grant, permits int64) int64 {
	_, w, k := s.advance(c, now)
	i := floorDiv(g.IssuedAt, w)
	if i > s.head || i <= s.head-k {
		return 0
	}
	slot := floorMod(i, k)
	j := max(0, min(permits, g.Permits, s.counts[slot]))
	s.counts[slot] -= j
	s.total -= j
	return j
}

// Renew implements Bucket; windows hold no leases.
func (s *slidingWindow) Renew(*Config, int64, Grant) bool { return false }

// Reconfigure implements Bucket: counts are kept and judged against the new
// Limit. When SampleCount or Period change, the sub-windows no longer line
// up, so the ring restarts with the whole current total in the current
// sub-window: nothing admitted is forgotten, at the price of counting it up
// to a Period longer than before.
func (s *slidingWindow) Reconfigure(old, cfg *Config, now int64) {
	now, _, _ = s.advance(old, now)
	if old.Period == cfg.Period && old.Samples() == cfg.Samples() {
		return
	}
	total := s.total
	k := cfg.Samples()
	if int64(cap(s.counts)) >= k {
		s.counts = s.counts[:k]
		clear(s.counts)
	} else {
		s.counts = make([]int64, k)
	}
	s.head = floorDiv(now, cfg.Period/k)
	s.counts[floorMod(s.head, k)] = total
	s.total = total
}

// Idle implements Bucket: no counted sub-window holds a permit.
func (s *slidingWindow) Idle(c *Config, now int64) bool {
	if s.total == 0 {
		return true
	}
	k := c.Samples()
	if int64(len(s.counts)) != k {
		return false
	}
	cur := floorDiv(max(now, s.last), c.Period/k)
	for i := max(s.head-k+1, cur-k+1); i <= s.head; i++ {
		if s.counts[floorMod(i, k)] != 0 {
			return false
		}
	}
	return true
}
