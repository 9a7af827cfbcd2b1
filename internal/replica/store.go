package replica

import (
	"hash/maphash"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
	"github.com/tokenserver/tokenserver/internal/shard"
)

// CopyShare is the part of the node's bucket memory budget
// (--max-bucket-memory), in percent, that copies of other nodes' durable
// buckets may take. Their bytes count against the budget itself, so
// that copies and the node's own buckets together stay within it; the
// share keeps copies from crowding out the node's own buckets.
const CopyShare = 25

// DefaultMaxCopyBytes caps a Store's bytes when the node has no bucket
// memory budget.
const DefaultMaxCopyBytes = 512 << 20

// Copy is one bucket as another node (or a checkpoint) last sent it.
type Copy struct {
	// State is the bucket; its times are relative to At.
	State shard.BucketState
	// At is this node's clock (the shard's) when the state was taken.
	At int64
}

// Budget is the memory budget copies count against: *shard.Map.
type Budget interface {
	// ReserveBytes counts n bytes; false (nothing counted) when they do
	// not fit.
	ReserveBytes(n int64) bool
	// ReleaseBytes gives back n bytes counted by ReserveBytes.
	ReleaseBytes(n int64)
}

// Store holds the copies of buckets this node keeps for others: the
// replicas that owners send and the buckets read back from a checkpoint.
// It holds at most its byte limit (an estimate of the heap the copies
// take), counted against the node's Budget: a copy of a new key that
// does not fit is dropped, and the key is remembered as dropped (Dropped)
// until a copy of it fits or its window passes. Safe for simultaneous
// use by multiple goroutines. Build it with NewStore.
type Store struct {
	seed    maphash.Seed
	limit   int64
	budget  Budget
	n       atomic.Int64
	bytes   atomic.Int64
	stripes [stripes]storeStripe

	internMu sync.Mutex
	names    map[string]string // rule names, shared by every copy

	drops dropSet
}

type storeStripe struct {
	mu sync.Mutex
	m  map[Ref]stored
}

// stateInline is the most state bytes a stored copy holds without a heap
// allocation (a token bucket takes 12 to 30).
const stateInline = 39

// stored is a Copy as the Store keeps it: the rule and key are the map's
// key, short states sit inline, and the rarely present parts are behind
// one pointer, so that a million copies hold few pointers for the
// garbage collector to scan.
type stored struct {
	at, penalty, refillFloor int64
	gen, seq, first          uint64
	n                        uint8 // len(state) when inline
	state                    [stateInline]byte
	ext                      *storedExt
}

// storedExt is what few copies have.
type storedExt struct {
	state    []byte // when longer than stateInline
	refilled []shard.RefilledGrant
	inline   *rule.InlineLimit
}

// slotBytes is what one copy costs besides its key and its storedExt:
// its map slot (Ref and stored) at the map's typical load.
var slotBytes = int64(unsafe.Sizeof(Ref{})+unsafe.Sizeof(stored{})+1) * 8 / 5

// size is the bytes a copy of key holding s takes.
func (s *stored) size(key string) int64 {
	n := slotBytes + bucket.AllocBytes(int64(len(key)))
	if x := s.ext; x != nil {
		n += int64(unsafe.Sizeof(storedExt{})) + bucket.AllocBytes(int64(len(x.state))) +
			bucket.AllocBytes(int64(len(x.refilled))*int64(unsafe.Sizeof(shard.RefilledGrant{})))
		if x.inline != nil {
			n += int64(unsafe.Sizeof(rule.InlineLimit{}))
		}
	}
	return n
}

func toStored(c Copy) stored {
	s := stored{at: c.At, penalty: c.State.PenaltyLeft, refillFloor: c.State.RefillFloor, gen: c.State.Generation,
		seq: c.State.Seq, first: c.State.First}
	long := len(c.State.State) > stateInline
	if !long {
		s.n = uint8(copy(s.state[:], c.State.State))
	}
	if !long && len(c.State.Refilled) == 0 && c.State.Inline == nil {
		return s
	}
	x := &storedExt{}
	if long {
		x.state = append([]byte(nil), c.State.State...)
	}
	if len(c.State.Refilled) > 0 {
		x.refilled = append([]shard.RefilledGrant(nil), c.State.Refilled...)
	}
	if c.State.Inline != nil {
		l := *c.State.Inline
		x.inline = &l
	}
	s.ext = x
	return s
}

func (s *stored) copy(r Ref) Copy {
	c := Copy{At: s.at, State: shard.BucketState{Rule: r.Rule, Key: r.Key, Generation: s.gen, Seq: s.seq, First: s.first,
		PenaltyLeft: s.penalty, RefillFloor: s.refillFloor}}
	if x := s.ext; x != nil {
		c.State.State, c.State.Refilled, c.State.Inline = x.state, x.refilled, x.inline
	}
	if c.State.State == nil {
		c.State.State = append([]byte(nil), s.state[:s.n]...)
	}
	return c
}

// NewStore returns an empty Store that holds at most maxBytes of copies
// (DefaultMaxCopyBytes when 0), counted against budget (none when nil).
func NewStore(maxBytes int64, budget Budget) *Store {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxCopyBytes
	}
	s := &Store{seed: maphash.MakeSeed(), limit: maxBytes, budget: budget, names: map[string]string{}}
	for i := range s.stripes {
		s.stripes[i].m = map[Ref]stored{}
	}
	s.drops.m = map[Ref]int64{}
	return s
}

func (s *Store) stripeOf(key string) int {
	return int(maphash.String(s.seed, key) & (stripes - 1))
}

// maxNames bounds the rule names the Store shares among copies.
const maxNames = 4096

// intern returns the Store's string equal to name, so that copies of
// one rule share their rule name.
func (s *Store) intern(name string) string {
	s.internMu.Lock()
	defer s.internMu.Unlock()
	if v, ok := s.names[name]; ok {
		return v
	}
	if len(s.names) < maxNames {
		name = string([]byte(name)) // not a part of a larger buffer
		s.names[name] = name
	}
	return name
}

// reserve counts n more bytes against the limit and the budget.
func (s *Store) reserve(n int64) bool {
	if n <= 0 {
		s.release(-n)
		return true
	}
	if s.bytes.Add(n) > s.limit {
		s.bytes.Add(-n)
		return false
	}
	if s.budget != nil && !s.budget.ReserveBytes(n) {
		s.bytes.Add(-n)
		return false
	}
	return true
}

func (s *Store) release(n int64) {
	if n <= 0 {
		return
	}
	s.bytes.Add(-n)
	if s.budget != nil {
		s.budget.ReleaseBytes(n)
	}
}

// Put stores c, replacing an older copy of the same bucket; false when
// it does not fit (the copy, and any older one of the bucket, is then
// dropped).
func (s *Store) Put(c Copy) bool {
	return s.PutBatch([]Copy{c}) == 1
}

// PutBatch is Put for every copy of cs, locking each part of the Store
// once. It returns the copies stored.
func (s *Store) PutBatch(cs []Copy) int {
	var byStripe [stripes][]int32
	var idx [BatchBuckets]int32
	if len(cs) <= BatchBuckets {
		// Group by stripe in one pass, without allocating: count, then
		// place.
		var count [stripes + 1]int32
		var sts [BatchBuckets]uint8
		for i := range cs {
			st := s.stripeOf(cs[i].State.Key)
			sts[i] = uint8(st)
			count[st+1]++
		}
		for i := 1; i <= stripes; i++ {
			count[i] += count[i-1]
		}
		pos := count
		for i, st := range sts[:len(cs)] {
			idx[pos[st]] = int32(i)
			pos[st]++
		}
		for st := range stripes {
			byStripe[st] = idx[count[st]:count[st+1]]
		}
	} else {
		for i := range cs {
			st := s.stripeOf(cs[i].State.Key)
			byStripe[st] = append(byStripe[st], int32(i))
		}
	}
	n := 0
	var name, shared string
	for st := range byStripe {
		if len(byStripe[st]) == 0 {
			continue
		}
		var dropped []Ref
		str := &s.stripes[st]
		str.mu.Lock()
		for _, i := range byStripe[st] {
			c := &cs[i]
			if c.State.Rule != name {
				name, shared = c.State.Rule, s.intern(c.State.Rule)
			}
			r := Ref{shared, c.State.Key}
			old, had := str.m[r]
			if had && old.at > c.At {
				n++
				continue
			}
			v := toStored(*c)
			var oldSize int64
			if had {
				oldSize = old.size(r.Key)
			}
			if !s.reserve(v.size(r.Key) - oldSize) {
				if had {
					delete(str.m, r)
					s.n.Add(-1)
					s.release(oldSize)
				}
				dropped = append(dropped, r)
				continue
			}
			if !had {
				s.n.Add(1)
				if s.drops.len.Load() > 0 {
					s.drops.remove(r) // the key has a copy again
				}
			}
			str.m[r] = v
			n++
		}
		str.mu.Unlock()
		s.drops.add(dropped, cs[0].At)
	}
	return n
}

// Take removes and returns the copy of key's bucket of ruleName. It costs
// one atomic load while the Store is empty.
func (s *Store) Take(ruleName, key string) (Copy, bool) {
	if s.n.Load() == 0 {
		return Copy{}, false
	}
	str := &s.stripes[s.stripeOf(key)]
	str.mu.Lock()
	defer str.mu.Unlock()
	r := Ref{ruleName, key}
	v, ok := str.m[r]
	if !ok {
		return Copy{}, false
	}
	delete(str.m, r)
	s.n.Add(-1)
	s.release(v.size(key))
	return v.copy(r), true
}

// Len is the number of copies held.
func (s *Store) Len() int64 { return s.n.Load() }

// Bytes is the estimated memory the copies take, counted against the
// node's bucket memory budget.
func (s *Store) Bytes() int64 { return s.bytes.Load() }

// MaxBytes is the most Bytes may reach.
func (s *Store) MaxBytes() int64 { return s.limit }

// Range calls fn with every copy, one stripe locked at a time (fn must not
// call the Store); fn returns false to drop the copy.
func (s *Store) Range(fn func(Copy) (keep bool)) {
	for i := range s.stripes {
		st := &s.stripes[i]
		st.mu.Lock()
		for r, v := range st.m {
			if !fn(v.copy(r)) {
				delete(st.m, r)
				s.n.Add(-1)
				s.release(v.size(r.Key))
			}
		}
		st.mu.Unlock()
	}
}
