package shard

import (
	"fmt"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// Hit counts n >= 0 permits on the fixed-window bucket of (c, key) without
// judging them (bucket.Hit: every hit counts, even past the limit, and the
// count is forgotten at the window boundary), creating the bucket against
// the caps when n > 0. n = 0 reads the count and creates nothing. It is
// the counter of Envoy's rate-limit service; c's default config must be a
// fixed window. A bucket handed over (HandOver) is ErrMoved.
func (m *Map) Hit(c *rule.Compiled, key string, n int64, now int64) (bucket.HitResult, error) {
	c, err := current(c)
	if err != nil {
		return bucket.HitResult{}, err
	}
	cfg := c.ConfigFor(key)
	if cfg.Algorithm != bucket.FixedWindow {
		return bucket.HitResult{}, fmt.Errorf("rule %q: %w", c.Rule.Name, bucket.ErrNoHit)
	}
	bk := bucketKey(make([]byte, 0, len(c.Rule.Name)+1+len(key)), c.Rule.Name, key)
	sh, h := m.shardOf(bk)
	var e *entry
	if n == 0 {
		if e = m.lookup(sh, h, bk); e == nil {
			return bucket.Hit(bucket.New(cfg, now), cfg, now, 0)
		}
	} else if e, err = m.lookupOrCreate(sh, h, bk, c, cfg, nil, now); err != nil {
		return bucket.HitResult{}, err
	}
	if e.moved { // handed over: its new owner counts (as decide refuses)
		err := errMoved(e, c)
		e.mu.Unlock()
		return bucket.HitResult{}, err
	}
	if e.rule != c {
		j, err := m.resolve(e, c, key, now)
		if err != nil {
			e.mu.Unlock()
			return bucket.HitResult{}, err
		}
		c, cfg = j, j.ConfigFor(key)
	}
	r, err := bucket.Hit(e.b, cfg, now, n)
	e.mu.Unlock()
	return r, err
}

// SweepIdle drops the buckets of the rules match selects that are idle at
// now, and returns how many it dropped. It serves buckets kept on another
// clock than the one Sweep is given (Envoy's counters run on Unix time);
// Sweep never drops them wrongly, since a bucket judges an earlier now as
// its last, but it cannot see them go idle.
func (m *Map) SweepIdle(now int64, match func(*rule.Compiled) bool) int {
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
			if e.rule != nil && match(e.rule) && e.idle(now) {
				m.drop(sh, e)
				n++
			}
			e.mu.Unlock()
		}
		sh.mu.Unlock()
	}
	m.accounts.retire()
	return n
}
