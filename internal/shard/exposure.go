package shard

import (
	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// Owed calls fn, for every bucket this Map decides on (not one it handed
// over), with its rule, the debt it carries (bucket.CommitResult.Debt)
// and the permits its live concurrency leases hold, as of now; a bucket
// with neither is skipped. One bucket is locked at a time, briefly: it is
// a scan of the whole Map, for the over-admission metric, which caches
// it (fn must not call the Map).
func (m *Map) Owed(now int64, fn func(c *rule.Compiled, debt, leased int64)) {
	for i := range m.shards {
		tab := m.shards[i].tab.Load()
		for j := range tab.slots {
			e := tab.slots[j].Load()
			if e == nil || e == tombstone {
				continue
			}
			e.mu.Lock()
			if e.rule == nil || e.moved {
				e.mu.Unlock()
				continue
			}
			c := e.rule
			cfg := c.ConfigFor(e.key[len(c.Rule.Name)+1:])
			var debt, leased int64
			if cfg.Algorithm == bucket.Concurrency {
				leased = max(0, cfg.Capacity()-e.b.Acquire(cfg, now, bucket.Request{}).Remaining)
			} else if r, err := e.b.Debit(cfg, now, 0); err == nil {
				debt = r.Debt
			}
			e.mu.Unlock()
			if debt > 0 || leased > 0 {
				fn(c, debt, leased)
			}
		}
	}
}
