package replica

import (
	"hash/maphash"
	"sync"
	"sync/atomic"

	"github.com/tokenserver/tokenserver/internal/shard"
)

// MaxCopies bounds the copies a Store holds; past it new keys' copies
// are dropped (those keys would start fresh after a crash of their
// owner, as without durability).
const MaxCopies = 2_000_000

// Copy is one bucket as another node (or a checkpoint) last sent it.
type Copy struct {
	// State is the bucket; its times are relative to At.
	State shard.BucketState
	// At is this node's clock (the shard's) when the state was taken.
	At int64
}

// Store holds the copies of buckets this node keeps for others: the
// replicas that owners send and the buckets read back from a checkpoint.
// Safe for simultaneous use by multiple goroutines. Build it with
// NewStore.
type Store struct {
	seed    maphash.Seed
	n       atomic.Int64
	stripes [stripes]storeStripe
}

type storeStripe struct {
	mu sync.Mutex
	m  map[Ref]Copy
}

// NewStore returns an empty Store.
func NewStore() *Store {
	s := &Store{seed: maphash.MakeSeed()}
	for i := range s.stripes {
		s.stripes[i].m = map[Ref]Copy{}
	}
	return s
}

func (s *Store) stripe(key string) *storeStripe {
	return &s.stripes[maphash.String(s.seed, key)&(stripes-1)]
}

// Put stores c, replacing an older copy of the same bucket; false when
// the Store is full.
func (s *Store) Put(c Copy) bool {
	r := Ref{c.State.Rule, c.State.Key}
	st := s.stripe(r.Key)
	st.mu.Lock()
	defer st.mu.Unlock()
	old, ok := st.m[r]
	switch {
	case ok && old.At > c.At:
		return true
	case !ok && s.n.Load() >= MaxCopies:
		return false
	case !ok:
		s.n.Add(1)
	}
	st.m[r] = c
	return true
}

// Take removes and returns the copy of key's bucket of ruleName. It costs
// one atomic load while the Store is empty.
func (s *Store) Take(ruleName, key string) (Copy, bool) {
	if s.n.Load() == 0 {
		return Copy{}, false
	}
	st := s.stripe(key)
	st.mu.Lock()
	defer st.mu.Unlock()
	c, ok := st.m[Ref{ruleName, key}]
	if ok {
		delete(st.m, Ref{ruleName, key})
		s.n.Add(-1)
	}
	return c, ok
}

// Len is the number of copies held.
func (s *Store) Len() int64 { return s.n.Load() }

// Range calls fn with every copy, one stripe locked at a time (fn must not
// call the Store); fn returns false to drop the copy.
func (s *Store) Range(fn func(Copy) (keep bool)) {
	for i := range s.stripes {
		st := &s.stripes[i]
		st.mu.Lock()
		for r, c := range st.m {
			if !fn(c) {
				delete(st.m, r)
				s.n.Add(-1)
			}
		}
		st.mu.Unlock()
	}
}
