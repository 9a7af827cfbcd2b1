package shard

import (
	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/grant"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// Reason says why a decision came out as it did; numbers match
// tokenserver.v1.Reason.
type Reason uint8

// The reasons.
const (
	_ Reason = iota
	// ReasonLimit: the algorithm decided.
	ReasonLimit
	// ReasonPenalty: the key is locked out by the rule's penalty.
	ReasonPenalty
	// ReasonDenyList: the key is on the deny list.
	ReasonDenyList
	// ReasonAllowList: the key is on the allow list.
	ReasonAllowList
)

// Grant is the grant of a Decision (see package grant), named here so
// that callers of the Map need not import that package.
type Grant = grant.Grant

// GrantIDLen is the length of an encoded grant id.
const GrantIDLen = grant.IDLen

// Decision is the answer to an acquire.
type Decision struct {
	bucket.Result
	// Grant names what was granted; zero when nothing was taken from a bucket
	// (denied, peek, allow list, shadow).
	Grant Grant
	// Reason says why.
	Reason Reason
	// ShadowDenied is set in a shadow rule when the real decision was a
	// denial (Allowed is then true).
	ShadowDenied bool
	// Rule is the rule version that decided: the caller's, or a newer one
	// the key's bucket had already moved to.
	Rule *rule.Compiled
}

// CheckRequest reports whether req is acceptable for cfg: permits >= 0, at
// most the capacity unless partial, partial only where the algorithm offers
// it, max_wait within [0, period].
func CheckRequest(cfg *bucket.Config, req bucket.Request) error {
	switch {
	case req.Permits < 0:
		return rule.Invalid("permits must be >= 0, got %d", req.Permits)
	case req.Partial && !bucket.OffersPartial(cfg.Algorithm):
		return rule.Invalid("partial: %s grants all or nothing; partial grants are offered by token-bucket, fixed-window and sliding-window", cfg.Algorithm)
	case req.Permits > cfg.Capacity() && !req.Partial:
		return rule.Invalid("permits %d is above the key's capacity %d and could never be granted; ask for at most %d or set partial", req.Permits, cfg.Capacity(), cfg.Capacity())
	case req.MaxWait < 0:
		return rule.Invalid("max_wait must be >= 0, got %dns", req.MaxWait)
	case req.MaxWait > cfg.Period:
		return rule.Invalid("max_wait %dns is above the rule's period %dns", req.MaxWait, cfg.Period)
	}
	return nil
}

// Acquire decides req for key under rule c at time now. A denial is a
// Decision with Allowed false, not an error; errors are rule.ErrInvalid for a
// bad request, ErrBucketCap and ErrMaxKeys for a new key past a cap.
func (m *Map) Acquire(c *rule.Compiled, key string, req bucket.Request, now int64) (Decision, error) {
	return m.acquire(c, key, nil, req, false, now)
}

// AcquireInline is Acquire under a limit carried in the request (see
// rule.InlineLimit): the key's one bucket is resized to it (unless an
// override of the key applies, which wins) and judged by it; its later
// commits, refills and idle checks use it until another acquire of the
// key brings another limit or none. A limit the rule's inline policy
// refuses is rule.ErrInvalid and changes nothing.
func (m *Map) AcquireInline(c *rule.Compiled, key string, l rule.InlineLimit, req bucket.Request, now int64) (Decision, error) {
	c, err := current(c)
	if err != nil {
		return Decision{}, err
	}
	inl, err := c.Inline(l)
	if err != nil {
		return Decision{}, err
	}
	return m.acquire(c, key, &inlineReq{limit: l, by: c, cfg: inl}, req, false, now)
}

// inlineReq is a request's limit: as asked, and as configured under the
// rule version (by) that validated it. It stays on the caller's stack: the
// bucket keeps a copy (see followInline).
type inlineReq struct {
	limit rule.InlineLimit
	by    *rule.Compiled
	cfg   bucket.Config
}

// configFor is the configuration that judges key under c: c's
// configuration for the key, or, when useInl, inl.cfg (a request limit
// applies when the request carries one and no override of the key does;
// the operator's override wins). inl is revalidated under c when another
// version validated it.
func configFor(c *rule.Compiled, key string, inl *inlineReq) (cfg *bucket.Config, useInl bool, err error) {
	cfg = c.ConfigFor(key)
	if inl == nil || cfg != &c.Config {
		return cfg, false, nil
	}
	if inl.by != c {
		v, err := c.Inline(inl.limit)
		if err != nil {
			return nil, false, err
		}
		inl.by, inl.cfg = c, v
	}
	return cfg, true, nil
}

// Lease policy: under LeaseLowShare of capacity, a lease gets at most
// 1/LeaseTailDivisor of what remains.
const (
	LeaseLowShare    = 10 // percent
	LeaseTailDivisor = 2
)

// AcquireLease is a client lease of up to want permits: a partial grant
// capped at the rule's lease.max_batch and, once the key is under
// LeaseLowShare percent of its capacity, at 1/LeaseTailDivisor of what
// remains (at least one), so that clients share the tail (the limited
// grants near exhaustion of quota pre-allocation). Rules without leases
// refuse it with rule.ErrInvalid.
func (m *Map) AcquireLease(c *rule.Compiled, key string, want int64, now int64) (Decision, error) {
	if c.Rule.Lease.MaxBatch <= 0 {
		return Decision{}, rule.Invalid("rule %q does not allow leases (lease.max_batch is not set)", c.Rule.Name)
	}
	if want < 1 {
		return Decision{}, rule.Invalid("a lease wants permits >= 1, got %d", want)
	}
	return m.acquire(c, key, nil, bucket.Request{Permits: want, Partial: true}, true, now)
}

// acquire finds the rule version and the bucket that judge req, and has
// decide judge it under the bucket's lock.
func (m *Map) acquire(c *rule.Compiled, key string, inl *inlineReq, req bucket.Request, lease bool, now int64) (Decision, error) {
	c, err := current(c)
	if err != nil {
		return Decision{}, err
	}
	if c.Allowed(key) || c.Denied(key) {
		return listed(c, key, inl, req)
	}
	var arr [rule.MaxNameLen + 1 + rule.MaxKeyLen]byte
	bk := bucketKey(arr[:0], c.Rule.Name, key)
	sh, h := m.shardOf(bk)
	// j.cfg is the rule's (the bucket may keep it); the request's own
	// limit, when j.inline, is inl.cfg, which only check points at, so
	// that it never leaves the stack. A bucket already judged by c under
	// the same runtime overrides answers without the override lookup.
	var j judge
	e := m.lookup(sh, h, bk)
	if e != nil && e.rule == c && e.stamp == c.Stamp() {
		err = j.cached(e, c, inl)
	} else {
		err = j.lookup(c, key, inl)
	}
	check := j.cfg
	if j.inline {
		check = &inl.cfg
	}
	if err == nil {
		err = CheckRequest(check, req)
	}
	if err != nil {
		if e != nil {
			e.mu.Unlock()
		}
		return Decision{}, err
	}
	if e == nil {
		if req.Permits == 0 { // a peek creates nothing
			if j.inline {
				pc := inl.cfg // a copy: inl stays on the stack
				return Decision{Result: bucket.New(&pc, now).Acquire(&pc, now, req), Reason: ReasonLimit, Rule: c}, nil
			}
			return Decision{Result: bucket.New(j.cfg, now).Acquire(j.cfg, now, req), Reason: ReasonLimit, Rule: c}, nil
		}
		var init *bucket.Config
		if j.inline {
			init = &inl.cfg
		}
		if e, err = m.lookupOrCreate(sh, h, bk, c, j.cfg, init, now); err != nil {
			return Decision{}, err
		}
	}
	// Look again under the bucket's lock: a sweep drops a bucket of a gone
	// rule only after the rule learnt its successor, so this sees it.
	if l, err := current(c); err != nil {
		e.mu.Unlock()
		return Decision{}, err
	} else if l != c {
		c = l
		if err = j.recheck(c, key, inl, req); err != nil {
			e.mu.Unlock()
			return Decision{}, err
		}
	}
	if e.rule != c {
		v, err := m.resolve(e, c, key, now)
		if err == nil && v != c {
			// The bucket is at a newer version than the caller's: it is
			// judged by that one (a bucket never moves back).
			c = v
			err = j.recheck(c, key, inl, req)
		}
		if err != nil {
			e.mu.Unlock()
			return Decision{}, err
		}
	}
	cfg := j.cfg
	if j.inline {
		cfg = m.followInline(e, &inl.cfg, now)
	} else {
		m.follow(e, cfg, now)
	}
	e.stamp = j.stamp
	d, err := m.decide(e, c, cfg, req, lease, now)
	if c.Rule.Durable {
		sh.markDirty(e) // replication takes it (dirty.go)
	}
	e.mu.Unlock()
	if err != nil {
		return Decision{}, err
	}
	if d.Grant.Nonce != 0 {
		m.keys.Seal(&d.Grant, bk, c.Rule.Generation)
	}
	d.Rule = c
	shadow(c, &d, req)
	return d, nil
}

// listed answers a key on c's allow or deny list, which has no bucket.
func listed(c *rule.Compiled, key string, inl *inlineReq, req bucket.Request) (Decision, error) {
	var j judge
	if err := j.recheck(c, key, inl, req); err != nil {
		return Decision{}, err
	}
	check := j.cfg
	if j.inline {
		check = &inl.cfg
	}
	if c.Allowed(key) {
		return Decision{Result: bucket.Result{Allowed: true, Granted: req.Permits, Remaining: check.Capacity()}, Reason: ReasonAllowList, Rule: c}, nil
	}
	d := Decision{Result: bucket.Result{RetryAfter: check.Period}, Reason: ReasonDenyList, Rule: c}
	shadow(c, &d, req)
	return d, nil
}

// judge is the configuration an acquire is judged by.
type judge struct {
	// cfg is the rule version's configuration for the key (an override's
	// or the default), as of stamp.
	cfg   *bucket.Config
	stamp *rule.Stamp
	// inline: the request's limit applies (inl.cfg, which j does not
	// point at: it stays on the stack).
	inline bool
}

// lookup fills j for key under c: the stamp first, then the lookup, so
// that an override written in between changes the stamp after the one
// j keeps.
func (j *judge) lookup(c *rule.Compiled, key string, inl *inlineReq) error {
	j.stamp = c.Stamp()
	var err error
	j.cfg, j.inline, err = configFor(c, key, inl)
	return err
}

// cached fills j from e, a bucket judged by c under c's current stamp:
// its configuration is c's for the key, unless it holds a request's
// limit, which applies only where c's default does. e.mu is held.
func (j *judge) cached(e *entry, c *rule.Compiled, inl *inlineReq) error {
	j.stamp, j.cfg = e.stamp, e.cfg
	if e.inl != nil && e.cfg == e.inl {
		j.cfg = &c.Config
	}
	if inl == nil || j.cfg != &c.Config {
		return nil
	}
	if inl.by != c {
		v, err := c.Inline(inl.limit)
		if err != nil {
			return err
		}
		inl.by, inl.cfg = c, v
	}
	j.inline = true
	return nil
}

// recheck is lookup and CheckRequest under another version c.
func (j *judge) recheck(c *rule.Compiled, key string, inl *inlineReq, req bucket.Request) error {
	if err := j.lookup(c, key, inl); err != nil {
		return err
	}
	if j.inline {
		return CheckRequest(&inl.cfg, req)
	}
	return CheckRequest(j.cfg, req)
}

// decide judges req on e's bucket under rule version c (e's own) and cfg
// (c's config for the key): the penalty lock-out, the lease share, the
// algorithm, and the growth of a log or lease set against the budget. A
// grant comes back in d.Grant, not yet sealed. It is the one place a
// bucket's state changes on a decision, so per-key bookkeeping belongs
// here. e.mu is held.
func (m *Map) decide(e *entry, c *rule.Compiled, cfg *bucket.Config, req bucket.Request, lease bool, now int64) (d Decision, err error) {
	if e.moved {
		return Decision{}, errMoved(e, c) // export.go
	}
	if now < e.penaltyUntil {
		d.Result, d.Reason = e.b.Acquire(cfg, now, bucket.Request{}), ReasonPenalty
		d.Allowed, d.RetryAfter = false, e.penaltyUntil-now
		return d, nil
	}
	if lease {
		left := e.b.Acquire(cfg, now, bucket.Request{}).Remaining
		want := min(req.Permits, c.Rule.Lease.MaxBatch)
		if left*100 < cfg.Capacity()*LeaseLowShare {
			want = min(want, max(1, left/LeaseTailDivisor))
		}
		req.Permits = want
	}
	e.seq++
	nonce := e.seq
	req.LeaseID = nonce
	var before int64
	if bucket.Grows(cfg.Algorithm) {
		if m.budget > 0 && req.Permits > 0 && bucket.Full(e.b) && m.used.Load() >= m.budget {
			return Decision{}, m.errGrow(c)
		}
		before = bucket.Bytes(e.b)
	}
	d.Result, d.Reason = e.b.Acquire(cfg, now, req), ReasonLimit
	if before != 0 {
		m.charge(c, bucket.Bytes(e.b)-before)
	}
	if !d.Allowed && req.Permits > 0 && c.Rule.Penalty > 0 {
		e.penaltyUntil = addSat(now, int64(c.Rule.Penalty))
		d.RetryAfter = max(d.RetryAfter, int64(c.Rule.Penalty))
	}
	if d.Granted > 0 {
		d.Grant = Grant{Nonce: nonce, IssuedAt: now, Permits: d.Granted}
	}
	return d, nil
}

// shadow turns a denial into an allow in a shadow rule.
func shadow(c *rule.Compiled, d *Decision, req bucket.Request) {
	if c.Rule.Shadow && !d.Allowed {
		d.Allowed, d.ShadowDenied, d.Granted, d.RetryAfter = true, true, req.Permits, 0
	}
}
