package bucket

// fixedWindow is a FixedWindow bucket: 24 bytes, no pointers.
//
// Windows are the Period-aligned intervals [i*Period, (i+1)*Period) of the
// absolute now; count is what window i admitted, and a request fits while
// count+n <= Limit. Up to 2*Limit can pass within one Period across a
// boundary: Limit at the end of one window and Limit at the start of the
// next.
//
// With Config.Calendar the windows are local days, ISO weeks or months
// (calendar.go) and window holds the end of the current window in Unix
// nanoseconds instead of its index, so that a decision inside a window does
// no calendar arithmetic.
//
// Debt: Commit and Debit may take the count above Limit; count is then
// stored negated, which marks it as owed. What such a window holds above
// Limit is carried into the next window: after k boundaries it holds
// max(0, held-k*Limit), so each boundary repays Limit and a window that
// starts with a carried count admits only what is left of its Limit. A
// count above a Limit lowered by Reconfigure is not debt: it stays positive
// and is forgotten at the boundary, as before commits existed.
type fixedWindow struct {
	window int64 // index of the window count belongs to; calendar: its end
	count  int64 // permits charged to window; negated when in debt
	last   int64 // latest now seen
}

// held is what the current window holds, debt included.
func (f *fixedWindow) held() int64 {
	if f.count < 0 {
		return -f.count
	}
	return f.count
}

// owe stores v permits held, in debt when above Limit.
func (f *fixedWindow) owe(c *Config, v int64) {
	if v > c.Limit {
		f.count = -v
	} else {
		f.count = v
	}
}

func newFixedWindow(c *Config, now int64) *fixedWindow {
	f := &fixedWindow{last: now}
	f.window = f.windowOf(c, now)
	return f
}

// windowOf is the window field for a fresh window holding now.
func (f *fixedWindow) windowOf(c *Config, now int64) int64 {
	if c.Calendar != CalendarNone {
		_, end := calWindow(c, now, calIndex(c, now))
		return end
	}
	return floorDiv(now, c.Period)
}

// carry moves the count k >= 1 window boundaries on: debt is carried,
// anything else forgotten.
func (f *fixedWindow) carry(c *Config, k int64) {
	if f.count < 0 {
		f.owe(c, max(0, -f.count-mulSat(k, c.Limit)))
	} else {
		f.count = 0
	}
}

// advance moves to the window of now (clamped to the latest now seen),
// carrying debt, and returns the effective now. A window change is out of
// line, so that the common case inlines.
func (f *fixedWindow) advance(c *Config, now int64) int64 {
	now = max(now, f.last)
	f.last = now
	if !f.holds(c, now) {
		f.roll(c, now)
	}
	return now
}

// holds reports whether now is in the current window.
func (f *fixedWindow) holds(c *Config, now int64) bool {
	if c.Calendar != CalendarNone {
		return now < f.window
	}
	return floorDiv(now, c.Period) == f.window
}

// roll moves to the window of now, past the current one.
//
//go:noinline
func (f *fixedWindow) roll(c *Config, now int64) {
	if c.Calendar != CalendarNone {
		cur := calIndex(c, f.window-1)
		i, end := calWindow(c, now, cur+1)
		f.carry(c, i-cur)
		f.window = end
		return
	}
	w := floorDiv(now, c.Period)
	f.carry(c, max(1, w-f.window))
	f.window = w
}

// Acquire implements Bucket.
func (f *fixedWindow) Acquire(c *Config, now int64, r Request) Result {
	// advance, by hand: it does not inline, and this is the hot path.
	now = max(now, f.last)
	f.last = now
	if !f.holds(c, now) {
		f.roll(c, now)
	}
	n := r.Permits
	free := c.Limit - f.held()
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
	need := max(n, 1)
	if r.Partial {
		need = 1
	}
	return f.result(c, now, Result{RetryAfter: f.until(c, now, f.held()+need-c.Limit)})
}

// until is how long from now until the count has fallen by at least
// excess (> 0): the end of the current window, or in debt of the
// ceil(excess/Limit)-th window from the current one.
func (f *fixedWindow) until(c *Config, now, excess int64) int64 {
	j := int64(1)
	if f.count < 0 {
		j = (excess-1)/c.Limit + 1
	}
	return min(maxDur, f.boundary(c, now, j)-now)
}

// boundary is the end of the j-th window (j >= 1) counting the current
// one as the first.
func (f *fixedWindow) boundary(c *Config, now, j int64) int64 {
	if j == 1 {
		return f.end(c)
	}
	if c.Calendar == CalendarNone {
		return addSat(mulSat(f.window, c.Period), mulSat(j, c.Period))
	}
	if j > calMaxWindows(c) {
		return addSat(now, maxDur)
	}
	return calStart(c, calIndex(c, f.window-1)+j)
}

func (f *fixedWindow) result(c *Config, now int64, res Result) Result {
	if f.count < 0 {
		return f.resultOwing(c, now, res)
	}
	res.Remaining = max(0, c.Limit-f.count)
	if f.count > 0 {
		res.ResetAfter = f.end(c) - now
	}
	return res
}

// end is when the current window ends.
func (f *fixedWindow) end(c *Config) int64 {
	if c.Calendar != CalendarNone {
		return f.window
	}
	return addSat(mulSat(f.window, c.Period), c.Period)
}

// resultOwing is result while there is debt.
//
//go:noinline
func (f *fixedWindow) resultOwing(c *Config, now int64, res Result) Result {
	res.ResetAfter = f.until(c, now, -f.count)
	return res
}

// current reports whether time t is in the current window.
func (f *fixedWindow) current(c *Config, t int64) bool {
	if c.Calendar == CalendarNone {
		return floorDiv(t, c.Period) == f.window
	}
	return t < f.window && calIndex(c, t) >= calIndex(c, f.window-1)
}

// Refill implements Bucket: only a grant of the current window gives back,
// at most min(permits, g.Permits, count).
func (f *fixedWindow) Refill(c *Config, now int64, g Grant, permits int64) int64 {
	f.advance(c, now)
	return f.giveBack(c, g, permits)
}

// giveBack is Refill once in the window of now.
func (f *fixedWindow) giveBack(c *Config, g Grant, permits int64) int64 {
	if !f.current(c, g.IssuedAt) {
		return 0
	}
	j := max(0, min(permits, g.Permits, f.held()))
	if f.count < 0 {
		f.owe(c, -f.count-j)
	} else {
		f.count -= j
	}
	return j
}

// Renew implements Bucket; windows hold no leases.
func (f *fixedWindow) Renew(*Config, int64, Grant) bool { return false }

// Reconfigure implements Bucket: the count is kept and judged against the
// new Limit; debt stays debt while above the new Limit. When
// the windows change (Period, Calendar or Location), a count of the
// still-current old window, and debt carried so far, moves to the current
// new window (conservatively: it may then count a little longer than it
// would have).
func (f *fixedWindow) Reconfigure(old, cfg *Config, now int64) {
	now = max(now, f.last)
	f.last = now
	if !sameWindows(old, cfg) {
		f.advance(old, now)
		f.window = f.windowOf(cfg, now)
	}
	if f.count < 0 {
		f.owe(cfg, -f.count)
	}
}

// Idle implements Bucket: the current window holds nothing, debt included.
func (f *fixedWindow) Idle(c *Config, now int64) bool {
	if f.count == 0 {
		return true
	}
	x := *f
	x.advance(c, now)
	return x.count == 0
}

// Commit implements Bucket: Refill, charge and owed with one advance.
func (f *fixedWindow) Commit(c *Config, now int64, g Grant, used int64) (CommitResult, error) {
	giveBack, charge, err := split(g, used)
	if err != nil {
		return CommitResult{}, err
	}
	now = f.advance(c, now)
	var returned int64
	if giveBack > 0 {
		returned = f.giveBack(c, g, giveBack)
	} else if charge > 0 {
		f.owe(c, addSat(f.held(), charge))
	}
	res := f.answer(c, now)
	res.Returned, res.Debited = returned, charge
	return res, nil
}

// Debit implements Bucket.
func (f *fixedWindow) Debit(c *Config, now int64, n int64) (CommitResult, error) {
	if n < 0 {
		return CommitResult{}, negativeUsage("debit", n)
	}
	now = f.advance(c, now)
	f.owe(c, addSat(f.held(), n))
	res := f.answer(c, now)
	res.Debited = n
	return res, nil
}

// answer is a CommitResult in the window of now.
func (f *fixedWindow) answer(c *Config, now int64) CommitResult {
	res := CommitResult{Remaining: max(0, c.Limit-f.held())}
	if f.count < 0 {
		res.Debt = -f.count - c.Limit
	}
	if f.held() >= c.Limit {
		res.RetryAfter = f.until(c, now, f.held()+1-c.Limit)
	}
	return res
}
