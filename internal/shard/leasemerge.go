package shard

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/tokenserver/tokenserver/internal/bucket"
)

// Concurrency buckets that meet on import (export.go) are merged lease by
// lease rather than one kept whole: a lease granted by the old owner and
// one granted here while the state was on its way are both in flight, and
// each is released by name, so a bucket that kept only one side's leases
// would admit past the limit and answer the other side's releases with 0
// while they still hold their permits. The bucket package offers no merge,
// so this one works on MarshalState's encoding of a concurrency bucket
// (version, algorithm, last, then each lease's id, permits and expiry,
// ordered by expiry; times relative to the encoder's now), which
// TestUnionLeases pins against bucket.UnmarshalState.

// leaseRec is one lease of a concurrency state, its expiry relative.
type leaseRec struct {
	id      uint64
	permits int64
	expires int64
}

// unionLeases returns a concurrency bucket judged by c holding the leases
// of a and of b (both judged by concurrency configurations) as of now,
// each lease once: a lease both hold (by id) keeps the later expiry and
// the larger permits. At most bucket.MaxConcurrencyLimit leases are kept,
// those that expire last.
func unionLeases(c *bucket.Config, a *bucket.Config, ab bucket.Bucket, b *bucket.Config, bb bucket.Bucket, now int64) (bucket.Bucket, error) {
	ea, err := bucket.MarshalState(a, ab, now)
	if err != nil {
		return nil, err
	}
	eb, err := bucket.MarshalState(b, bb, now)
	if err != nil {
		return nil, err
	}
	la, lastA, err := decodeLeases(ea)
	if err != nil {
		return nil, err
	}
	lb, lastB, err := decodeLeases(eb)
	if err != nil {
		return nil, err
	}
	byID := make(map[uint64]int, len(la)+len(lb))
	all := make([]leaseRec, 0, len(la)+len(lb))
	for _, l := range slices.Concat(la, lb) {
		if i, ok := byID[l.id]; ok {
			all[i].expires = max(all[i].expires, l.expires)
			all[i].permits = max(all[i].permits, l.permits)
			continue
		}
		byID[l.id] = len(all)
		all = append(all, l)
	}
	slices.SortStableFunc(all, func(x, y leaseRec) int { return cmp.Compare(x.expires, y.expires) })
	if len(all) > bucket.MaxConcurrencyLimit {
		all = all[len(all)-bucket.MaxConcurrencyLimit:]
	}
	out := []byte{ea[0], ea[1]}
	out = binary.AppendVarint(out, max(lastA, lastB))
	out = binary.AppendUvarint(out, uint64(len(all)))
	for _, l := range all {
		out = binary.AppendUvarint(out, l.id)
		out = binary.AppendVarint(out, l.permits)
		out = binary.AppendVarint(out, l.expires)
	}
	return bucket.UnmarshalState(c, out, now)
}

// decodeLeases reads a concurrency state's leases and its last time.
func decodeLeases(st []byte) ([]leaseRec, int64, error) {
	bad := fmt.Errorf("%w: not a concurrency state", bucket.ErrBadState)
	if len(st) < 2 || bucket.Algorithm(st[1]) != bucket.Concurrency {
		return nil, 0, bad
	}
	buf := st[2:]
	varint := func() int64 {
		v, n := binary.Varint(buf)
		if n <= 0 {
			buf = nil
			return 0
		}
		buf = buf[n:]
		return v
	}
	uvarint := func() (uint64, bool) {
		v, n := binary.Uvarint(buf)
		if n <= 0 {
			return 0, false
		}
		buf = buf[n:]
		return v, true
	}
	if len(buf) == 0 {
		return nil, 0, bad
	}
	last := varint()
	n, ok := uvarint()
	if !ok || n > bucket.MaxConcurrencyLimit {
		return nil, 0, bad
	}
	out := make([]leaseRec, 0, n)
	for range n {
		id, ok := uvarint()
		if !ok || len(buf) == 0 {
			return nil, 0, bad
		}
		p := varint()
		if len(buf) == 0 {
			return nil, 0, bad
		}
		e := varint()
		if buf == nil {
			return nil, 0, bad
		}
		out = append(out, leaseRec{id: id, permits: p, expires: e})
	}
	if len(buf) != 0 {
		return nil, 0, bad
	}
	return out, last, nil
}
