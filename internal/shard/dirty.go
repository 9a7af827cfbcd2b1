package shard

import (
	"strings"
	"sync"

	"github.com/tokenserver/tokenserver/internal/rule"
)

// Dirty marks: a decision on a durable rule's bucket (Acquire and its
// variants) marks the bucket's entry dirty, once until the mark is taken,
// and puts the entry on its shard's dirty list. Replication of durable
// rules (internal/replica) takes the lists every replication interval and
// exports each entry it finds there directly, so that the decision path
// pays one flag check for a bucket already marked, and the replication
// tick neither keeps a set of keys nor looks each key up again.

// dirtyList is one shard's entries marked dirty since the last TakeDirty.
type dirtyList struct {
	mu sync.Mutex
	es []*entry
}

// markDirty puts e on sh's dirty list unless it is marked already. e.mu
// is held (a decision on e happened under it before the mark).
func (sh *shard) markDirty(e *entry) {
	if e.dirty.Load() || !e.dirty.CompareAndSwap(false, true) {
		return
	}
	sh.dirty.mu.Lock()
	sh.dirty.es = append(sh.dirty.es, e)
	sh.dirty.mu.Unlock()
}

// Dirty is a bucket that changed in a decision on a durable rule since
// it was last taken by TakeDirty. Its state is read with Export.
type Dirty struct {
	e  *entry
	sh *shard
}

// Rule is the name of the bucket's rule.
func (d Dirty) Rule() string {
	name, _, _ := strings.Cut(d.e.key, "\x00")
	return name
}

// Key is the bucket's key.
func (d Dirty) Key() string {
	_, key, _ := strings.Cut(d.e.key, "\x00")
	return key
}

// Export is the bucket's state as of now, as ExportKey gives it; false
// when the bucket is gone (evicted back at its initial state: it has
// nothing to keep).
func (d Dirty) Export(now int64) (BucketState, bool, error) {
	e := d.e
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.rule == nil {
		return BucketState{}, false, nil
	}
	s, err := e.export(d.Key(), now)
	if err != nil {
		return BucketState{}, false, err
	}
	return s, true, nil
}

// TakeDirty removes every bucket marked dirty from the dirty lists and
// appends it to out, clearing its mark: a decision after TakeDirty marks
// it again. Read their states (Dirty.Export) after TakeDirty returns: a
// state read then includes every decision whose mark TakeDirty took.
func (m *Map) TakeDirty(out []Dirty) []Dirty {
	for i := range m.shards {
		sh := &m.shards[i]
		sh.dirty.mu.Lock()
		es := sh.dirty.es
		sh.dirty.es = nil
		sh.dirty.mu.Unlock()
		for _, e := range es {
			e.dirty.Store(false)
			out = append(out, Dirty{e: e, sh: sh})
		}
	}
	return out
}

// MarkDirty marks d again (its replication failed); a no-op when it is
// marked already or gone.
func (m *Map) MarkDirty(d Dirty) {
	d.e.mu.Lock()
	if d.e.rule != nil {
		d.sh.markDirty(d.e)
	}
	d.e.mu.Unlock()
}

// DirtyLen is the number of buckets marked dirty and not yet taken.
func (m *Map) DirtyLen() int {
	n := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.dirty.mu.Lock()
		n += len(sh.dirty.es)
		sh.dirty.mu.Unlock()
	}
	return n
}

// MarkKey marks key's bucket of the rule named ruleName dirty, as a
// decision on a durable rule does (for changes outside a decision, such
// as an install of another node's copy); false when the Map holds no
// such bucket.
func (m *Map) MarkKey(ruleName, key string) bool {
	var arr [rule.MaxNameLen + 1 + rule.MaxKeyLen]byte
	if len(ruleName) > rule.MaxNameLen || len(key) > rule.MaxKeyLen {
		return false
	}
	bk := bucketKey(arr[:0], ruleName, key)
	sh, h := m.shardOf(bk)
	e := m.lookup(sh, h, bk)
	if e == nil {
		return false
	}
	sh.markDirty(e)
	e.mu.Unlock()
	return true
}

// Valid reports whether d names a bucket (the zero Dirty does not).
func (d Dirty) Valid() bool { return d.e != nil }
