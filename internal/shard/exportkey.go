package shard

import "github.com/tokenserver/tokenserver/internal/rule"

// ExportKey is Export for one bucket: the state of key's bucket under the
// rule named ruleName as of now, and false when the Map holds none (it was
// never made or was evicted back at its initial state). Replication of
// durable rules (internal/replica) sends the buckets that changed this
// way, without scanning the Map.
func (m *Map) ExportKey(ruleName, key string, now int64) (BucketState, bool, error) {
	var arr [rule.MaxNameLen + 1 + rule.MaxKeyLen]byte
	if len(ruleName) > rule.MaxNameLen || len(key) > rule.MaxKeyLen {
		return BucketState{}, false, nil
	}
	bk := bucketKey(arr[:0], ruleName, key)
	sh, h := m.shardOf(bk)
	e := m.lookup(sh, h, bk)
	if e == nil {
		return BucketState{}, false, nil
	}
	defer e.mu.Unlock()
	s, err := e.export(key, now)
	if err != nil {
		return BucketState{}, false, err
	}
	return s, true, nil
}
