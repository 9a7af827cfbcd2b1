package shard

// ReserveBytes counts n bytes that the node holds for the Map's sake
// outside it, such as the copies of other nodes' durable buckets
// (internal/replica), against the bucket memory budget: false, and
// nothing counted, when they do not fit. Bytes includes them until
// ReleaseBytes gives them back. Without a budget it always succeeds.
func (m *Map) ReserveBytes(n int64) bool {
	if n <= 0 {
		return true
	}
	if used := m.used.Add(n); m.budget > 0 && used > m.budget {
		m.used.Add(-n)
		return false
	}
	return true
}

// ReleaseBytes gives back n bytes counted by ReserveBytes.
func (m *Map) ReleaseBytes(n int64) {
	if n > 0 {
		m.used.Add(-n)
	}
}
