package bucket

import "sort"

// logEntry is count permits admitted at time t.
type logEntry struct {
	t     int64
	count int64
}

// slidingLog is a SlidingLog bucket: an exact log of admitted permits. An
// entry at time t counts while now < t+Period, and a request of n fits while
// the counted permits plus n are at most Limit, so no interval of length
// Period ever admits more than Limit (FuzzSlidingLog checks this against a
// brute-force count). Entries at the same time merge, so the log never holds
// more than Limit entries; it is a ring buffer that grows on demand up to
// that many (16 bytes each) and allocates nothing once grown. Partial only
// cuts a request above Limit down to Limit.
type slidingLog struct {
	buf   []logEntry // ring; entries in increasing t from head
	head  int        // index of the oldest entry
	size  int        // number of entries
	total int64      // sum of the entries' counts
	last  int64      // latest now seen
}

func newSlidingLog(_ *Config, now int64) *slidingLog {
	return &slidingLog{last: now}
}

// at returns the i-th oldest entry.
func (l *slidingLog) at(i int) *logEntry {
	j := l.head + i
	if j >= len(l.buf) {
		j -= len(l.buf)
	}
	return &l.buf[j]
}

// expire drops entries that stopped counting at now (clamped to the latest
// now seen) and returns the effective now.
func (l *slidingLog) expire(c *Config, now int64) int64 {
	now = max(now, l.last)
	l.last = now
	for l.size > 0 {
		e := &l.buf[l.head]
		if now-e.t < c.Period {
			break
		}
		l.total -= e.count
		l.head++
		if l.head == len(l.buf) {
			l.head = 0
		}
		l.size--
	}
	if l.size == 0 {
		l.head = 0
	}
	return now
}

// push logs n permits at now (>= every logged time).
func (l *slidingLog) push(c *Config, now, n int64) {
	l.total += n
	if l.size > 0 {
		if e := l.at(l.size - 1); e.t == now {
			e.count += n
			return
		}
	}
	if l.size == len(l.buf) {
		l.grow(c)
	}
	*l.at(l.size) = logEntry{t: now, count: n}
	l.size++
}

// grow doubles the ring (from one entry: a key seen once costs 16 bytes),
// up to Limit entries (at least one more).
func (l *slidingLog) grow(c *Config) {
	n := min(max(1, 2*len(l.buf)), int(min(c.Limit, MaxLogLimit)))
	n = max(n, l.size+1)
	buf := make([]logEntry, n)
	for i := range l.size {
		buf[i] = *l.at(i)
	}
	l.buf, l.head = buf, 0
}

// Acquire implements Bucket.
func (l *slidingLog) Acquire(c *Config, now int64, r Request) Result {
	now = l.expire(c, now)
	n, ok := effective(r, c.Limit)
	if !ok {
		return l.result(c, now, Result{})
	}
	if l.total+max(n, 1) <= c.Limit {
		if n > 0 {
			l.push(c, now, n)
		}
		return l.result(c, now, Result{Allowed: true, Granted: n})
	}
	excess := l.total + max(n, 1) - c.Limit
	var freed int64
	for i := range l.size {
		e := l.at(i)
		if freed += e.count; freed >= excess {
			return l.result(c, now, Result{RetryAfter: e.t + c.Period - now})
		}
	}
	return l.result(c, now, Result{}) // unreachable: n <= Limit
}

func (l *slidingLog) result(c *Config, now int64, res Result) Result {
	res.Remaining = max(0, c.Limit-l.total)
	if l.size > 0 {
		res.ResetAfter = l.at(l.size-1).t + c.Period - now
	}
	return res
}

// Refill implements Bucket: it takes up to min(permits, g.Permits) off the
// entry logged at g.IssuedAt while it still counts.
func (l *slidingLog) Refill(c *Config, now int64, g Grant, permits int64) int64 {
	l.expire(c, now)
	i := sort.Search(l.size, func(i int) bool { return l.at(i).t >= g.IssuedAt })
	if i == l.size || l.at(i).t != g.IssuedAt {
		return 0
	}
	e := l.at(i)
	j := max(0, min(permits, g.Permits, e.count))
	e.count -= j
	l.total -= j
	if e.count == 0 { // remove it, so that entries stay at most Limit
		for ; i < l.size-1; i++ {
			*l.at(i) = *l.at(i + 1)
		}
		l.size--
	}
	return j
}

// Renew implements Bucket; logs hold no leases.
func (l *slidingLog) Renew(*Config, int64, Grant) bool { return false }

// Reconfigure implements Bucket: the log is kept; entries expire by the new
// Period and admission uses the new Limit (a lower Limit admits nothing
// until enough entries expire).
func (l *slidingLog) Reconfigure(_, cfg *Config, now int64) {
	l.expire(cfg, now)
}

// Idle implements Bucket: every entry has expired.
func (l *slidingLog) Idle(c *Config, now int64) bool {
	return l.size == 0 || max(now, l.last)-l.at(l.size-1).t >= c.Period
}

// Commit implements Bucket: a log takes no commits (ErrNoCommit), since it
// holds at most Limit entries and could not record debt.
func (l *slidingLog) Commit(*Config, int64, Grant, int64) (CommitResult, error) {
	return noCommit(SlidingLog)
}

// Debit implements Bucket: ErrNoCommit, as Commit.
func (l *slidingLog) Debit(*Config, int64, int64) (CommitResult, error) {
	return noCommit(SlidingLog)
}
