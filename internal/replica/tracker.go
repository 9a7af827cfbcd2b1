// Package replica keeps the buckets of durable rules through owner crashes
// and full restarts: it tracks the buckets an owner changed, sends them in
// batches to each key's next owner, stores the copies it receives, and
// checkpoints both to the data dir.
package replica

import (
	"hash/maphash"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/tokenserver/tokenserver/internal/shard"
)

// Ref names one bucket: a rule and a key.
type Ref struct{ Rule, Key string }

// stripes is the number of independently locked parts of a Tracker and a
// Store (a power of two).
const stripes = 64

// Tracker is the dirty set of durable buckets and, per rule, the permits
// admitted since the last acknowledged replication (the replication lag).
// Safe for simultaneous use by multiple goroutines. Build it with
// NewTracker.
//
// The dirty set has two parts. Decisions on durable rules mark their
// bucket in the bucket map itself (shard.Map.TakeDirty): one flag check
// per decision on a bucket already marked, and Tick reads each marked
// bucket without looking its key up again. Changes outside a decision
// (refills, commits, renewals, a resync to a new next owner) name their
// bucket by rule and key (Touch); those are few.
type Tracker struct {
	seed    maphash.Seed
	stripes [stripes]trackStripe
	// src is the bucket map whose marks are part of the dirty set; nil
	// for a Tracker of names alone.
	src *shard.Map

	// lags holds, per rule, the permits admitted and not yet taken: a
	// map replaced on a rule's first permits (copy on write), so that a
	// decision adds without a lock. Counters are never removed (a
	// counter a Touch holds could otherwise lose its permits); there is
	// one per durable rule name this process has admitted on.
	lags  atomic.Pointer[map[string]*lagCounter]
	lagMu sync.Mutex

	mu       sync.Mutex
	inflight map[string]int64 // taken by Take, not yet acknowledged
}

type trackStripe struct {
	mu    sync.Mutex
	dirty map[Ref]struct{}
	_     [48]byte // keep stripes on their own cache lines
}

// lagCounter is one rule's permits not yet taken, on its own cache line.
type lagCounter struct {
	n atomic.Int64
	_ [56]byte
}

// NewTracker returns an empty Tracker of buckets named by rule and key.
func NewTracker() *Tracker { return newTracker(nil) }

// newTracker returns an empty Tracker whose dirty set includes the
// buckets src marks (nil: none).
func newTracker(src *shard.Map) *Tracker {
	t := &Tracker{seed: maphash.MakeSeed(), src: src, inflight: map[string]int64{}}
	for i := range t.stripes {
		t.stripes[i].dirty = map[Ref]struct{}{}
	}
	t.lags.Store(&map[string]*lagCounter{})
	return t
}

// Touch marks key's bucket of ruleName changed, having admitted permits
// (0 for a change that admitted nothing, such as an install).
func (t *Tracker) Touch(ruleName, key string, permits int64) {
	s := &t.stripes[maphash.String(t.seed, key)&(stripes-1)]
	s.mu.Lock()
	s.dirty[Ref{ruleName, key}] = struct{}{}
	s.mu.Unlock()
	t.addLag(ruleName, permits) // after the mark: Take takes the lag first
}

// addLag adds permits admitted in a bucket of ruleName that is marked
// dirty already (by Touch, or by the decision in the bucket map).
func (t *Tracker) addLag(ruleName string, permits int64) {
	if permits > 0 {
		t.counter(ruleName).n.Add(permits)
	}
}

func (t *Tracker) counter(ruleName string) *lagCounter {
	if c, ok := (*t.lags.Load())[ruleName]; ok {
		return c
	}
	t.lagMu.Lock()
	defer t.lagMu.Unlock()
	old := *t.lags.Load()
	if c, ok := old[ruleName]; ok {
		return c
	}
	m := maps.Clone(old)
	c := new(lagCounter)
	m[ruleName] = c
	t.lags.Store(&m)
	return c
}

// Taken is what one Take removed from the Tracker: the changed buckets and
// the permits admitted in them, per rule. Hand it back with Ack once the
// buckets are replicated, or Requeue when they could not be.
type Taken struct {
	// Refs are the buckets named by rule and key (Touch).
	Refs []Ref
	// Marked are the buckets the bucket map marked; none in Refs.
	Marked  []shard.Dirty
	Permits map[string]int64
}

// Take removes every changed bucket from the dirty set. It takes the lag
// before the marks, and the states are read after Take returns: so every
// permit it takes was admitted in a bucket whose state goes out with it
// (a decision marks its bucket before its permits count).
func (t *Tracker) Take() Taken {
	out := Taken{Permits: map[string]int64{}}
	t.mu.Lock()
	for r, c := range *t.lags.Load() {
		if p := c.n.Swap(0); p != 0 {
			out.Permits[r] += p
			t.inflight[r] += p
		}
	}
	t.mu.Unlock()
	for i := range t.stripes {
		s := &t.stripes[i]
		s.mu.Lock()
		out.Refs = slices.Grow(out.Refs, len(s.dirty))
		for r := range s.dirty {
			out.Refs = append(out.Refs, r)
		}
		clear(s.dirty)
		s.mu.Unlock()
	}
	if t.src != nil {
		out.Marked = t.src.TakeDirty(out.Marked)
		if len(out.Refs) > 0 && len(out.Marked) > 0 {
			out.Refs = t.unmarked(out.Refs, out.Marked)
		}
	}
	return out
}

// unmarked returns the refs that are not among marked: those buckets go
// out once, read through their mark.
func (t *Tracker) unmarked(refs []Ref, marked []shard.Dirty) []Ref {
	named := make(map[Ref]struct{}, len(refs))
	for _, r := range refs {
		named[r] = struct{}{}
	}
	for _, d := range marked {
		delete(named, Ref{d.Rule(), d.Key()})
	}
	if len(named) == len(refs) {
		return refs
	}
	out := refs[:0]
	for _, r := range refs {
		if _, ok := named[r]; ok {
			out = append(out, r)
		}
	}
	return out
}

// Ack records that tk's buckets are replicated: their permits leave the
// lag.
func (t *Tracker) Ack(tk Taken) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for r, p := range tk.Permits {
		if t.inflight[r] -= p; t.inflight[r] <= 0 {
			delete(t.inflight, r)
		}
	}
}

// Requeue puts refs and marked back into the dirty set (they could not
// be replicated) and tk's permits back into the lag as not yet taken;
// refs and marked may be parts of tk's, the permits are all tk's (the
// lag stays an upper bound).
func (t *Tracker) Requeue(tk Taken, refs []Ref, marked ...shard.Dirty) {
	for _, r := range refs {
		t.Touch(r.Rule, r.Key, 0)
	}
	for _, d := range marked {
		t.src.MarkDirty(d)
	}
	for r, p := range tk.Permits {
		t.addLag(r, p) // before Ack: the lag never dips below it
	}
	t.Ack(tk)
}

// LagPermits is the replication lag of the rule named ruleName: the
// permits this node admitted in durable buckets since their last
// acknowledged replication. It is what a crash of this node could admit
// twice (the successor continues from the older copy).
func (t *Tracker) LagPermits(ruleName string) int64 {
	var sum int64
	if c, ok := (*t.lags.Load())[ruleName]; ok {
		sum += c.n.Load()
	}
	t.mu.Lock()
	sum += t.inflight[ruleName]
	t.mu.Unlock()
	return sum
}

// Dirty is the number of changed buckets not yet taken (a bucket both
// named and marked may count twice).
func (t *Tracker) Dirty() int {
	n := 0
	for i := range t.stripes {
		s := &t.stripes[i]
		s.mu.Lock()
		n += len(s.dirty)
		s.mu.Unlock()
	}
	if t.src != nil {
		n += t.src.DirtyLen()
	}
	return n
}
