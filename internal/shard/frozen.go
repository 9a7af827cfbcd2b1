package shard

import "github.com/tokenserver/tokenserver/internal/rule"

// FrozenRef names a bucket that HandOver froze and exported: its rule,
// its key and the mark of that HandOver (BucketState.Frozen).
type FrozenRef struct {
	Rule, Key string
	Mark      uint64
}

// Ref is the FrozenRef of the bucket s was exported from by HandOver.
func (s BucketState) Ref() FrozenRef { return FrozenRef{Rule: s.Rule, Key: s.Key, Mark: s.Frozen} }

// DropFrozen drops the buckets refs name, each only while it is still
// frozen by the HandOver its ref marks: the key's new owner acknowledged
// the state, so the frozen copy here would only linger (until an idle
// sweep, which for a daily quota can be a day) and hold memory. A bucket
// that was thawed (Thaw) or installed back (Import) since, or frozen
// again by a later HandOver whose handoff is still on its way, is kept.
// Grants of a dropped bucket give nothing back here (as for any dropped
// bucket): they are settled on the new owner, which holds the state. It
// returns how many it dropped.
//
// Once dropped, a key that comes back here is no longer thawed from the
// state it left with: its state comes back from the owner that holds it
// (a handoff back, which the receiver expects), or, should that owner
// fail first, the key starts fresh here, as any key of a failed owner.
func (m *Map) DropFrozen(refs []FrozenRef) int {
	n := 0
	var arr [rule.MaxNameLen + 1 + rule.MaxKeyLen]byte
	for _, r := range refs {
		if r.Mark == 0 || len(r.Rule) > rule.MaxNameLen || len(r.Key) > rule.MaxKeyLen {
			continue
		}
		bk := bucketKey(arr[:0], r.Rule, r.Key)
		sh, h := m.shardOf(bk)
		sh.mu.Lock() // drop takes the entry out of the index: shard, then bucket, as Sweep
		if e := m.lookup(sh, h, bk); e != nil {
			if e.moved && e.frozen == r.Mark {
				m.drop(sh, e)
				n++
			}
			e.mu.Unlock()
		}
		sh.mu.Unlock()
	}
	return n
}
