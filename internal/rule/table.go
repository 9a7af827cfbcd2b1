package rule

import (
	"fmt"
	"hash/maphash"
	"maps"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/tokenserver/tokenserver/internal/bucket"
)

// Compiled is a validated rule prepared for the data plane: bucket configs
// built once, deny and allow lists as sets. Its fields are immutable once
// compiled; only its link to the version that replaced it is set later
// (see Latest). What a node counts per rule lives elsewhere: the buckets
// and their bytes in internal/shard, by rule name and generation.
type Compiled struct {
	// Rule is the rule as stored. Do not modify it.
	Rule *Rule
	// Config is the bucket configuration of the rule's default limit.
	Config bucket.Config
	// MaxKeys is Rule.EffectiveMaxKeys().
	MaxKeys int64

	// next is the version that replaced this one (or deleted when the
	// rule was deleted); nil while this version is current.
	next atomic.Pointer[Compiled]
	// runtime holds the rule's runtime overrides (see Attach); nil: none.
	runtime atomic.Pointer[Runtime]
	// none is the Stamp of c without runtime overrides.
	none Stamp

	overrides map[string]*bucket.Config
	deny      map[string]struct{}
	allow     map[string]struct{}
}

// Compile prepares r (which must be valid) for the data plane.
func Compile(r *Rule) *Compiled {
	c := &Compiled{Rule: r, Config: r.Config(), MaxKeys: r.EffectiveMaxKeys()}
	if len(r.Overrides) > 0 {
		c.overrides = make(map[string]*bucket.Config, len(r.Overrides))
		for _, o := range r.Overrides {
			oc := overrideConfig(&c.Config, o)
			c.overrides[o.Key] = &oc
		}
	}
	c.deny = set(r.Deny)
	c.allow = set(r.Allow)
	return c
}

func set(keys []string) map[string]struct{} {
	if len(keys) == 0 {
		return nil
	}
	m := make(map[string]struct{}, len(keys))
	for _, k := range keys {
		m[k] = struct{}{}
	}
	return m
}

// deleted is the successor of a rule version whose rule was deleted.
var deleted = &Compiled{}

// Latest returns the current version of c's rule as far as this node has
// applied: c itself, or the version that replaced it, or nil when the rule
// was deleted since. Requests that loaded an older table call it so that
// they are never judged by a superseded version. It does not allocate,
// and inlines where c is current.
func (c *Compiled) Latest() *Compiled {
	if c.next.Load() == nil {
		return c
	}
	return c.successor()
}

// successor is Latest for a replaced version.
func (c *Compiled) successor() *Compiled {
	for {
		n := c.next.Load()
		if n == nil {
			return c
		}
		if n == deleted {
			return nil
		}
		c = n
	}
}

// ErrDeleted is returned for a request whose rule was deleted while it was
// in flight; it is ErrNotFound.
func ErrDeleted(name string) error {
	return fmt.Errorf("rule %q was deleted: %w", name, ErrNotFound)
}

// ConfigFor returns the bucket configuration that applies to key: its
// runtime override (see RuntimeOverride for the precedence), its override
// in the rule, or the rule's default. The pointer is stable while this
// version and the key's runtime override stay.
func (c *Compiled) ConfigFor(key string) *bucket.Config {
	if rt := c.runtime.Load(); rt != nil && rt.n.Load() > 0 {
		if cfg := rt.configFor(c, key); cfg != nil {
			return cfg
		}
	}
	if c.overrides != nil {
		if oc, ok := c.overrides[key]; ok {
			return oc
		}
	}
	return &c.Config
}

// Denied reports whether key is on the deny list.
func (c *Compiled) Denied(key string) bool {
	_, ok := c.deny[key]
	return ok
}

// Allowed reports whether key is on the allow list.
func (c *Compiled) Allowed(key string) bool {
	_, ok := c.allow[key]
	return ok
}

// tableShards is the number of maps a Table spreads its rules over: a
// write copies one of them (about n/64 entries) instead of the whole table,
// so a rule write costs about the same with 10 or 10,000 rules.
const tableShards = 64

// shardSeed hashes rule names to table shards (within this process only).
var shardSeed = maphash.MakeSeed()

func shardOf(name string) int { return int(maphash.String(shardSeed, name) % tableShards) }

// Table is an immutable set of compiled rules, swapped whole on every change
// so that the data plane reads it without a lock.
type Table struct {
	// Version is the version of the latest change the table includes.
	Version uint64
	// shards hold the rules by shardOf(name); each map is immutable once
	// the table is published, and tables share the maps a write did not
	// touch.
	shards  [tableShards]map[string]*Compiled
	n       int
	changed chan struct{}

	sortOnce sync.Once
	sorted   []*Rule // by name, built on first use
}

// put sets c under its name in t, copying its shard first unless owned
// says t has its own copy already.
func (t *Table) put(c *Compiled, owned *[tableShards]bool) {
	i := shardOf(c.Rule.Name)
	t.own(i, owned)
	if _, ok := t.shards[i][c.Rule.Name]; !ok {
		t.n++
	}
	t.shards[i][c.Rule.Name] = c
}

// own gives t a copy of shard i it may change.
func (t *Table) own(i int, owned *[tableShards]bool) {
	if owned[i] {
		return
	}
	t.shards[i] = maps.Clone(t.shards[i])
	if t.shards[i] == nil {
		t.shards[i] = map[string]*Compiled{}
	}
	owned[i] = true
}

// del removes the rule named name from t.
func (t *Table) del(name string, owned *[tableShards]bool) {
	i := shardOf(name)
	if _, ok := t.shards[i][name]; !ok {
		return
	}
	t.own(i, owned)
	delete(t.shards[i], name)
	t.n--
}

// each calls f for every compiled rule.
func (t *Table) each(f func(*Compiled)) {
	for _, m := range t.shards {
		for _, c := range m {
			f(c)
		}
	}
}

// NewTable makes the table of rules at version v. A rule of prev at the same
// version and generation keeps its compiled form (so a write compiles only
// what changed); others are compiled. prev's versions that are replaced or gone
// learn their successor (see Compiled.Latest). prev may be nil.
func NewTable(v uint64, rules []*Rule, prev *Table) *Table {
	t := &Table{Version: v, changed: make(chan struct{})}
	var owned [tableShards]bool
	if prev == nil {
		for _, r := range rules {
			t.put(Compile(r), &owned)
		}
		return t
	}
	// Start from prev's maps and touch only what changed.
	t.shards, t.n = prev.shards, prev.n
	for _, r := range rules {
		p := t.Get(r.Name)
		if p != nil && (p.Rule == r || p.Rule.Version == r.Version && p.Rule.Generation == r.Generation && r.Version != 0) {
			continue
		}
		c := Compile(r)
		t.put(c, &owned)
		if p != nil {
			p.next.Store(c)
		}
	}
	if t.n != len(rules) {
		// Some of prev's rules are gone: find them (deletes are rare).
		in := make(map[string]struct{}, len(rules))
		for _, r := range rules {
			in[r.Name] = struct{}{}
		}
		var gone []*Compiled
		t.each(func(p *Compiled) {
			if _, ok := in[p.Rule.Name]; !ok {
				gone = append(gone, p)
			}
		})
		for _, p := range gone {
			p.next.Store(deleted)
			t.del(p.Rule.Name, &owned)
		}
	}
	return t
}

// With returns a table at version v that is t with r put (compiled, its
// predecessor linked to it) and the rule named del deleted (when not
// empty): the update of one write, which copies one shard of the table.
func (t *Table) With(v uint64, r *Rule, del string) *Table {
	n := &Table{Version: v, changed: make(chan struct{})}
	if t != nil {
		n.shards, n.n = t.shards, t.n
	}
	var owned [tableShards]bool
	if r != nil {
		p := n.Get(r.Name)
		c := Compile(r)
		n.put(c, &owned)
		if p != nil {
			p.next.Store(c)
		}
	}
	if p := n.Get(del); del != "" && p != nil {
		p.next.Store(deleted)
		n.del(del, &owned)
	}
	return n
}

// Get returns the compiled rule of that name, or nil. A nil table has none.
func (t *Table) Get(name string) *Compiled {
	if t == nil {
		return nil
	}
	return t.shards[shardOf(name)][name]
}

// Len is the number of rules.
func (t *Table) Len() int {
	if t == nil {
		return 0
	}
	return t.n
}

// Rules returns the rules sorted by name, in a new slice (the sort is done
// once per table). Do not modify the rules.
func (t *Table) Rules() []*Rule {
	if t == nil {
		return nil
	}
	return append([]*Rule(nil), t.sortedRules()...)
}

func (t *Table) sortedRules() []*Rule {
	t.sortOnce.Do(func() {
		out := make([]*Rule, 0, t.n)
		t.each(func(c *Compiled) { out = append(out, c.Rule) })
		sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
		t.sorted = out
	})
	return t.sorted
}

// Page returns up to n rules (n <= 0: all) sorted by name, starting after
// the name after (empty: from the first), and whether more follow.
func (t *Table) Page(after string, n int) (rules []*Rule, more bool) {
	if t == nil {
		return nil, false
	}
	all := t.sortedRules()
	i := sort.Search(len(all), func(i int) bool { return all[i].Name > after })
	all = all[i:]
	if n > 0 && len(all) > n {
		return append([]*Rule(nil), all[:n]...), true
	}
	return append([]*Rule(nil), all...), false
}

// Changed is closed when a newer table replaces this one.
func (t *Table) Changed() <-chan struct{} { return t.changed }

// Supersede marks t as replaced, waking everyone waiting on Changed. The
// Store calls it once, after publishing the newer table.
func (t *Table) Supersede() {
	if t != nil {
		close(t.changed)
	}
}
