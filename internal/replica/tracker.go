// Package replica keeps the buckets of durable rules through owner crashes
// and full restarts: it tracks the buckets an owner changed, sends them in
// batches to each key's next owner, stores the copies it receives, and
// checkpoints both to the data dir.
package replica

import (
	"hash/maphash"
	"slices"
	"sync"
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
type Tracker struct {
	seed    maphash.Seed
	stripes [stripes]trackStripe

	mu       sync.Mutex
	inflight map[string]int64 // taken by Take, not yet acknowledged
}

type trackStripe struct {
	mu      sync.Mutex
	dirty   map[Ref]struct{}
	pending map[string]int64 // rule → permits admitted, not yet taken
	_       [40]byte         // keep stripes on their own cache lines
}

// NewTracker returns an empty Tracker.
func NewTracker() *Tracker {
	t := &Tracker{seed: maphash.MakeSeed(), inflight: map[string]int64{}}
	for i := range t.stripes {
		t.stripes[i].dirty = map[Ref]struct{}{}
		t.stripes[i].pending = map[string]int64{}
	}
	return t
}

// Touch marks key's bucket of ruleName changed, having admitted permits
// (0 for a change that admitted nothing, such as an install).
func (t *Tracker) Touch(ruleName, key string, permits int64) {
	s := &t.stripes[maphash.String(t.seed, key)&(stripes-1)]
	s.mu.Lock()
	s.dirty[Ref{ruleName, key}] = struct{}{}
	if permits > 0 {
		s.pending[ruleName] += permits
	}
	s.mu.Unlock()
}

// Taken is what one Take removed from the Tracker: the changed buckets and
// the permits admitted in them, per rule. Hand it back with Ack once the
// buckets are replicated, or Requeue when they could not be.
type Taken struct {
	Refs    []Ref
	Permits map[string]int64
}

// Take removes every changed bucket from the dirty set.
func (t *Tracker) Take() Taken {
	out := Taken{Permits: map[string]int64{}}
	for i := range t.stripes {
		s := &t.stripes[i]
		s.mu.Lock()
		out.Refs = slices.Grow(out.Refs, len(s.dirty))
		for r := range s.dirty {
			out.Refs = append(out.Refs, r)
		}
		clear(s.dirty)
		for r, p := range s.pending {
			out.Permits[r] += p
		}
		clear(s.pending)
		s.mu.Unlock()
	}
	t.mu.Lock()
	for r, p := range out.Permits {
		t.inflight[r] += p
	}
	t.mu.Unlock()
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

// Requeue puts refs back into the dirty set (they could not be
// replicated) and tk's permits back into the lag as not yet taken; refs
// may be a part of tk.Refs, the permits are all tk's (the lag stays an
// upper bound).
func (t *Tracker) Requeue(tk Taken, refs []Ref) {
	t.Ack(tk)
	for _, r := range refs {
		t.Touch(r.Rule, r.Key, 0)
	}
	for r, p := range tk.Permits {
		s := &t.stripes[0]
		s.mu.Lock()
		s.pending[r] += p
		s.mu.Unlock()
	}
}

// LagPermits is the replication lag of the rule named ruleName: the
// permits this node admitted in durable buckets since their last
// acknowledged replication. It is what a crash of this node could admit
// twice (the successor continues from the older copy).
func (t *Tracker) LagPermits(ruleName string) int64 {
	var sum int64
	for i := range t.stripes {
		s := &t.stripes[i]
		s.mu.Lock()
		sum += s.pending[ruleName]
		s.mu.Unlock()
	}
	t.mu.Lock()
	sum += t.inflight[ruleName]
	t.mu.Unlock()
	return sum
}

// Dirty is the number of changed buckets not yet taken.
func (t *Tracker) Dirty() int {
	n := 0
	for i := range t.stripes {
		s := &t.stripes[i]
		s.mu.Lock()
		n += len(s.dirty)
		s.mu.Unlock()
	}
	return n
}
