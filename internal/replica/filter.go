package replica

import (
	"math/bits"
	"sync/atomic"
)

// keyFilter is one Store stripe's set of the keys it may hold a copy of:
// one bit per key hash, set under the stripe's lock by every copy put,
// read without the lock by Take. A clear bit means no copy, so a
// decision on a key this node keeps no copy of (the common case: copies
// are of other nodes' keys) costs a hash and an atomic load instead of
// the stripe's lock and a map lookup. Bits are never cleared in place
// (several keys share one); the stripe rebuilds its filter from its map
// when Range walks it, and a bigger one when it fills. A hand-written
// one-hash Bloom filter: the library ones are not safe for a reader
// without a lock.
type keyFilter struct {
	words []uint64 // a power of two of them
}

// minFilterWords is the smallest filter: 4,096 bits.
const minFilterWords = 64

// newKeyFilter returns an empty filter sized for n keys (16 bits a key).
func newKeyFilter(n int) *keyFilter {
	w := max(minFilterWords, 1<<bits.Len(uint(n*16/64)))
	return &keyFilter{words: make([]uint64, w)}
}

// slot is the word and bit of hash h (the stripe already used h's low bits).
func (f *keyFilter) slot(h uint64) (int, uint64) {
	i := (h >> 8) & uint64(len(f.words)*64-1)
	return int(i / 64), 1 << (i % 64)
}

// add sets h's bit.
func (f *keyFilter) add(h uint64) {
	w, b := f.slot(h)
	atomic.OrUint64(&f.words[w], b)
}

// mayHave reports whether h's bit is set.
func (f *keyFilter) mayHave(h uint64) bool {
	w, b := f.slot(h)
	return atomic.LoadUint64(&f.words[w])&b != 0
}

// full reports whether a stripe of n keys should rebuild f bigger (more
// than one key per 8 bits).
func (f *keyFilter) full(n int) bool { return n*8 > len(f.words)*64 }
