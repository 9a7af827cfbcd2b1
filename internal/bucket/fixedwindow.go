package bucket

// fixedWindow is a FixedWindow bucket: 24 bytes, no pointers.
//
// Windows are the Period-aligned intervals [i*Period, (i+1)*Period) of the
// absolute now; count is what window i admitted, and a request fits while
// count+n <= Limit. Up to 2*Limit can pass within one Period across a
// boundary: Limit at the end of one window and Limit at the start of the
// next.
type fixedWindow struct {
	window int64 // index of the window count belongs to
	count  int64 // permits admitted in window
	last   int64 // latest now seen
}

func newFixedWindow(c *Config, now int64) *fixedWindow {
	return &fixedWindow{window: floorDiv(now, c.Period), last: now}
}

// advance moves to the window of now (clamped to the latest now seen) and
// returns the effective now.
func (f *fixedWindow) advance(c *Config, now int64) int64 {
	now = max(now, f.last)
	f.last = now
	if w := floorDiv(now, c.Period); w != f.window {
		f.window, f.count = w, 0
	}
	return now
}

// Acquire implements Bucket.
func (f *fixedWindow) Acquire(c *Config, now int64, r Request) Result {
	now = f.advance(c, now)
	n := r.Permits
	free := c.Limit - f.count
	switch {
	case max(n, 1) <= free:
		f.count += n
		return f.result(c, now, Result{Allowed: true, Granted: n})
	case r.Partial && n > 0 && free >= 1:
		f.count += free
		return f.result(c, now, Result{Allowed: true, Granted: free})
	case n > c.Limit && !r.Partial:
		return f.result(c, now, Result{}) // can never be granted
	}
	return f.result(c, now, Result{RetryAfter: f.end(c) - now})
}

// end is when the current window ends.
func (f *fixedWindow) end(c *Config) int64 { return addSat(mulSat(f.window, c.Period), c.Period) }

func (f *fixedWindow) result(c *Config, now int64, res Result) Result {
	res.Remaining = max(0, c.Limit-f.count)
	if f.count > 0 {
		res.ResetAfter = f.end(c) - now
	}
	return res
}

// Refill implements Bucket: only a grant of the current window gives back,
// at most min(permits, g.Permits, count).
func (f *fixedWindow) Refill(c *Config, now int64, g Grant, permits int64) int64 {
	f.advance(c, now)
	if floorDiv(g.IssuedAt, c.Period) != f.window {
		return 0
	}
	j := max(0, min(permits, g.Permits, f.count))
	f.count -= j
	return j
}

// Renew implements Bucket; windows hold no leases.
func (f *fixedWindow) Renew(*Config, int64, Grant) bool { return false }

// Reconfigure implements Bucket: the count is kept and judged against the
// new Limit. When the Period changes, a count of the still-current old
// window moves to the current new window (conservatively: it may then count
// a little longer than it would have).
func (f *fixedWindow) Reconfigure(old, cfg *Config, now int64) {
	now = max(now, f.last)
	f.last = now
	if old.Period == cfg.Period {
		return
	}
	if floorDiv(now, old.Period) != f.window {
		f.count = 0
	}
	f.window = floorDiv(now, cfg.Period)
}

// Idle implements Bucket: the current window has admitted nothing.
func (f *fixedWindow) Idle(c *Config, now int64) bool {
	return f.count == 0 || floorDiv(max(now, f.last), c.Period) != f.window
}
