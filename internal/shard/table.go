package shard

import (
	"hash/maphash"
	"sync/atomic"
)

// table is one shard's index from bucket key to entry: open addressing with
// linear probing over atomic slots, so that lookups are lock-free reads and
// write no shared cache line; inserts, deletes and growth happen under the
// shard's mutex. Go's map cannot be read while another goroutine writes it,
// and sync.Map costs about 35 bytes more per key (measured: 177 B against
// 143 B per token-bucket key), hence this small structure.
//
// A deleted slot holds the tombstone, so probe chains stay intact; growth
// (or a rehash that drops tombstones) builds a new table and swaps it in.
// A reader still walking the old table may find an entry deleted since:
// entries carry a dead flag, checked under the entry's lock.
type table struct {
	slots []atomic.Pointer[entry]
	mask  uint64
}

// tombstone marks a deleted slot.
var tombstone = &entry{}

func newTable(size int) *table {
	return &table{slots: make([]atomic.Pointer[entry], size), mask: uint64(size - 1)}
}

// find returns the entry of key bk, or nil. It takes no lock.
func (t *table) find(h uint64, bk []byte) *entry {
	for i := h & t.mask; ; i = (i + 1) & t.mask {
		e := t.slots[i].Load()
		if e == nil {
			return nil
		}
		if e != tombstone && e.key == string(bk) {
			return e
		}
	}
}

// minTable is the initial slot count of a shard.
const minTable = 8

// insert adds e (whose key is not in the table); sh.mu is held.
func (sh *shard) insert(seed maphash.Seed, h uint64, e *entry) {
	t := sh.tab.Load()
	if (sh.used+1)*4 > len(t.slots)*3 { // keep load under 3/4: probes end
		t = sh.rehash(seed, max(minTable, 1<<bitsFor(2*(sh.live+1))))
	}
	for i := h & t.mask; ; i = (i + 1) & t.mask {
		switch t.slots[i].Load() {
		case nil:
			sh.used++
			fallthrough
		case tombstone:
			t.slots[i].Store(e)
			sh.live++
			return
		}
	}
}

// remove deletes e's slot; sh.mu is held.
func (sh *shard) remove(h uint64, e *entry) {
	t := sh.tab.Load()
	for i := h & t.mask; ; i = (i + 1) & t.mask {
		p := t.slots[i].Load()
		if p == nil {
			return
		}
		if p == e {
			t.slots[i].Store(tombstone)
			sh.live--
			return
		}
	}
}

// rehash builds a table of size slots holding the live entries and swaps
// it in; sh.mu is held.
func (sh *shard) rehash(seed maphash.Seed, size int) *table {
	old := sh.tab.Load()
	t := newTable(size)
	for i := range old.slots {
		e := old.slots[i].Load()
		if e == nil || e == tombstone {
			continue
		}
		for j := maphash.String(seed, e.key) & t.mask; ; j = (j + 1) & t.mask {
			if t.slots[j].Load() == nil {
				t.slots[j].Store(e)
				break
			}
		}
	}
	sh.used = sh.live
	sh.tab.Store(t)
	return t
}

// bitsFor returns the number of bits needed for n.
func bitsFor(n int) int {
	b := 0
	for ; 1<<b < n; b++ {
	}
	return b
}
