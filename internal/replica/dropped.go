package replica

import (
	"sync"
	"sync/atomic"

	"github.com/tokenserver/tokenserver/internal/rule"
)

// MaxDroppedKeys bounds the dropped copies a Store remembers by key;
// past it, it counts them per rule only (each as the rule's default
// capacity).
const MaxDroppedKeys = 1 << 16

// dropSet remembers the keys whose copy a Store dropped for want of
// room: after a crash of their owner they start fresh, which the
// over-admission bound counts (Store.DroppedPermits). The zero value
// needs m made.
type dropSet struct {
	len  atomic.Int64 // len(m) + the overflow counts
	mu   sync.Mutex
	m    map[Ref]int64 // → when dropped (the Store's clock)
	over map[string]overflow
}

// overflow counts the drops of one rule past MaxDroppedKeys.
type overflow struct {
	n    int64
	last int64 // the latest drop
}

func (d *dropSet) add(refs []Ref, at int64) {
	if len(refs) == 0 {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, r := range refs {
		if _, ok := d.m[r]; ok || len(d.m) < MaxDroppedKeys {
			if !ok {
				d.len.Add(1)
			}
			d.m[r] = max(d.m[r], at)
			continue
		}
		if d.over == nil {
			d.over = map[string]overflow{}
		}
		o := d.over[r.Rule]
		o.n++
		o.last = max(o.last, at)
		d.over[r.Rule] = o
		d.len.Add(1)
	}
}

func (d *dropSet) remove(r Ref) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.m[r]; ok {
		delete(d.m, r)
		d.len.Add(-1)
	}
}

// Dropped is the number of copies dropped for want of room and not
// replaced by a later copy of their key since.
func (s *Store) Dropped() int64 { return s.drops.len.Load() }

// DroppedPermits is the over-admission bound, in permits, that the
// copies of rule c this Store dropped expose at now (the Store's clock):
// a crash of their owners lets each of those keys start fresh, with its
// capacity. A drop is forgotten once the key's window has passed since
// (the copy would be stale by then), or when a later copy of the key
// fits. Drops of other generations of c count too (an upper bound).
func (s *Store) DroppedPermits(c *rule.Compiled, now int64) int64 {
	d := &s.drops
	if c == nil || d.len.Load() == 0 {
		return 0
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var sum int64
	for r, at := range d.m {
		if r.Rule != c.Rule.Name {
			continue
		}
		cfg := c.ConfigFor(r.Key)
		if now-at >= cfg.Span() {
			delete(d.m, r)
			d.len.Add(-1)
			continue
		}
		sum += cfg.Capacity()
	}
	if o, ok := d.over[c.Rule.Name]; ok {
		if cfg := c.ConfigFor(""); now-o.last >= cfg.Span() {
			delete(d.over, c.Rule.Name)
			d.len.Add(-o.n)
		} else {
			sum += o.n * cfg.Capacity()
		}
	}
	return sum
}
