package shard

import (
	"fmt"
	"unsafe"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/grant"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// maxRefillLog bounds the refilled-grant record of one bucket; past it a
// refill changes nothing, which never over-admits.
const maxRefillLog = 1024

// refillLog records the grants of one bucket already given back, until
// they could no longer be given back anyway.
type refillLog struct {
	nonces  []uint64
	expires []int64
	// floor: grants made before it are not given back. A rule change that
	// lengthens how long grants can be given back sets it, since the
	// records of grants given back under the old rule may be gone.
	floor int64
}

// parseGrant is grant.Parse with a malformed id as rule.ErrInvalid.
func parseGrant(id string) (grant.Grant, error) {
	g, err := grant.Parse(id)
	if err != nil {
		return grant.Grant{}, rule.Invalid("%v", err)
	}
	return g, nil
}

// Refill gives back up to permits (all the grant took when permits < 0) of
// the grant named by grantID, or ends a concurrency lease. It returns how
// many went back and what remains. An unknown, expired or already refilled
// grant changes nothing and returns 0; a malformed id is rule.ErrInvalid;
// a bucket handed over to the key's new owner (HandOver) is ErrMoved and
// changes nothing: the grant is given back there.
func (m *Map) Refill(c *rule.Compiled, key, grantID string, permits int64, now int64) (refilled, remaining int64, err error) {
	g, err := parseGrant(grantID)
	if err != nil {
		return 0, 0, err
	}
	if c, err = current(c); err != nil {
		return 0, 0, err
	}
	cfg := c.ConfigFor(key)
	var arr [rule.MaxNameLen + 1 + rule.MaxKeyLen]byte
	bk := bucketKey(arr[:0], c.Rule.Name, key)
	if !m.open(&g, bk, c.Rule.Generation) {
		if _, moved := m.Held(c.Rule.Name, key); moved {
			// Perhaps a grant of the new owner, whose keys this node
			// does not hold: it is given back there.
			return 0, 0, fmt.Errorf("key %q of rule %q: %w", key, c.Rule.Name, ErrMoved)
		}
		return 0, m.peek(c, bk, cfg, now), nil // not a grant of this node, rule generation and key
	}
	if permits < 0 || permits > g.Permits {
		permits = g.Permits
	}
	sh, h := m.shardOf(bk)
	e := m.lookup(sh, h, bk)
	if e == nil { // evicted: back at its initial state, nothing to give back
		return 0, bucket.New(cfg, now).Acquire(cfg, now, bucket.Request{}).Remaining, nil
	}
	defer e.mu.Unlock()
	if e.moved {
		return 0, 0, errMoved(e, c) // export.go
	}
	if e.rule.Rule.Generation != c.Rule.Generation {
		// The bucket is of another generation than the grant: nothing of
		// the grant is here.
		return 0, bucket.New(cfg, now).Acquire(cfg, now, bucket.Request{}).Remaining, nil
	}
	if c, err = m.resolve(e, c, key, now); err != nil { // same generation: never fails
		return 0, 0, err
	}
	cfg = e.config(key)
	m.follow(e, cfg, now)
	if g.Nonce < e.first {
		// The grant belongs to an earlier bucket of the key, evicted
		// since (back at its initial state): nothing of it is here.
		return 0, e.b.Acquire(cfg, now, bucket.Request{}).Remaining, nil
	}
	bg := bucket.Grant{IssuedAt: g.IssuedAt, Permits: g.Permits, LeaseID: g.Nonce}
	if cfg.Algorithm == bucket.Concurrency {
		refilled = e.b.Refill(cfg, now, bg, g.Permits)
	} else {
		before := e.refilled.bytes()
		full := m.budget > 0 && m.used.Load() >= m.budget
		if e.refillOnce(g.Nonce, g.IssuedAt, validity(cfg), now, !full) {
			refilled = e.b.Refill(cfg, now, bg, permits)
		}
		m.charge(c, e.refilled.bytes()-before)
	}
	return refilled, e.b.Acquire(cfg, now, bucket.Request{}).Remaining, nil
}

// validity bounds how long after it was made a grant can still be given
// back (the bucket decides exactly; this bounds the refilled-grant record).
func validity(cfg *bucket.Config) int64 {
	if cfg.Algorithm == bucket.LeakyBucket {
		return 2*cfg.Period + cfg.Capacity()*(cfg.Period/cfg.Limit)
	}
	return cfg.Span()
}

// refillOnce records that the grant nonce, made at issued and refillable
// for valid nanoseconds, is being given back, and reports false when it
// already was, it expired, it predates the record's floor, or the record is
// full (or would have to grow and grow is false).
func (e *entry) refillOnce(nonce uint64, issued, valid, now int64, grow bool) bool {
	expires := addSat(issued, valid)
	if expires <= now {
		return false
	}
	l := e.refilled
	if l == nil {
		if !grow {
			return false
		}
		l = &refillLog{}
		e.refilled = l
	}
	if issued < l.floor {
		return false
	}
	j := 0
	for i, n := range l.nonces {
		if n == nonce {
			return false
		}
		if l.expires[i] > now {
			l.nonces[j], l.expires[j] = n, l.expires[i]
			j++
		}
	}
	l.nonces, l.expires = l.nonces[:j], l.expires[:j]
	if j >= maxRefillLog || !grow && (j == cap(l.nonces) || j == cap(l.expires)) {
		return false // full, or the memory budget is: giving nothing back never over-admits
	}
	l.nonces = append(l.nonces, nonce)
	l.expires = append(l.expires, expires)
	return true
}

// live reports whether the refill record still holds an unexpired grant.
func (l *refillLog) live(now int64) bool {
	if l == nil {
		return false
	}
	for _, e := range l.expires {
		if e > now {
			return true
		}
	}
	return false
}

// bytes is the memory the record holds.
func (l *refillLog) bytes() int64 {
	if l == nil {
		return 0
	}
	return bucket.AllocBytes(int64(unsafe.Sizeof(*l))) + bucket.AllocBytes(int64(cap(l.nonces))*8) + bucket.AllocBytes(int64(cap(l.expires))*8)
}

// peek answers the remaining permits of a bucket without creating one.
func (m *Map) peek(c *rule.Compiled, bk []byte, cfg *bucket.Config, now int64) int64 {
	sh, h := m.shardOf(bk)
	e := m.lookup(sh, h, bk)
	if e == nil {
		return bucket.New(cfg, now).Acquire(cfg, now, bucket.Request{}).Remaining
	}
	defer e.mu.Unlock()
	if e.rule.Rule.Generation != c.Rule.Generation {
		return bucket.New(cfg, now).Acquire(cfg, now, bucket.Request{}).Remaining
	}
	key := string(bk[len(c.Rule.Name)+1:])
	_, _ = m.resolve(e, c, key, now) // same generation: never fails
	return e.b.Acquire(e.config(key), now, bucket.Request{}).Remaining
}

// Renew extends the concurrency lease named by grantID by the rule's period
// and reports whether it was still live; a bucket handed over to the
// key's new owner (HandOver) is ErrMoved and changes nothing.
func (m *Map) Renew(c *rule.Compiled, key, grantID string, now int64) (bool, error) {
	g, err := parseGrant(grantID)
	if err != nil {
		return false, err
	}
	if c, err = current(c); err != nil {
		return false, err
	}
	cfg := c.ConfigFor(key)
	if cfg.Algorithm != bucket.Concurrency {
		return false, rule.Invalid("rule %q is %s: only concurrency leases are renewed", c.Rule.Name, cfg.Algorithm)
	}
	var arr [rule.MaxNameLen + 1 + rule.MaxKeyLen]byte
	bk := bucketKey(arr[:0], c.Rule.Name, key)
	if !m.open(&g, bk, c.Rule.Generation) {
		if _, moved := m.Held(c.Rule.Name, key); moved {
			return false, fmt.Errorf("key %q of rule %q: %w", key, c.Rule.Name, ErrMoved) // renewed at the new owner
		}
		return false, nil
	}
	sh, h := m.shardOf(bk)
	e := m.lookup(sh, h, bk)
	if e == nil {
		return false, nil
	}
	defer e.mu.Unlock()
	if e.moved {
		return false, errMoved(e, c) // export.go
	}
	if e.rule.Rule.Generation != c.Rule.Generation || g.Nonce < e.first {
		return false, nil // a lease of an earlier bucket of the key
	}
	_, _ = m.resolve(e, c, key, now) // same generation: never fails
	if cfg = e.config(key); cfg.Algorithm != bucket.Concurrency {
		return false, nil
	}
	return e.b.Renew(cfg, now, bucket.Grant{IssuedAt: g.IssuedAt, Permits: g.Permits, LeaseID: g.Nonce}), nil
}
