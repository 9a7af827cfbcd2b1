package bucket

// leakyBucket is a LeakyBucket bucket: 16 bytes, no pointers.
//
// Permits leave one every interval = Period/Limit (integer nanoseconds); next
// is the earliest time the next permit may leave. A request of n permits
// (at most Capacity) starting at start = max(next, now) is admitted when
// start-now <= MaxWait (without MaxWait: only when next <= now) and moves
// next to start + n*interval; WaitBefore is start-now. Nothing accumulates
// while idle, so back-to-back requests are spaced exactly n*interval apart:
// the output is smooth, never bursty. Partial only cuts a request above
// Capacity down to Capacity.
type leakyBucket struct {
	next int64 // earliest time the next permit may leave
	last int64 // latest now seen
}

func newLeakyBucket(_ *Config, now int64) *leakyBucket {
	return &leakyBucket{next: now, last: now}
}

// Acquire implements Bucket.
func (b *leakyBucket) Acquire(c *Config, now int64, r Request) Result {
	now = max(now, b.last)
	b.last = now
	n, ok := effective(r, c.Capacity())
	if !ok {
		return b.result(c, now, Result{})
	}
	wait := max(b.next, now) - now
	maxWait := max(r.MaxWait, 0)
	if wait > maxWait {
		return b.result(c, now, Result{RetryAfter: wait - maxWait})
	}
	res := Result{Allowed: true, Granted: n}
	if n > 0 {
		b.next = addSat(now+wait, mulSat(n, c.Period/c.Limit))
		res.WaitBefore = wait
	}
	return b.result(c, now, res)
}

// result fills in Remaining (Capacity while no permit is queued, else 0) and
// ResetAfter.
func (b *leakyBucket) result(c *Config, now int64, res Result) Result {
	if b.next <= now {
		res.Remaining = c.Capacity()
	}
	res.ResetAfter = max(0, b.next-now)
	return res
}

// Refill implements Bucket: it gives back up to min(permits, g.Permits)
// slots that are still in the future, moving next back by whole intervals,
// never before max(now, g.IssuedAt).
func (b *leakyBucket) Refill(c *Config, now int64, g Grant, permits int64) int64 {
	now = max(now, b.last)
	b.last = now
	k := min(permits, g.Permits)
	floor := max(now, g.IssuedAt)
	if k <= 0 || b.next <= floor {
		return 0
	}
	interval := c.Period / c.Limit
	j := k
	if queued := b.next - floor; mulSat(k, interval) > queued {
		j = queued / interval
	}
	b.next -= j * interval
	return j
}

// Renew implements Bucket; leaky buckets hold no leases.
func (b *leakyBucket) Renew(*Config, int64, Grant) bool { return false }

// Reconfigure implements Bucket: the queue is kept but cut to at most one
// full request of the new configuration (now + Capacity*interval).
func (b *leakyBucket) Reconfigure(_, cfg *Config, now int64) {
	now = max(now, b.last)
	b.last = now
	b.next = min(b.next, addSat(now, mulSat(cfg.Capacity(), cfg.Period/cfg.Limit)))
}

// Idle implements Bucket: no permit is queued.
func (b *leakyBucket) Idle(_ *Config, now int64) bool {
	return b.next <= max(now, b.last)
}

// Commit implements Bucket. It is Refill, charge and owed fused, so that
// the interval is divided out once.
func (b *leakyBucket) Commit(c *Config, now int64, g Grant, used int64) (CommitResult, error) {
	giveBack, charge, err := split(g, used)
	if err != nil {
		return CommitResult{}, err
	}
	now = max(now, b.last)
	b.last = now
	interval := c.Period / c.Limit
	var res CommitResult
	if giveBack > 0 { // as Refill
		if queued := b.next - max(now, g.IssuedAt); queued > 0 {
			j := giveBack
			if mulSat(j, interval) > queued {
				j = queued / interval
			}
			b.next -= j * interval
			res.Returned = j
		}
	} else if charge > 0 { // as charge
		b.next = min(addSat(max(b.next, now), mulSat(charge, interval)), addSat(now, maxDur))
		res.Debited = charge
	}
	if ahead := b.next - now; ahead > 0 { // as owed
		res.RetryAfter = ahead
		res.Debt = 1
		if ahead > interval {
			res.Debt = (ahead-1)/interval + 1
		}
	} else {
		res.Remaining = c.Capacity()
	}
	return res, nil
}

// Debit implements Bucket.
func (b *leakyBucket) Debit(c *Config, now int64, n int64) (CommitResult, error) {
	if n < 0 {
		return CommitResult{}, negativeUsage("debit", n)
	}
	if n > 0 {
		b.charge(c, now, n)
	}
	res := b.owed(c, now)
	res.Debited = n
	return res, nil
}

// charge queues n more slots after the last one (or now).
func (b *leakyBucket) charge(c *Config, now, n int64) {
	now = max(now, b.last)
	b.last = now
	b.next = min(addSat(max(b.next, now), mulSat(n, c.Period/c.Limit)), addSat(now, maxDur))
}

func (b *leakyBucket) owed(c *Config, now int64) CommitResult {
	now = max(now, b.last)
	b.last = now
	var res CommitResult
	if ahead := b.next - now; ahead > 0 {
		res.RetryAfter = ahead
		res.Debt = 1
		if interval := c.Period / c.Limit; ahead > interval {
			res.Debt = (ahead-1)/interval + 1
		}
	} else {
		res.Remaining = c.Capacity()
	}
	return res
}
