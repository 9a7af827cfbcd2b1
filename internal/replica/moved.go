package replica

import (
	"fmt"
)

// Has reports whether the Store keeps a copy of key's bucket of
// ruleName. It costs one atomic load while the Store is empty.
func (s *Store) Has(ruleName, key string) bool {
	if s.n.Load() == 0 {
		return false
	}
	str := &s.stripes[s.stripeOf(key)]
	str.mu.Lock()
	defer str.mu.Unlock()
	_, ok := str.m[Ref{ruleName, key}]
	return ok
}

// InstallMoved installs into the bucket map the copy of every key that
// moved selects (the view gives it to another member than before, or,
// after a start, to another member than this node), so that the node's
// handoff, which sends the buckets of keys the view gives to others,
// carries it to the key's owner. Nothing else would: a copy is only
// installed when its holder decides for its key, and after a restart of
// every node a key's owner may be a node that holds no copy of it (a
// member was added, or the order of members changed). The owner keeps
// whichever of the copy and its own bucket has fewer permits left
// (shard.Map.Import), so a copy older than the owner's state changes
// nothing. A copy whose rule is gone, no longer durable, of another
// generation, or older than its window stays for Prune. It returns the
// copies installed.
func (r *Replicator) InstallMoved(moved func(ruleName, key string) bool) (int64, error) {
	var picked []Copy
	r.Store.Range(func(c Copy) bool {
		if moved(c.State.Rule, c.State.Key) {
			picked = append(picked, c)
		}
		return true
	})
	t, now := r.l.Table(), r.l.Now()
	var n int64
	for _, c := range picked {
		rc := t.Get(c.State.Rule)
		if rc == nil || !rc.Rule.Durable || r.stale(rc, c, now) {
			continue
		}
		ok, err := r.l.Buckets.Import(t, c.State, c.At)
		if err != nil {
			return n, fmt.Errorf("install moved copy of rule %q: %w", c.State.Rule, err)
		}
		if ok {
			r.Store.takeAt(c.State.Rule, c.State.Key, c.At)
			n++
		}
	}
	return n, nil
}

// takeAt removes the copy of key's bucket of ruleName if it is still the
// one taken at at (a newer copy that came since stays).
func (s *Store) takeAt(ruleName, key string, at int64) {
	str := &s.stripes[s.stripeOf(key)]
	str.mu.Lock()
	defer str.mu.Unlock()
	r := Ref{ruleName, key}
	if v, ok := str.m[r]; ok && v.at == at {
		delete(str.m, r)
		s.n.Add(-1)
		s.release(v.size(key))
	}
}
