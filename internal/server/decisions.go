package server

import (
	"sync"
	"sync/atomic"

	"github.com/tokenserver/tokenserver/internal/rule"
)

// decisions counts each rule's decisions on this node, per rule name and
// generation: a rule that is deleted and created again, or changes its
// algorithm, starts from zero, as its buckets do. It is the server's home
// for per-rule decision accounting (rule.Compiled stays immutable); the
// metrics read it at scrape time, so the hot path only bumps atomics. It
// is safe for simultaneous use.
type decisions struct {
	// byVersion caches each compiled rule version's counters: the hot
	// path finds them by pointer, without hashing the rule's name or
	// allocating a key.
	byVersion sync.Map // *rule.Compiled → *ruleDecisions

	mu    sync.Mutex
	byGen map[decisionKey]*ruleDecisions
	vis   *visibility // nil: off (visibility.go)
}

// decisionKey names one generation of a rule.
type decisionKey struct {
	rule       string
	generation uint64
}

// ruleDecisions are the counters of one rule generation.
type ruleDecisions struct {
	allowed, denied, shadowDenied atomic.Int64
	vis                           atomic.Pointer[ruleVisibility] // visibility.go
}

// DecisionCounts are a rule generation's decisions on this node:
// allowed, denied, and allowed by a shadow rule that would have denied.
type DecisionCounts struct {
	Allowed, Denied, ShadowDenied int64
}

func newDecisions() *decisions {
	return &decisions{byGen: map[decisionKey]*ruleDecisions{}}
}

// of returns the counters of c's generation, creating them on first use.
func (d *decisions) of(c *rule.Compiled) *ruleDecisions {
	if v, ok := d.byVersion.Load(c); ok {
		return v.(*ruleDecisions)
	}
	k := decisionKey{c.Rule.Name, c.Rule.Generation}
	d.mu.Lock()
	rd := d.byGen[k]
	if rd == nil {
		rd = new(ruleDecisions)
		d.byGen[k] = rd
	}
	d.mu.Unlock()
	d.byVersion.Store(c, rd)
	return rd
}

// record counts one decision under c and returns c's counters.
func (d *decisions) record(c *rule.Compiled, allowed, shadowDenied bool) *ruleDecisions {
	rd := d.of(c)
	switch {
	case shadowDenied:
		rd.shadowDenied.Add(1)
	case allowed:
		rd.allowed.Add(1)
	default:
		rd.denied.Add(1)
	}
	return rd
}

// counts returns the decisions of c's generation so far.
func (d *decisions) counts(c *rule.Compiled) DecisionCounts {
	d.mu.Lock()
	rd := d.byGen[decisionKey{c.Rule.Name, c.Rule.Generation}]
	d.mu.Unlock()
	if rd == nil {
		return DecisionCounts{}
	}
	return DecisionCounts{Allowed: rd.allowed.Load(), Denied: rd.denied.Load(), ShadowDenied: rd.shadowDenied.Load()}
}

// prune forgets the counters of generations t no longer holds and the
// cached versions t no longer serves. A decision still in flight on an
// older version brings its entry back until the next prune.
func (d *decisions) prune(t *rule.Table) {
	d.byVersion.Range(func(k, _ any) bool {
		if c := k.(*rule.Compiled); t.Get(c.Rule.Name) != c {
			d.byVersion.Delete(c)
		}
		return true
	})
	d.mu.Lock()
	defer d.mu.Unlock()
	for k := range d.byGen {
		if c := t.Get(k.rule); c == nil || c.Rule.Generation != k.generation {
			d.dropVisibility(d.byGen[k])
			delete(d.byGen, k)
		}
	}
}
