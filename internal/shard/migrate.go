package shard

import (
	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// resolve brings e to the newer of its own rule version and c, and returns
// the version e is now judged by: a bucket never moves back to an older
// version or generation, so requests still holding an older table are
// judged by the newer rule. e.mu is held.
func (m *Map) resolve(e *entry, c *rule.Compiled, key string, now int64) (*rule.Compiled, error) {
	if e.rule == c || c.Rule.Version <= e.rule.Rule.Version {
		return e.rule, nil
	}
	if err := m.update(e, c, key, now); err != nil {
		return nil, err
	}
	return c, nil
}

// update moves e to rule version c (newer than e's): the same generation
// and algorithm keep the state, clamped to the new capacity; otherwise the
// bucket starts fresh and, in another generation, counts as a new key of
// c against its max_keys (ErrMaxKeys leaves e as it was). e.mu is held.
func (m *Map) update(e *entry, c *rule.Compiled, key string, now int64) error {
	old := e.rule
	newCfg := c.ConfigFor(key)
	sameGen := old.Rule.Generation == c.Rule.Generation
	before := e.bytes()
	if sameGen && old.Rule.Algorithm == c.Rule.Algorithm {
		oldCfg := old.ConfigFor(key)
		if e.cfg != nil && e.cfg.Algorithm == oldCfg.Algorithm {
			oldCfg = e.cfg
		}
		e.b.Reconfigure(oldCfg, newCfg, now)
		if e.refilled != nil && validity(newCfg) > validity(oldCfg) {
			// Records of grants given back may be pruned by the shorter
			// validity: refuse grants made before now.
			e.refilled.floor = now
		}
	} else {
		if !sameGen {
			if err := m.moveKey(old, c); err != nil {
				return err
			}
		}
		e.b = bucket.New(newCfg, now)
		e.penaltyUntil = 0
		e.refilled = nil
	}
	if c.Rule.Penalty == 0 {
		e.penaltyUntil = 0
	}
	e.rule, e.cfg, e.stamp = c, newCfg, nil
	if sameGen {
		m.charge(c, e.bytes()-before)
	} else {
		m.charge(old, -before)
		m.charge(c, e.bytes())
	}
	return nil
}

// moveKey counts a bucket of generation old as one of c's (another
// generation), against c's max_keys.
func (m *Map) moveKey(old, c *rule.Compiled) error {
	a := m.accounts.pin(c)
	err := m.countKey(a, c)
	m.accounts.unpin()
	if err != nil {
		return err
	}
	m.accounts.pin(old).keys.Add(-1)
	m.accounts.unpin()
	return nil
}

// follow moves e to cfg, the configuration that now applies to its key
// under its own rule version, when a runtime override (or a request's
// limit, see followInline) changed it since the bucket was last judged:
// the state is kept, clamped to the new capacity, as for a rule change.
// e.mu is held.
func (m *Map) follow(e *entry, cfg *bucket.Config, now int64) {
	if e.cfg == cfg {
		return
	}
	if e.cfg != nil && *e.cfg != *cfg && e.cfg.Algorithm == cfg.Algorithm {
		before := e.bytes()
		e.b.Reconfigure(e.cfg, cfg, now)
		m.charge(e.rule, e.bytes()-before)
	}
	e.cfg = cfg
}

// followInline is follow to a request's limit: e keeps a copy of src
// (which stays the caller's) while requests bring that limit, and
// returns it. e.mu is held.
func (m *Map) followInline(e *entry, src *bucket.Config, now int64) *bucket.Config {
	if e.inl != nil && e.cfg == e.inl && *e.inl == *src {
		return e.inl
	}
	next := new(bucket.Config) // a new one: e.cfg may be e.inl
	*next = *src
	m.follow(e, next, now)
	e.inl = next
	return next
}

// config is the configuration e is judged by, for its key: the limit of
// the request that last acquired from it when that request carried one
// (see AcquireInline), else its rule's for key. Settlements (commits,
// refills) and idle checks use it, so that they never resize the bucket
// of a request's limit back to the rule's. e.mu is held.
func (e *entry) config(key string) *bucket.Config {
	if e.inl != nil && e.cfg == e.inl && e.rule.ConfigFor(key) == &e.rule.Config {
		return e.inl
	}
	return e.rule.ConfigFor(key)
}
