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
//
// Debt: Commit and Debit charge the current sub-window up to Limit in all
// and keep the rest as debt. While there is debt, every sub-window that
// leaves the count is charged again, up to the debt, in the sub-window that
// replaces it (the same slot of the ring), so the window stays full and the
// debt shrinks by what leaves: Limit per Period. Since the ring then
// repeats itself, how long the debt lasts has a closed form (leaveIn).
type slidingWindow struct {
	counts []int64 // counts[i mod K] is sub-window i, for i in (head-K, head], head = floor(last/w)
	debt   int64   // permits charged that did not fit in the window
	total  int64   // sum of counts
	last   int64   // latest now seen
}

func newSlidingWindow(c *Config, now int64) *slidingWindow {
	return &slidingWindow{counts: make([]int64, c.Samples()), last: now}
}

// advance rolls the ring to the sub-window of now (clamped to the latest
// now seen), dropping sub-windows that left the count and charging debt
// into the new ones, and returns the effective now, the newest sub-window,
// the sub-window width and K.
func (s *slidingWindow) advance(c *Config, now int64) (int64, int64, int64, int64) {
	k := c.Samples()
	w := c.Period / k
	now = max(now, s.last)
	cur := floorDiv(now, w)
	head := cur // the sub-window of last: now's, unless last is before it
	if s.last < cur*w {
		head = floorDiv(s.last, w)
	}
	s.last = now
	if int64(len(s.counts)) != k { // Reconfigure was skipped; start over
		debt, total := s.debt, s.total
		*s = *newSlidingWindow(c, now)
		s.debt = addSat(debt, total)
		s.settle(c, k, cur)
		head = cur
	}
	if cur <= head {
		return now, cur, w, k
	}
	steps := cur - head
	if s.debt > 0 && steps >= k && s.total > 0 && s.debt >= s.total {
		// Whole rotations while the debt covers the ring leave it as it is.
		r := min(steps/k, s.debt/s.total)
		s.debt -= r * s.total
		steps -= r * k
	}
	for i := int64(1); i <= steps; i++ {
		if s.debt == 0 && steps-i+1 >= k {
			clear(s.counts)
			s.total = 0
			break
		}
		slot := floorMod(cur-steps+i, k)
		v := s.counts[slot]
		pay := min(v, s.debt)
		s.counts[slot] = pay
		s.total -= v - pay
		s.debt -= pay
	}
	return now, cur, w, k
}

// settle moves debt into the window while it has room, so that the window
// is full whenever there is debt.
func (s *slidingWindow) settle(c *Config, k, head int64) {
	if s.debt > 0 && s.total < c.Limit {
		fit := min(s.debt, c.Limit-s.total)
		s.counts[floorMod(head, k)] += fit
		s.total += fit
		s.debt -= fit
	}
}

// leaveIn returns how long from now until the permits that left the count
// since head reach target (> 0), counting rotations of the ring while debt
// is charged again: it is then as if the ring repeated itself, each
// rotation taking total away. It saturates at maxDur.
func (s *slidingWindow) leaveIn(now, head, w, k, target int64) int64 {
	var q int64
	if s.debt > 0 && s.total > 0 && target > s.total {
		q = (target - 1) / s.total
		if q > maxDur/(k*w) {
			return maxDur
		}
		target -= q * s.total
	}
	var freed int64
	for i := head - k + 1; i <= head; i++ {
		freed += s.counts[floorMod(i, k)]
		if freed >= target {
			return min(maxDur, (i+q*k+k)*w-now)
		}
	}
	return 0 // unreachable: target <= total without debt
}

// until is how long from now until a request of need permits fits.
func (s *slidingWindow) until(c *Config, now, head, w, k, need int64) int64 {
	target := s.total + need - c.Limit
	if s.debt > 0 {
		target = addSat(s.debt, max(0, target))
	}
	return s.leaveIn(now, head, w, k, target)
}

// Acquire implements Bucket.
func (s *slidingWindow) Acquire(c *Config, now int64, r Request) Result {
	now, head, w, k := s.advance(c, now)
	if s.debt > 0 {
		return s.owing(c, now, head, w, k, r)
	}
	n := r.Permits
	free := c.Limit - s.total
	slot := floorMod(head, k)
	switch {
	case max(n, 1) <= free:
		s.counts[slot] += n
		s.total += n
		return s.result(now, head, w, k, c, Result{Allowed: true, Granted: n})
	case r.Partial && n > 0 && free >= 1:
		s.counts[slot] += free
		s.total += free
		return s.result(now, head, w, k, c, Result{Allowed: true, Granted: free})
	case n > c.Limit && !r.Partial:
		return s.result(now, head, w, k, c, Result{}) // can never be granted
	}
	need := max(n, 1)
	if r.Partial {
		need = 1
	}
	// Walk from the oldest sub-window until enough has left the count.
	excess := s.total + need - c.Limit
	var freed int64
	for i := head - k + 1; i <= head; i++ {
		freed += s.counts[floorMod(i, k)]
		if freed >= excess {
			return s.result(now, head, w, k, c, Result{RetryAfter: (i+k)*w - now})
		}
	}
	return s.result(now, head, w, k, c, Result{}) // unreachable while total <= Limit
}

// owing is Acquire while there is debt: denied, until the debt and then
// enough of the window have left the count.
func (s *slidingWindow) owing(c *Config, now, head, w, k int64, r Request) Result {
	res := Result{ResetAfter: s.leaveIn(now, head, w, k, addSat(s.debt, s.total))}
	if r.Permits > c.Limit && !r.Partial {
		return res // can never be granted
	}
	need := max(r.Permits, 1)
	if r.Partial {
		need = 1
	}
	res.RetryAfter = s.until(c, now, head, w, k, need)
	return res
}

// result fills in Remaining and ResetAfter while there is no debt.
func (s *slidingWindow) result(now, head, w, k int64, c *Config, res Result) Result {
	res.Remaining = max(0, c.Limit-s.total)
	if s.total > 0 {
		for i := head; i > head-k; i-- {
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
// more than it holds. While there is debt, what goes back repays the debt
// instead.
func (s *slidingWindow) Refill(c *Config, now int64, g Grant, permits int64) int64 {
	_, head, w, k := s.advance(c, now)
	return s.giveBack(head, w, k, g, permits)
}

// giveBack is Refill once the ring is at head.
func (s *slidingWindow) giveBack(head, w, k int64, g Grant, permits int64) int64 {
	i := floorDiv(g.IssuedAt, w)
	if i > head || i <= head-k {
		return 0
	}
	slot := floorMod(i, k)
	j := max(0, min(permits, g.Permits, s.counts[slot]))
	paid := min(j, s.debt)
	s.debt -= paid
	s.counts[slot] -= j - paid
	s.total -= j - paid
	return j
}

// Renew implements Bucket; windows hold no leases.
func (s *slidingWindow) Renew(*Config, int64, Grant) bool { return false }

// Reconfigure implements Bucket: counts are kept and judged against the new
// Limit. When SampleCount or Period change, the sub-windows no longer line
// up, so the ring restarts with the whole current total in the current
// sub-window: nothing admitted is forgotten, at the price of counting it up
// to a Period longer than before. Debt is kept, and moves into the window
// where a larger Limit makes room.
func (s *slidingWindow) Reconfigure(old, cfg *Config, now int64) {
	now, _, _, _ = s.advance(old, now)
	k := cfg.Samples()
	head := floorDiv(now, cfg.Period/k)
	if old.Period == cfg.Period && old.Samples() == cfg.Samples() {
		s.settle(cfg, k, head)
		return
	}
	total := s.total
	if int64(cap(s.counts)) >= k {
		s.counts = s.counts[:k]
		clear(s.counts)
	} else {
		s.counts = make([]int64, k)
	}
	s.counts[floorMod(head, k)] = total
	s.total = total
	s.settle(cfg, k, head)
}

// Idle implements Bucket: no counted sub-window holds a permit and nothing
// is owed.
func (s *slidingWindow) Idle(c *Config, now int64) bool {
	if s.total == 0 && s.debt == 0 {
		return true
	}
	k := c.Samples()
	if int64(len(s.counts)) != k {
		return false
	}
	w := c.Period / k
	head := floorDiv(s.last, w)
	if s.debt > 0 {
		return max(now, s.last)-s.last >= s.leaveIn(s.last, head, w, k, addSat(s.debt, s.total))
	}
	cur := floorDiv(max(now, s.last), w)
	for i := max(head-k+1, cur-k+1); i <= head; i++ {
		if s.counts[floorMod(i, k)] != 0 {
			return false
		}
	}
	return true
}

// Commit implements Bucket: Refill, charge and owed with one advance.
func (s *slidingWindow) Commit(c *Config, now int64, g Grant, used int64) (CommitResult, error) {
	giveBack, charge, err := split(g, used)
	if err != nil {
		return CommitResult{}, err
	}
	now, head, w, k := s.advance(c, now)
	var returned int64
	if giveBack > 0 {
		returned = s.giveBack(head, w, k, g, giveBack)
	} else if charge > 0 {
		s.debt = addSat(s.debt, charge)
		s.settle(c, k, head)
	}
	res := CommitResult{Returned: returned, Debited: charge}
	s.answer(&res, c, now, head, w, k)
	return res, nil
}

// Debit implements Bucket.
func (s *slidingWindow) Debit(c *Config, now int64, n int64) (CommitResult, error) {
	if n < 0 {
		return CommitResult{}, negativeUsage("debit", n)
	}
	now, head, w, k := s.advance(c, now)
	s.debt = addSat(s.debt, n)
	s.settle(c, k, head)
	res := CommitResult{Debited: n}
	s.answer(&res, c, now, head, w, k)
	return res, nil
}

// answer fills in res's state for the ring at head.
func (s *slidingWindow) answer(res *CommitResult, c *Config, now, head, w, k int64) {
	res.Debt = s.debt
	switch {
	case s.debt > 0:
		res.RetryAfter = s.until(c, now, head, w, k, 1)
	case s.total < c.Limit:
		res.Remaining = c.Limit - s.total
	default:
		res.RetryAfter = s.until(c, now, head, w, k, 1)
	}
}
