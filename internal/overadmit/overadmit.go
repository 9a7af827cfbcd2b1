// Package overadmit sums, per rule, the over-admission bound a node's own
// actions currently expose, from named components that other parts of
// the node register.
package overadmit

import (
	"sync"
	"time"

	"github.com/tokenserver/tokenserver/internal/rule"
)

// Component is one named source of over-admission. Permits runs on every
// scrape of the metric, concurrently with everything else: it must be
// cheap (cache what needs a scan) and safe for concurrent use.
type Component interface {
	// Name is the component's name: a snake_case noun (docs, debugging).
	Name() string
	// Permits is the bound, in permits, the component exposes for rule c
	// at now; never negative.
	Permits(c *rule.Compiled, now time.Time) int64
}

// Func is a Component made of a name and a function.
type Func struct {
	// N is the name.
	N string
	// F computes the permits.
	F func(c *rule.Compiled, now time.Time) int64
}

// Name implements Component.
func (f Func) Name() string { return f.N }

// Permits implements Component.
func (f Func) Permits(c *rule.Compiled, now time.Time) int64 { return f.F(c, now) }

// Part is one component's share of a bound.
type Part struct {
	Name    string
	Permits int64
}

// Bound is the sum of its components: the value of
// tokenserver_overadmission_bound_permits for a rule. The zero value has
// no component and is ready; it is safe for simultaneous use by multiple
// goroutines.
type Bound struct {
	mu    sync.RWMutex
	parts []Component
}

// Add registers c; it counts in every later Permits.
func (b *Bound) Add(c Component) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.parts = append(b.parts, c)
}

// Permits is the bound for rule c at now: the sum of the components'
// (each clamped at 0).
func (b *Bound) Permits(c *rule.Compiled, now time.Time) int64 {
	var sum int64
	for _, p := range b.Parts(c, now) {
		sum += p.Permits
	}
	return sum
}

// Parts is each component's share of the bound for rule c at now, in the
// order they were added.
func (b *Bound) Parts(c *rule.Compiled, now time.Time) []Part {
	b.mu.RLock()
	comps := b.parts
	b.mu.RUnlock()
	out := make([]Part, len(comps))
	for i, k := range comps {
		out[i] = Part{Name: k.Name(), Permits: max(0, k.Permits(c, now))}
	}
	return out
}
