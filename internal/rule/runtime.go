package rule

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/tokenserver/tokenserver/internal/bucket"
)

// RuntimeOverride is a runtime override of one rule: a key, or a key
// prefix written with one trailing `*` (`premium-*`), gets its own limit
// and burst. Unlike Rule.Overrides, each is written on its own (one Raft
// entry), so that a tenant's limit changes without rewriting the rule.
//
// Precedence, for a key: a runtime override for the exact key; else the
// runtime prefix override with the longest prefix the key starts with;
// else the rule's own Overrides entry for the key; else the rule's limit.
// Runtime overrides outlive rule changes that keep the rule; deleting the
// rule deletes them.
type RuntimeOverride struct {
	// Rule is the rule's name.
	Rule string
	// Key is an exact key, or a prefix followed by one `*`.
	Key string
	// Limit replaces the rule's limit.
	Limit int64
	// Burst replaces the rule's burst; 0 means Limit.
	Burst int64
	// ExpiresUnixNs, when not 0, is when the leader removes it.
	ExpiresUnixNs int64
	// Version is the write that made it (set by the store).
	Version uint64
	// UpdatedBy is the principal of that write.
	UpdatedBy string
}

// IsPrefix reports whether o's key is a prefix pattern (ends in `*`).
func (o *RuntimeOverride) IsPrefix() bool { return strings.HasSuffix(o.Key, "*") }

// ValidatePattern reports whether key may be a runtime override's key: a
// valid key with no `*` except one at its end.
func ValidatePattern(key string) error {
	if p := keyProblem(key); p != "" {
		return Invalid("override key: %s", p)
	}
	if i := strings.IndexByte(key, '*'); i >= 0 && i != len(key)-1 {
		return Invalid("override key %q: `*` may appear once, at the end (an exact key or a prefix like premium-*)", key)
	}
	return nil
}

// ValidateFor reports whether o is a valid runtime override of r: its
// pattern, and its limit and burst in r's bucket configuration.
func (o *RuntimeOverride) ValidateFor(r *Rule) error {
	if err := ValidatePattern(o.Key); err != nil {
		return err
	}
	if o.ExpiresUnixNs < 0 {
		return Invalid("override %q: expires must be >= 0, got %d", o.Key, o.ExpiresUnixNs)
	}
	base := r.Config()
	c := overrideConfig(&base, Override{Key: o.Key, Limit: o.Limit, Burst: o.Burst})
	if err := c.Validate(); err != nil {
		return Invalid("override %q of rule %q: %v", o.Key, r.Name, err)
	}
	return nil
}

// Runtime holds the runtime overrides of one rule. It is safe for
// simultaneous use: reads (ConfigFor) take a read lock, writes (the FSM
// applies them one at a time) the lock. A write touches one map entry, so
// it costs the same with 100,000 overrides as with 10 (Go's maps grow
// incrementally, table by table; sync.Map was measured and its writes
// slow down threefold at 100,000 entries).
//
// Exact keys live in one map; prefixes in another, keyed by the prefix,
// with the distinct prefix lengths: a lookup tries the exact key, then
// each prefix length from the longest, so it costs one map lookup plus
// one per distinct prefix length the rule uses (a trie would bound that by
// the key's length; with the few lengths prefixes have in practice the
// maps are faster and hand-write nothing).
type Runtime struct {
	n atomic.Int64 // overrides held, read without the lock
	// stamp is replaced on every write (see Compiled.Stamp).
	stamp atomic.Pointer[Stamp]

	mu       sync.RWMutex
	exact    map[string]*runtimeEntry
	prefix   map[string]*runtimeEntry // by prefix without `*`
	lens     []int                    // distinct prefix lengths, longest first
	lenCount map[int]int
}

// runtimeEntry is one override with its bucket configuration, built once
// per compiled rule version.
type runtimeEntry struct {
	o   RuntimeOverride
	cfg atomic.Pointer[runtimeConfig]
}

type runtimeConfig struct {
	c   *Compiled
	cfg bucket.Config
	bad bool // invalid under c (the rule changed since the override was written)
}

// Len is the number of overrides.
func (rt *Runtime) Len() int {
	if rt == nil {
		return 0
	}
	return int(rt.n.Load())
}

// Put stores o (replacing the override of its key).
func (rt *Runtime) Put(o RuntimeOverride) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	e := &runtimeEntry{o: o}
	if o.IsPrefix() {
		p := o.Key[:len(o.Key)-1]
		if rt.prefix == nil {
			rt.prefix = map[string]*runtimeEntry{}
		}
		if _, had := rt.prefix[p]; !had {
			rt.n.Add(1)
			rt.addLen(len(p), 1)
		}
		rt.prefix[p] = e
		rt.stamp.Store(new(Stamp))
		return
	}
	if rt.exact == nil {
		rt.exact = map[string]*runtimeEntry{}
	}
	if _, had := rt.exact[o.Key]; !had {
		rt.n.Add(1)
	}
	rt.exact[o.Key] = e
	rt.stamp.Store(new(Stamp))
}

// Delete removes the override of key (a pattern as written) and reports
// whether there was one.
func (rt *Runtime) Delete(key string) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if p, ok := strings.CutSuffix(key, "*"); ok {
		if _, had := rt.prefix[p]; had {
			delete(rt.prefix, p)
			rt.n.Add(-1)
			rt.addLen(len(p), -1)
			rt.stamp.Store(new(Stamp))
			return true
		}
		return false
	}
	if _, had := rt.exact[key]; had {
		delete(rt.exact, key)
		rt.n.Add(-1)
		rt.stamp.Store(new(Stamp))
		return true
	}
	return false
}

// Get returns the override of key (a pattern as written).
func (rt *Runtime) Get(key string) (RuntimeOverride, bool) {
	rt.mu.RLock()
	defer rt.mu.RUnlock()
	var e *runtimeEntry
	if p, ok := strings.CutSuffix(key, "*"); ok {
		e = rt.prefix[p]
	} else {
		e = rt.exact[key]
	}
	if e == nil {
		return RuntimeOverride{}, false
	}
	return e.o, true
}

// addLen counts a prefix length in or out. rt.mu is held.
func (rt *Runtime) addLen(l, d int) {
	if rt.lenCount == nil {
		rt.lenCount = map[int]int{}
	}
	before := rt.lenCount[l]
	after := before + d
	if after <= 0 {
		delete(rt.lenCount, l)
	} else {
		rt.lenCount[l] = after
	}
	if (before > 0) == (after > 0) {
		return
	}
	rt.lens = rt.lens[:0]
	for k := range rt.lenCount {
		rt.lens = append(rt.lens, k)
	}
	slices.Sort(rt.lens)
	slices.Reverse(rt.lens)
}

// each calls f for every entry under the read lock.
func (rt *Runtime) each(f func(*RuntimeOverride)) {
	rt.mu.RLock()
	defer rt.mu.RUnlock()
	for _, e := range rt.exact {
		f(&e.o)
	}
	for _, e := range rt.prefix {
		f(&e.o)
	}
}

// All returns the overrides sorted by key.
func (rt *Runtime) All() []RuntimeOverride {
	if rt == nil {
		return nil
	}
	out := make([]RuntimeOverride, 0, rt.Len())
	rt.each(func(o *RuntimeOverride) { out = append(out, *o) })
	slices.SortFunc(out, func(a, b RuntimeOverride) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// Expired returns the keys of the overrides that expire at or before
// unixNs.
func (rt *Runtime) Expired(unixNs int64) []string {
	if rt == nil {
		return nil
	}
	var keys []string
	rt.each(func(o *RuntimeOverride) {
		if o.ExpiresUnixNs != 0 && o.ExpiresUnixNs <= unixNs {
			keys = append(keys, o.Key)
		}
	})
	slices.Sort(keys)
	return keys
}

// match returns the entry that applies to key, or nil.
func (rt *Runtime) match(key string) *runtimeEntry {
	rt.mu.RLock()
	defer rt.mu.RUnlock()
	if e, ok := rt.exact[key]; ok {
		return e
	}
	for _, l := range rt.lens {
		if l <= len(key) {
			if e, ok := rt.prefix[key[:l]]; ok {
				return e
			}
		}
	}
	return nil
}

// configFor returns the configuration of the override that applies to
// key under c, or nil. The pointer is stable while neither the override
// nor c changes.
func (rt *Runtime) configFor(c *Compiled, key string) *bucket.Config {
	e := rt.match(key)
	if e == nil {
		return nil
	}
	p := e.cfg.Load()
	if p == nil || p.c != c {
		p = &runtimeConfig{c: c, cfg: overrideConfig(&c.Config, Override{Key: e.o.Key, Limit: e.o.Limit, Burst: e.o.Burst})}
		p.bad = p.cfg.Validate() != nil
		e.cfg.Store(p)
	}
	if p.bad {
		return nil
	}
	return &p.cfg
}

// Overrides holds every rule's Runtime, by rule name. Writers are
// serialized by the caller (the FSM); Get is safe alongside them.
type Overrides struct {
	rules sync.Map // name → *Runtime
}

// NewOverrides returns an empty Overrides.
func NewOverrides() *Overrides { return &Overrides{} }

// Get returns the rule's Runtime, or nil.
func (s *Overrides) Get(name string) *Runtime {
	if s == nil {
		return nil
	}
	v, ok := s.rules.Load(name)
	if !ok {
		return nil
	}
	return v.(*Runtime)
}

// For returns the rule's Runtime, making it if need be.
func (s *Overrides) For(name string) *Runtime {
	v, _ := s.rules.LoadOrStore(name, &Runtime{})
	return v.(*Runtime)
}

// DropRule forgets every override of the rule.
func (s *Overrides) DropRule(name string) { s.rules.Delete(name) }

// Each calls f for every rule holding overrides, in no order.
func (s *Overrides) Each(f func(name string, rt *Runtime)) {
	s.rules.Range(func(k, v any) bool { f(k.(string), v.(*Runtime)); return true })
}

// All returns every override, sorted by rule and key.
func (s *Overrides) All() []RuntimeOverride {
	var names []string
	s.Each(func(name string, rt *Runtime) {
		if rt.Len() > 0 {
			names = append(names, name)
		}
	})
	slices.Sort(names)
	var out []RuntimeOverride
	for _, n := range names {
		out = append(out, s.Get(n).All()...)
	}
	return out
}

// Attach gives c the runtime overrides of its rule from s (nil: none), so
// that ConfigFor consults them.
func (c *Compiled) Attach(rt *Runtime) { c.runtime.Store(rt) }

// Stamp marks one state of a rule version's runtime overrides: while
// c.Stamp() returns the same pointer, c.ConfigFor returns the same
// configuration for every key. A caller caches ConfigFor's answer with the
// stamp it read before asking, and asks again once the stamp differs
// (pointers are compared; a held stamp is never reused).
type Stamp struct{ _ uint64 }

// Stamp returns the current stamp of c's runtime overrides (see Stamp).
// It takes no lock and does not allocate.
func (c *Compiled) Stamp() *Stamp {
	if rt := c.runtime.Load(); rt != nil {
		if s := rt.stamp.Load(); s != nil {
			return s
		}
	}
	return &c.none
}

// Runtime returns the runtime overrides attached to c, or nil.
func (c *Compiled) Runtime() *Runtime { return c.runtime.Load() }

// String names the override for messages.
func (o RuntimeOverride) String() string {
	return fmt.Sprintf("override %q of rule %q (limit %d, burst %d)", o.Key, o.Rule, o.Limit, o.Burst)
}

// Clone returns a copy of s that later writes to s do not change (for a
// snapshot).
func (s *Overrides) Clone() *Overrides {
	c := NewOverrides()
	for _, o := range s.All() {
		c.For(o.Rule).Put(o)
	}
	return c
}
