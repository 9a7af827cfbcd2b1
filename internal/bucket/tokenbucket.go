package bucket

import "math"

// tokenEps absorbs floating-point noise when tokens are compared with whole
// permits (a refill of 0.1 ten times may sum to 0.9999999999999999): at most
// 1e-9 tokens, and under what refills in a quarter of a nanosecond, so that
// it never moves an answer by a whole nanosecond.
func tokenEps(c *Config) float64 {
	return min(1e-9, 0.25*float64(c.Limit)/float64(c.Period))
}

// tokenBucket is a TokenBucket bucket: 24 bytes, no pointers.
//
// Without warm-up it holds tokens as of `last` and refills continuously at
// Limit/Period up to Capacity; it starts full. A grant is all-or-nothing
// unless Partial, which takes floor(tokens) when at least one is there. With
// MaxWait, tokens may go negative down to what refills within MaxWait (a
// reservation, as Guava's acquire); the Result's WaitBefore is the time until
// the balance is back at 0, and later requests queue behind the debt. A
// Partial request first tries the whole request (with its MaxWait); failing
// that it takes what is there now, without waiting. A peek (Permits 0)
// answers whether one permit would pass (with the same MaxWait).
//
// With Warmup it is Guava's SmoothWarmingUp with cold factor 3: tokens holds
// storedPermits and next the next free ticket time. A cold key (storedPermits
// at maxPermits) is admitted at a third of the rate, and sustained load
// spends stored permits until, after about Warmup, the full rate applies;
// idleness stores permits again (cooling down). As in Guava a request is
// served as soon as the previous one has been paid for (next <= now) and
// pushes next by its own cost, so there are no bursts. A warm-up bucket
// never reserves: MaxWait is ignored and a request that cannot be served now
// is denied with RetryAfter = next-now.
type tokenBucket struct {
	// tokens available at last; negative when reserved ahead. With warm-up:
	// Guava's storedPermits.
	tokens float64
	// last is the latest now seen; without warm-up also when tokens was
	// computed.
	last int64
	// next is Guava's nextFreeTicket (warm-up only).
	next int64
}

func newTokenBucket(c *Config, now int64) *tokenBucket {
	if c.Warmup > 0 {
		return &tokenBucket{tokens: warmupOf(c).maxPermits, last: now, next: now}
	}
	return &tokenBucket{tokens: float64(c.Capacity()), last: now}
}

// refillIn is the number of tokens that refill in d nanoseconds.
// Multiplying first keeps it exact for round configurations.
func refillIn(c *Config, d int64) float64 {
	return float64(d) * float64(c.Limit) / float64(c.Period)
}

// timeFor estimates the nanoseconds needed to refill tokens.
func timeFor(c *Config, tokens float64) int64 {
	return ceilNs(tokens * float64(c.Period) / float64(c.Limit))
}

// advance brings tokens to now (clamped to the latest now seen) and returns
// the effective now.
func (b *tokenBucket) advance(c *Config, now int64) int64 {
	if now <= b.last {
		return b.last
	}
	b.tokens = min(float64(c.Capacity()), b.tokens+refillIn(c, now-b.last))
	b.last = now
	return now
}

// Acquire implements Bucket.
func (b *tokenBucket) Acquire(c *Config, now int64, r Request) Result {
	if c.Warmup > 0 {
		return b.acquireWarm(c, now, r)
	}
	b.advance(c, now)
	eps := tokenEps(c)
	capacity := c.Capacity()
	fcap := float64(capacity)
	cur := b.tokens
	var debt float64 // tokens that may be borrowed: what refills within MaxWait
	if r.MaxWait > 0 {
		debt = refillIn(c, r.MaxWait)
	}
	n := r.Permits
	want := max(n, 1) // a peek asks about one permit
	fits := want <= capacity
	if fits && cur-float64(want) >= -debt-eps {
		if n == 0 {
			return b.result(c, Result{Allowed: true})
		}
		b.tokens = cur - float64(n)
		res := Result{Allowed: true, Granted: n}
		if t := b.tokens; t < -eps {
			// Acceptance tolerated tokenEps, so clamp the wait to MaxWait.
			res.WaitBefore = min(r.MaxWait, minTrue(timeFor(c, -t), func(w int64) bool {
				return t+refillIn(c, w) >= -eps
			}))
		}
		return b.result(c, res)
	}
	if r.Partial && n > 0 {
		if g := min(n, int64(math.Floor(cur+eps))); g >= 1 {
			b.tokens = cur - float64(g)
			return b.result(c, Result{Allowed: true, Granted: g})
		}
	}
	var res Result
	if fits || r.Partial {
		partial := r.Partial && n > 0
		guess := int64(maxDur)
		if fits {
			guess = timeFor(c, float64(want)-debt-cur)
		}
		if partial {
			guess = min(guess, timeFor(c, 1-cur))
		}
		res.RetryAfter = minTrue(guess, func(w int64) bool {
			t := min(fcap, cur+refillIn(c, w))
			return (fits && t-float64(want) >= -debt-eps) || (partial && t >= 1-eps)
		})
	}
	return b.result(c, res)
}

// result fills in Remaining and ResetAfter (without warm-up).
func (b *tokenBucket) result(c *Config, res Result) Result {
	t := b.tokens
	fcap := float64(c.Capacity())
	eps := tokenEps(c)
	res.Remaining = max(0, min(c.Capacity(), int64(math.Floor(min(max(t, 0)+eps, float64(c.Capacity()))))))
	if t < fcap {
		res.ResetAfter = minTrue(timeFor(c, fcap-t), func(w int64) bool {
			return t+refillIn(c, w) >= fcap
		})
	}
	return res
}

// Refill implements Bucket: it adds back up to min(permits, g.Permits)
// tokens, never above capacity, while now is within one Period of the
// grant, and returns the permits added, to the nearest whole: tokens that
// regrew since the grant can leave a fraction of a permit of room short, and
// that permit still went back.
func (b *tokenBucket) Refill(c *Config, now int64, g Grant, permits int64) int64 {
	k := min(permits, g.Permits)
	if c.Warmup > 0 {
		return b.refillWarm(c, now, g, k)
	}
	now = b.advance(c, now)
	if k <= 0 || now >= addSat(g.IssuedAt, c.Period) {
		return 0
	}
	room := float64(c.Capacity()) - b.tokens
	if room <= 0 {
		return 0
	}
	added := min(float64(k), room)
	b.tokens += added
	return int64(math.Round(added))
}

// Renew implements Bucket; token buckets hold no leases.
func (b *tokenBucket) Renew(*Config, int64, Grant) bool { return false }

// Reconfigure implements Bucket: tokens are kept, clamped to the new
// capacity, and refill at the new rate from now on. Warm-up buckets scale
// their stored permits to the new maxPermits (as Guava's setRate). Turning
// warm-up on or off restarts the bucket in its initial state, since the two
// states do not translate.
func (b *tokenBucket) Reconfigure(old, cfg *Config, now int64) {
	now = max(now, b.last)
	switch {
	case (old.Warmup > 0) != (cfg.Warmup > 0):
		*b = *newTokenBucket(cfg, now)
	case cfg.Warmup > 0:
		b.last = now
		ow, nw := warmupOf(old), warmupOf(cfg)
		b.resync(ow, now)
		b.tokens = min(nw.maxPermits, b.tokens*nw.maxPermits/ow.maxPermits)
		b.next = min(b.next, addSat(now, ceilNs(float64(cfg.Capacity())*nw.cold)))
	default:
		b.advance(old, now)
		b.tokens = min(b.tokens, float64(cfg.Capacity()))
	}
}

// Idle implements Bucket: the bucket is full (with warm-up: fully cold and
// nothing owed).
func (b *tokenBucket) Idle(c *Config, now int64) bool {
	now = max(now, b.last)
	if c.Warmup > 0 {
		w := warmupOf(c)
		stored, next := b.tokens, b.next
		if now > next {
			stored = min(w.maxPermits, stored+float64(now-next)/w.coolDown)
			next = now
		}
		return next <= now && stored >= w.maxPermits
	}
	t := b.tokens
	if now > b.last {
		t = min(float64(c.Capacity()), t+refillIn(c, now-b.last))
	}
	return t >= float64(c.Capacity())
}

// warmup holds Guava SmoothWarmingUp's derived values, in nanoseconds and
// permits.
type warmup struct {
	stable, cold          float64 // intervals between permits when warm and cold
	threshold, maxPermits float64 // stored permits where the ramp starts and ends
	slope                 float64 // interval growth per stored permit above threshold
	coolDown              float64 // nanoseconds to store one permit while idle
}

func warmupOf(c *Config) warmup {
	var w warmup
	period := float64(c.Warmup)
	w.stable = float64(c.Period) / float64(c.Limit)
	w.cold = ColdFactor * w.stable
	w.threshold = 0.5 * period / w.stable
	w.maxPermits = w.threshold + 2*period/(w.stable+w.cold)
	w.slope = (w.cold - w.stable) / (w.maxPermits - w.threshold)
	w.coolDown = period / w.maxPermits
	return w
}

// cost is Guava's storedPermitsToWaitTime plus fresh permits at the stable
// interval: the nanoseconds that taking n permits pushes the next ticket.
func (w warmup) cost(stored, n float64) float64 {
	take := min(n, stored)
	fresh := n - take
	var d float64
	if above := stored - w.threshold; above > 0 {
		a := min(above, take)
		d = a * (2*w.stable + (2*above-a)*w.slope) / 2 // trapezoid under the ramp
		take -= a
	}
	return d + w.stable*(take+fresh)
}

// resync stores the permits earned while idle since next (Guava's resync).
func (b *tokenBucket) resync(w warmup, now int64) {
	if now > b.next {
		b.tokens = min(w.maxPermits, b.tokens+float64(now-b.next)/w.coolDown)
		b.next = now
	}
}

func (b *tokenBucket) acquireWarm(c *Config, now int64, r Request) Result {
	now = max(now, b.last)
	b.last = now
	w := warmupOf(c)
	b.resync(w, now)
	n, ok := effective(r, c.Capacity())
	if !ok {
		return b.resultWarm(c, w, now, Result{})
	}
	if b.next > now {
		return b.resultWarm(c, w, now, Result{RetryAfter: b.next - now})
	}
	if n > 0 {
		fn := float64(n)
		b.next = addSat(now, max(1, ceilNs(w.cost(b.tokens, fn)-1e-6)))
		b.tokens = max(0, b.tokens-fn)
	}
	return b.resultWarm(c, w, now, Result{Allowed: true, Granted: n})
}

// resultWarm fills in Remaining (all or nothing: a warm-up bucket serves any
// request once the previous one is paid for) and ResetAfter (until fully
// cold again).
func (b *tokenBucket) resultWarm(c *Config, w warmup, now int64, res Result) Result {
	if b.next <= now {
		res.Remaining = c.Capacity()
	}
	d := max(0, b.next-now)
	if s := b.tokens; s < w.maxPermits {
		d += minTrue(ceilNs((w.maxPermits-s)*w.coolDown), func(x int64) bool {
			return s+float64(x)/w.coolDown >= w.maxPermits
		})
	}
	res.ResetAfter = min(d, maxDur) // past maxDur only with absurd debt
	return res
}

// refillWarm moves the next ticket back by up to k stable intervals, never
// before max(now, g.IssuedAt), while now is within one Period of the grant.
func (b *tokenBucket) refillWarm(c *Config, now int64, g Grant, k int64) int64 {
	now = max(now, b.last)
	b.last = now
	w := warmupOf(c)
	b.resync(w, now)
	if k <= 0 || now >= addSat(g.IssuedAt, c.Period) {
		return 0
	}
	floor := max(now, g.IssuedAt)
	if b.next <= floor {
		return 0
	}
	j := min(k, int64(float64(b.next-floor)/w.stable))
	if j <= 0 {
		return 0
	}
	b.next = max(floor, b.next-ceilNs(float64(j)*w.stable-1e-6))
	return j
}

// Commit implements Bucket.
func (b *tokenBucket) Commit(c *Config, now int64, g Grant, used int64) (CommitResult, error) {
	giveBack, charge, err := split(g, used)
	if err != nil {
		return CommitResult{}, err
	}
	var returned int64
	if giveBack > 0 {
		returned = b.Refill(c, now, g, giveBack)
	} else if charge > 0 {
		b.charge(c, now, charge)
	}
	res := b.owed(c, now)
	res.Returned, res.Debited = returned, charge
	return res, nil
}

// Debit implements Bucket.
func (b *tokenBucket) Debit(c *Config, now int64, n int64) (CommitResult, error) {
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

// charge takes n tokens even below zero; with warm-up it pushes the next
// ticket as an acquire of n would.
func (b *tokenBucket) charge(c *Config, now, n int64) {
	if c.Warmup > 0 {
		now = max(now, b.last)
		b.last = now
		w := warmupOf(c)
		b.resync(w, now)
		fn := float64(n)
		b.next = min(addSat(max(b.next, now), ceilNs(w.cost(b.tokens, fn)-1e-6)), addSat(now, maxDur))
		b.tokens = max(0, b.tokens-fn)
		return
	}
	b.advance(c, now)
	b.tokens -= float64(n)
}

func (b *tokenBucket) owed(c *Config, now int64) CommitResult {
	var res CommitResult
	if c.Warmup > 0 {
		now = max(now, b.last)
		b.last = now
		if ahead := b.next - now; ahead > 0 {
			res.RetryAfter = ahead
			res.Debt = ceilNs(float64(ahead)/warmupOf(c).stable - 1e-6)
		} else {
			res.Remaining = c.Capacity()
		}
		return res
	}
	b.advance(c, now)
	t := b.tokens
	eps := tokenEps(c)
	res.Remaining = max(0, min(c.Capacity(), int64(math.Floor(min(max(t, 0)+eps, float64(c.Capacity()))))))
	if t < -eps {
		res.Debt = ceilNs(-t - eps)
	}
	if t-1 < -eps {
		res.RetryAfter = minTrue(timeFor(c, 1-t), func(w int64) bool {
			return min(float64(c.Capacity()), t+refillIn(c, w))-1 >= -eps
		})
	}
	return res
}
