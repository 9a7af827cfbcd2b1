package bucket

// lease is permits held by the lease id until expires.
type lease struct {
	id      uint64
	permits int64
	expires int64
}

// concurrency is a Concurrency bucket: the leases in flight, at most Limit
// permits at once, each lease living Period from its grant or last renewal.
// Leases are kept ordered by expiry (a new or renewed lease expires last),
// so expired ones are dropped from the front and RetryAfter is exact: the
// time until enough leases expire for the request to fit. Memory is 24 bytes
// per live lease, at most Limit leases. Partial only cuts a request above
// Limit down to Limit.
type concurrency struct {
	leases []lease // ordered by expires
	total  int64   // sum of the leases' permits
	last   int64   // latest now seen
}

func newConcurrency(_ *Config, now int64) *concurrency {
	return &concurrency{last: now}
}

// prune drops the leases expired at now (clamped to the latest now seen)
// and returns the effective now.
func (q *concurrency) prune(now int64) int64 {
	now = max(now, q.last)
	q.last = now
	k := 0
	for k < len(q.leases) && q.leases[k].expires <= now {
		q.total -= q.leases[k].permits
		k++
	}
	if k > 0 {
		q.leases = q.leases[:copy(q.leases, q.leases[k:])]
	}
	return now
}

// find returns the index of the live lease id, or -1.
func (q *concurrency) find(id uint64) int {
	for i := range q.leases {
		if q.leases[i].id == id {
			return i
		}
	}
	return -1
}

// remove deletes lease i, keeping the order.
func (q *concurrency) remove(i int) {
	q.leases = q.leases[:i+copy(q.leases[i:], q.leases[i+1:])]
}

// Acquire implements Bucket: a grant creates lease r.LeaseID.
func (q *concurrency) Acquire(c *Config, now int64, r Request) Result {
	now = q.prune(now)
	n, ok := effective(r, c.Limit)
	if !ok {
		return q.result(c, now, Result{})
	}
	if q.total+max(n, 1) <= c.Limit {
		if n > 0 {
			if len(q.leases) == cap(q.leases) { // grow up to Limit leases, no more
				grown := make([]lease, len(q.leases), max(min(max(1, 2*cap(q.leases)), int(min(c.Limit, MaxConcurrencyLimit))), len(q.leases)+1))
				copy(grown, q.leases)
				q.leases = grown
			}
			q.leases = append(q.leases, lease{id: r.LeaseID, permits: n, expires: addSat(now, c.Period)})
			q.total += n
		}
		return q.result(c, now, Result{Allowed: true, Granted: n})
	}
	excess := q.total + max(n, 1) - c.Limit
	var freed int64
	for _, l := range q.leases {
		if freed += l.permits; freed >= excess {
			return q.result(c, now, Result{RetryAfter: l.expires - now})
		}
	}
	return q.result(c, now, Result{}) // unreachable: n <= Limit
}

func (q *concurrency) result(c *Config, now int64, res Result) Result {
	res.Remaining = max(0, c.Limit-q.total)
	if len(q.leases) > 0 {
		res.ResetAfter = q.leases[len(q.leases)-1].expires - now
	}
	return res
}

// Refill implements Bucket: it releases min(permits, lease permits) of the
// live lease g.LeaseID, ending the lease when nothing is left, and returns
// what it released (0 if the lease expired).
func (q *concurrency) Refill(_ *Config, now int64, g Grant, permits int64) int64 {
	q.prune(now)
	i := q.find(g.LeaseID)
	if i < 0 || permits <= 0 {
		return 0
	}
	l := &q.leases[i]
	j := min(permits, l.permits)
	l.permits -= j
	q.total -= j
	if l.permits == 0 {
		q.remove(i)
	}
	return j
}

// Renew implements Bucket: a live lease g.LeaseID now expires at
// now+Period.
func (q *concurrency) Renew(c *Config, now int64, g Grant) bool {
	now = q.prune(now)
	i := q.find(g.LeaseID)
	if i < 0 {
		return false
	}
	l := q.leases[i]
	l.expires = addSat(now, c.Period)
	q.remove(i)
	q.leases = append(q.leases, l)
	return true
}

// Reconfigure implements Bucket: leases are kept and judged against the new
// Limit; none outlives now plus the new Period (which keeps them ordered).
func (q *concurrency) Reconfigure(_, cfg *Config, now int64) {
	now = q.prune(now)
	end := addSat(now, cfg.Period)
	for i := range q.leases {
		q.leases[i].expires = min(q.leases[i].expires, end)
	}
}

// Idle implements Bucket: no lease is live.
func (q *concurrency) Idle(_ *Config, now int64) bool {
	n := len(q.leases)
	return n == 0 || q.leases[n-1].expires <= max(now, q.last)
}

// Commit implements Bucket: leases have no cost to settle (ErrNoCommit);
// Refill ends a lease.
func (q *concurrency) Commit(*Config, int64, Grant, int64) (CommitResult, error) {
	return noCommit(Concurrency)
}

// Debit implements Bucket: ErrNoCommit, as Commit.
func (q *concurrency) Debit(*Config, int64, int64) (CommitResult, error) {
	return noCommit(Concurrency)
}
