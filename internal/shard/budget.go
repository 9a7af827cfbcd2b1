package shard

import (
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// FairShareAbove is the part of Config.MaxBytes, in percent, above which a
// rule is held to its fair share.
const FairShareAbove = 75

// account is what the Map counts for one generation of one rule: its live
// buckets (held to the rule's max_keys) and their bytes (held to its fair
// share of the budget). Every version of a generation shares it, so a rule
// change keeps the count; a new generation starts at zero.
type account struct {
	keys  atomic.Int64
	bytes atomic.Int64
	// quietUntil is the clock time before which a search for the rule's
	// full buckets is not repeated (evictOwnFull).
	quietUntil atomic.Int64
}

// accountKey names one generation of one rule.
type accountKey struct {
	name string
	gen  uint64
}

// accounts holds the account of every rule generation that has buckets.
// A count moves only while its account is pinned (the read lock), and an
// account that counts nothing is retired only under the write lock, so
// every bucket of a generation counts in the one account a lookup finds.
// Its lock is the innermost: taken under shard and bucket locks, and
// nothing is locked while it is held.
type accounts struct {
	mu sync.RWMutex
	m  map[accountKey]*account
}

// pin returns the account of c's generation, made if need be, with the
// read lock held until unpin.
func (r *accounts) pin(c *rule.Compiled) *account {
	k := accountKey{c.Rule.Name, c.Rule.Generation}
	for {
		r.mu.RLock()
		if a := r.m[k]; a != nil {
			return a
		}
		r.mu.RUnlock()
		r.mu.Lock()
		if r.m[k] == nil {
			r.m[k] = new(account)
		}
		r.mu.Unlock()
	}
}

// unpin ends a pin.
func (r *accounts) unpin() { r.mu.RUnlock() }

// find returns the account of c's generation, or nil when it has none,
// for reading.
func (r *accounts) find(c *rule.Compiled) *account {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.m[accountKey{c.Rule.Name, c.Rule.Generation}]
}

// retire forgets the accounts that count nothing: a generation's next
// bucket makes a new one, at zero.
func (r *accounts) retire() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, a := range r.m {
		if a.keys.Load() == 0 && a.bytes.Load() == 0 {
			delete(r.m, k)
		}
	}
}

// admitNew counts a new bucket of c, of size bytes, against the node's
// and the rule's caps; sh.mu is held.
func (m *Map) admitNew(sh *shard, c *rule.Compiled, size, now int64) error {
	if m.max > 0 {
		if m.live.Load() >= m.max {
			m.evictIdle(sh, now, 64)
		}
		if !incrementBelow(&m.live, m.max) {
			m.capDenials.Add(1)
			return fmt.Errorf("%w: %d buckets live", ErrBucketCap, m.max)
		}
	} else {
		m.live.Add(1)
	}
	if m.budget > 0 && m.used.Load()+size > m.budget {
		m.evictIdle(sh, now, 64) // before the pin: eviction pins too
	}
	for swap := false; ; swap = true {
		a := m.accounts.pin(c)
		overShare, err := m.admitBytes(a, c, size, swap)
		if err == nil {
			if err = m.countKey(a, c); err != nil {
				m.live.Add(-1)
				m.chargeAccount(a, -size)
			}
			m.accounts.unpin()
			return err
		}
		m.accounts.unpin() // before eviction, which pins too
		if overShare && !swap && m.evictOwnFull(sh, c, now, size) >= size {
			continue // the new key takes the place of the rule's own full buckets
		}
		m.live.Add(-1)
		m.capDenials.Add(1)
		return err
	}
}

// countKey counts a bucket that enters c's generation, pinned as a,
// against c's max_keys.
func (m *Map) countKey(a *account, c *rule.Compiled) error {
	if c.MaxKeys == 0 {
		a.keys.Add(1)
		return nil
	}
	if !incrementBelow(&a.keys, c.MaxKeys) {
		m.capDenials.Add(1)
		return fmt.Errorf("%w: rule %q holds its max_keys %d keys on this node", ErrMaxKeys, c.Rule.Name, c.MaxKeys)
	}
	return nil
}

// admitBytes charges size bytes of a new bucket of c, pinned as a,
// against the budget and c's fair share. overShare says that the refusal
// is the fair share's: c holds more than its share while the budget still
// has room, so that freeing c's own buckets can make room. swap says that
// c just freed at least size bytes of its own (evictOwnFull): the new
// bucket takes their place, c does not grow, and the share does not apply.
func (m *Map) admitBytes(a *account, c *rule.Compiled, size int64, swap bool) (overShare bool, err error) {
	if m.budget <= 0 {
		m.chargeAccount(a, size)
		return false, nil
	}
	if used := m.used.Add(size); used > m.budget {
		m.used.Add(-size)
		return false, fmt.Errorf("%w: buckets hold %d bytes of the node's %d-byte bucket memory budget", ErrBucketCap, used-size, m.budget)
	} else if used > m.budget/100*FairShareAbove && !swap {
		mine := a.bytes.Load()
		rules := m.active.Load()
		if mine == 0 {
			rules++
		}
		if share := m.budget / max(rules, 2); mine+size > share {
			m.used.Add(-size)
			return true, fmt.Errorf("%w: rule %q holds %d bytes, its fair share of the node's %d-byte bucket memory budget among %d rules is %d, and none of its buckets is back at its initial state", ErrBucketCap, c.Rule.Name, mine, m.budget, max(rules, 2), share)
		}
	}
	m.used.Add(-size)
	m.chargeAccount(a, size)
	return false, nil
}

// charge adds d bytes to the node's and c's generation's bucket memory.
func (m *Map) charge(c *rule.Compiled, d int64) {
	if d == 0 {
		return
	}
	a := m.accounts.pin(c)
	m.chargeAccount(a, d)
	m.accounts.unpin()
}

// chargeAccount adds d bytes to the node's and a's bucket memory; a is
// pinned.
func (m *Map) chargeAccount(a *account, d int64) {
	if d == 0 {
		return
	}
	m.used.Add(d)
	n := a.bytes.Add(d)
	switch old := n - d; {
	case old <= 0 && n > 0:
		m.active.Add(1)
	case old > 0 && n <= 0:
		m.active.Add(-1)
	}
}

// errGrow is the error of a sliding log or lease set that would grow past
// the budget.
func (m *Map) errGrow(c *rule.Compiled) error {
	m.capDenials.Add(1)
	return fmt.Errorf("%w: the node's %d-byte bucket memory budget is full; rule %q's bucket for this key cannot hold more entries", ErrBucketCap, m.budget, c.Rule.Name)
}

// entryFixed is what every bucket costs besides its key and algorithm
// state: the entry and its share of the index's slots (8 bytes a slot,
// kept between 3/8 and 3/4 full).
var entryFixed = bucket.AllocBytes(int64(unsafe.Sizeof(entry{}))) + 16

// keyBytes is the heap size of a key of n bytes.
func keyBytes(n int) int64 { return bucket.AllocBytes(int64(n)) }

// bytes is the memory e holds; e.mu is held.
func (e *entry) bytes() int64 {
	return entryFixed + keyBytes(len(e.key)) + bucket.Bytes(e.b) + e.refilled.bytes()
}

// incrementBelow adds one to n unless that would reach past limit.
func incrementBelow(n *atomic.Int64, limit int64) bool {
	for {
		v := n.Load()
		if v >= limit {
			return false
		}
		if n.CompareAndSwap(v, v+1) {
			return true
		}
	}
}
