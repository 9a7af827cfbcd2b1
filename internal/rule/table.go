package rule

import (
	"sort"
	"sync/atomic"

	"github.com/tokenserver/tokenserver/internal/bucket"
)

// Compiled is a validated rule prepared for the data plane: bucket configs
// built once, deny and allow lists as sets. It is immutable but for KeyCount.
type Compiled struct {
	// Rule is the rule as stored. Do not modify it.
	Rule *Rule
	// Config is the bucket configuration of the rule's default limit.
	Config bucket.Config
	// MaxKeys is Rule.EffectiveMaxKeys().
	MaxKeys int64
	// KeyCount counts the rule's live buckets on this node. It is shared by
	// every version of one generation, so a rule change keeps the count.
	KeyCount *atomic.Int64
	// Stats counts the rule's decisions on this node; it is shared by every
	// version of the rule of that name.
	Stats *Stats

	overrides map[string]*bucket.Config
	deny      map[string]struct{}
	allow     map[string]struct{}
}

// Compile prepares r (which must be valid) for the data plane. prev, when it
// is the same rule's previous version of the same generation, lends its
// KeyCount.
func Compile(r *Rule, prev *Compiled) *Compiled {
	c := &Compiled{Rule: r, Config: r.Config(), MaxKeys: r.EffectiveMaxKeys(), Stats: new(Stats)}
	if prev != nil && prev.Rule.Generation == r.Generation {
		c.KeyCount = prev.KeyCount
	} else {
		c.KeyCount = new(atomic.Int64)
	}
	if prev != nil {
		c.Stats = prev.Stats
	}
	if len(r.Overrides) > 0 {
		c.overrides = make(map[string]*bucket.Config, len(r.Overrides))
		for _, o := range r.Overrides {
			oc := r.overrideConfig(o)
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

// Stats counts decisions; the server exports them as metrics.
type Stats struct {
	Allowed      atomic.Int64
	Denied       atomic.Int64
	ShadowDenied atomic.Int64
}

// ConfigFor returns the bucket configuration that applies to key: its
// override, or the rule's default. The pointer is stable for this version.
func (c *Compiled) ConfigFor(key string) *bucket.Config {
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

// Table is an immutable set of compiled rules, swapped whole on every change
// so that the data plane reads it without a lock.
type Table struct {
	// Version is the version of the latest change the table includes.
	Version uint64
	rules   map[string]*Compiled
	changed chan struct{}
}

// NewTable compiles rules into a table at version v, reusing the key counts
// of prev's rules of the same generation. prev may be nil.
func NewTable(v uint64, rules []*Rule, prev *Table) *Table {
	t := &Table{Version: v, rules: make(map[string]*Compiled, len(rules)), changed: make(chan struct{})}
	for _, r := range rules {
		t.rules[r.Name] = Compile(r, prev.Get(r.Name))
	}
	return t
}

// Get returns the compiled rule of that name, or nil. A nil table has none.
func (t *Table) Get(name string) *Compiled {
	if t == nil {
		return nil
	}
	return t.rules[name]
}

// Len is the number of rules.
func (t *Table) Len() int {
	if t == nil {
		return 0
	}
	return len(t.rules)
}

// Rules returns the rules sorted by name.
func (t *Table) Rules() []*Rule {
	if t == nil {
		return nil
	}
	out := make([]*Rule, 0, len(t.rules))
	for _, c := range t.rules {
		out = append(out, c.Rule)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
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
