package shard

import "github.com/tokenserver/tokenserver/internal/rule"

// LocalRules returns the compiled rule named name among the rules a node
// makes for itself rather than takes from the rule table (the Envoy
// counters' rules, internal/server), or nil when name is none of them.
// It is called concurrently with everything else, and for a name the
// node decides on it returns a rule of the same generation (and, ideally,
// the same *rule.Compiled) as its decisions use.
type LocalRules func(name string) *rule.Compiled

// SetLocalRules makes Import install buckets of the rules f knows when
// the rule table does not hold them: such buckets live in the Map like
// any other, and move with their keys (HandOver), so their new owner must
// find their rule too. nil forgets f.
func (m *Map) SetLocalRules(f LocalRules) {
	if f == nil {
		m.local.Store(nil)
		return
	}
	m.local.Store(&f)
}

// localRule is the LocalRules' rule named name, nil if none.
func (m *Map) localRule(name string) *rule.Compiled {
	f := m.local.Load()
	if f == nil {
		return nil
	}
	return (*f)(name)
}
