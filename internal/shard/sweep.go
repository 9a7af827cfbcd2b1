package shard

import (
	"cmp"
	"hash/maphash"
	"slices"
	"time"

	"github.com/tokenserver/tokenserver/internal/rule"
)

// idle reports whether e can be dropped: back at its initial state, no
// penalty, no grant that could still be refilled twice; e.mu is held.
func (e *entry) idle(now int64) bool {
	key := e.key[len(e.rule.Rule.Name)+1:]
	return now >= e.penaltyUntil && !e.refilled.live(now) && e.b.Idle(e.config(key), now)
}

// evictIdle drops up to limit idle entries of sh, looking at no more than
// 4*limit slots from where the previous call stopped; sh.mu is held.
func (m *Map) evictIdle(sh *shard, now int64, limit int) {
	t := sh.tab.Load()
	dropped := 0
	for seen := 0; seen < 4*limit && dropped < limit; seen++ {
		sh.cursor = (sh.cursor + 1) & int(t.mask)
		e := t.slots[sh.cursor].Load()
		if e == nil || e == tombstone {
			continue
		}
		e.mu.Lock()
		if e.rule != nil && e.idle(now) {
			m.drop(sh, e)
			dropped++
		}
		e.mu.Unlock()
	}
}

// drop takes e out of the index and marks it dead; sh.mu and e.mu are
// held.
func (m *Map) drop(sh *shard, e *entry) {
	sh.remove(maphash.String(m.seed, e.key), e)
	m.live.Add(-1)
	a := m.accounts.pin(e.rule)
	m.chargeAccount(a, -e.bytes())
	a.keys.Add(-1)
	m.accounts.unpin()
	e.rule = nil
	for d := m.dropped.Load(); d < e.seq && !m.dropped.CompareAndSwap(d, e.seq); d = m.dropped.Load() {
	}
	m.evicted.Add(1)
}

// Sweep drops every bucket that is idle at now, or whose rule is gone from
// t (deleted, or re-created as a new generation). A bucket is judged by the
// rule version it belongs to: one whose version is newer than t (created or
// changed after t was loaded) is kept unless idle. It locks one shard at a
// time (and each bucket in turn), shrinks indexes left mostly empty,
// forgets the accounts of rule generations left without buckets, and
// returns how many it dropped.
func (m *Map) Sweep(now int64, t *rule.Table) int {
	n := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		tab := sh.tab.Load()
		for j := range tab.slots {
			e := tab.slots[j].Load()
			if e == nil || e == tombstone {
				continue
			}
			e.mu.Lock()
			if e.rule != nil && (gone(e.rule, t) || e.idle(now)) {
				m.drop(sh, e)
				n++
			}
			e.mu.Unlock()
		}
		if len(tab.slots) > minTable && (sh.live*8 < len(tab.slots) || sh.used*2 > len(tab.slots)) {
			sh.rehash(m.seed, max(minTable, 1<<bitsFor(2*sh.live+1)))
		}
		sh.mu.Unlock()
	}
	m.accounts.retire()
	return n
}

// gone reports whether t, at least as new as c, no longer holds c's
// generation (deleted, or re-created).
func gone(c *rule.Compiled, t *rule.Table) bool {
	if c.Rule.Version > t.Version {
		return false // t predates c: it cannot judge it
	}
	cur := t.Get(c.Rule.Name)
	return cur == nil || cur.Rule.Generation != c.Rule.Generation
}

// Fair-share eviction: a rule held to its fair share of the bucket memory
// budget (admitBytes) evicts its own full buckets before a new key of it
// is refused, and the new key takes their place. A bucket back at its
// initial state (a full token bucket, an empty window, no penalty, no
// grant that could still be refilled) is the same as no bucket: dropping
// it and making it again later changes no decision, so the eviction is
// exact. Among the full buckets found, the least recently used go first
// (recency only spares a hot key the cost of a new bucket). Buckets that
// still carry state are never evicted for room: when none of the rule's
// buckets is full, the new key is refused with ErrBucketCap
// (RESOURCE_EXHAUSTED), and its caller's fallback policy decides. Other
// rules' buckets are never evicted for the rule.
//
// The search is bounded: up to ownScanSlots slots in each shard, the new
// key's own shard first, then the others whose lock is free at once (TryLock: a shard's lock is held while another is
// only tried, never waited for, so the one-shard-at-a-time order holds).
// A search that finds nothing spares the rule further searches for
// ownScanQuiet of clock time: buckets refill with time, not with calls.
const (
	ownScanSlots = 256
	// ownScanKeep bounds the candidates kept per shard, least recently
	// used first.
	ownScanKeep = 16
	// ownScanQuiet is how long a rule whose search found no full bucket
	// is refused without another search.
	ownScanQuiet = int64(100 * time.Millisecond)
)

// evictOwnFull drops full buckets of c's generation, least recently used
// first within each shard searched, until size bytes are freed or the
// search ends, and returns the bytes freed. sh is the new key's shard,
// whose mu is held; the accounts are not pinned. The rule's account is
// node-wide, so room made in any shard serves the new key.
func (m *Map) evictOwnFull(sh *shard, c *rule.Compiled, now, size int64) int64 {
	a := m.accounts.find(c)
	if a == nil || now < a.quietUntil.Load() {
		return 0
	}
	freed := m.evictOwnFullIn(sh, c, now, size)
	start := int(m.scanShard.Add(1))
	for i := 0; i < len(m.shards) && freed < size; i++ {
		o := &m.shards[(start+i)%len(m.shards)]
		if o == sh || !o.mu.TryLock() {
			continue
		}
		freed += m.evictOwnFullIn(o, c, now, size-freed)
		o.mu.Unlock()
	}
	if freed == 0 {
		a.quietUntil.Store(now + ownScanQuiet)
	}
	return freed
}

// evictOwnFullIn is evictOwnFull within shard sh, whose mu is held: it
// looks at up to ownScanSlots slots from where sh's previous eviction
// stopped.
func (m *Map) evictOwnFullIn(sh *shard, c *rule.Compiled, now, size int64) int64 {
	t := sh.tab.Load()
	type cand struct {
		e    *entry
		last int64
	}
	var cands []cand
	for seen := 0; seen < ownScanSlots && seen <= int(t.mask) && len(cands) < ownScanKeep; seen++ {
		sh.cursor = (sh.cursor + 1) & int(t.mask)
		e := t.slots[sh.cursor].Load()
		if e == nil || e == tombstone {
			continue
		}
		e.mu.Lock()
		if ownFull(e, c, now) {
			cands = append(cands, cand{e, e.last})
		}
		e.mu.Unlock()
	}
	slices.SortFunc(cands, func(a, b cand) int { return cmp.Compare(a.last, b.last) })
	var freed int64
	for _, cd := range cands {
		if freed >= size {
			break
		}
		e := cd.e
		e.mu.Lock()
		if ownFull(e, c, now) { // a decision may have used it meanwhile
			freed += e.bytes()
			m.drop(sh, e)
		}
		e.mu.Unlock()
	}
	return freed
}

// ownFull reports whether e is a live bucket of c's generation back at its
// initial state; e.mu is held.
func ownFull(e *entry, c *rule.Compiled, now int64) bool {
	return e.rule != nil && e.rule.Rule.Name == c.Rule.Name && e.rule.Rule.Generation == c.Rule.Generation && e.idle(now)
}
