package shard

import (
	"hash/maphash"

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
