package server

import (
	"sync/atomic"
	"time"

	"github.com/tokenserver/tokenserver/internal/rule"
	"github.com/tokenserver/tokenserver/internal/series"
	"github.com/tokenserver/tokenserver/internal/shard"
	"github.com/tokenserver/tokenserver/internal/topk"
)

// Visibility: each rule generation that decides on this node gets a
// top-keys sketch (internal/topk) and a one-hour, one-second series
// (internal/series), hung off its decision counters (decisions.go) so that
// they live and are pruned with them. Both are allocated on the rule's
// first decision on this node: a rule without traffic costs one nil
// pointer.
//
// Cost: a decision adds to the series (a mutex and a slot) and offers
// itself to the sketch, which past topKeysExactPerBucket decisions in a
// 10 s bucket keeps one in topKeysSampleEvery (topk.Config.SampleEvery).
//
// Memory per active rule, with the defaults: the series is 3,600 slots of
// series.SlotBytes (144,000 bytes, allocated at once); the sketch grows
// with distinct keys up to DefaultTopKeysCapacity counters per bucket and
// side, 64 × 20 buckets × 2 sides = 2,560 counters of about
// topk.EntryBytes plus the key (≈ 290 KB with 32-byte keys). So a rule
// with few keys costs about 150 KB and one with many distinct keys at
// most about 430 KB. At most Config.VisibilityMaxRules (default
// DefaultVisibilityMaxRules) rule generations get them on one node; the
// rest keep their Prometheus counters only.
const (
	// DefaultTopKeysCapacity is the keys each top-keys bucket monitors
	// per side when Config.TopKeysCapacity is 0: a count's error is at
	// most 1/64 of the bucket's permits.
	DefaultTopKeysCapacity = 64
	// DefaultVisibilityMaxRules caps the rule generations with a sketch
	// and a series on one node when Config.VisibilityMaxRules is 0.
	DefaultVisibilityMaxRules = 1024
	// topKeysSampleEvery and topKeysExactPerBucket make a busy rule's
	// sketch sample (topk.Config.SampleEvery): past 10,000 decisions in
	// a 10 s bucket (1,000/s), one decision in 16 is counted, at 16 times
	// its permits. Counting every decision cost 15-22% of a batched
	// decision (BenchmarkVisibility) against a budget of 5%; a rule below
	// 1,000 decisions/s stays exact.
	topKeysSampleEvery    = 16
	topKeysExactPerBucket = 10000
)

// ruleVisibility is one rule generation's sketch and series on this node.
type ruleVisibility struct {
	sketch *topk.Sketch
	series series.Series
}

// visibility makes and counts the ruleVisibility of each rule generation.
// Its clock is wall time (Unix nanoseconds) derived from the node's
// monotonic clock, so that series seconds line up across nodes.
type visibility struct {
	cfg        topk.Config
	maxRules   int64
	live       atomic.Int64 // ruleVisibility values made and not pruned
	wallOffset int64        // Unix ns minus the node clock, fixed at start
	now        func() int64
}

// newVisibility returns the node's visibility, or nil when cfg turns it
// off.
func newVisibility(cfg *Config, now func() int64) *visibility {
	if !cfg.Visibility {
		return nil
	}
	tc := topk.DefaultConfig()
	if cfg.TopKeysCapacity > 0 {
		tc.Capacity = cfg.TopKeysCapacity
	} else {
		tc.Capacity = DefaultTopKeysCapacity
	}
	tc.SampleEvery, tc.ExactPerBucket = topKeysSampleEvery, topKeysExactPerBucket
	maxRules := int64(cfg.VisibilityMaxRules)
	if maxRules <= 0 {
		maxRules = DefaultVisibilityMaxRules
	}
	return &visibility{cfg: tc, maxRules: maxRules, wallOffset: time.Now().UnixNano() - now(), now: now}
}

// wall is the current time in Unix nanoseconds, read off the node clock.
func (v *visibility) wall() int64 { return v.now() + v.wallOffset }

// of returns rd's visibility, making it on first use; nil past the cap.
func (v *visibility) of(rd *ruleDecisions) *ruleVisibility {
	if rv := rd.vis.Load(); rv != nil {
		return rv
	}
	if v.live.Add(1) > v.maxRules {
		v.live.Add(-1)
		return nil
	}
	sk, err := topk.New(v.cfg)
	if err != nil { // the config is validated in Config.Validate
		v.live.Add(-1)
		return nil
	}
	rv := &ruleVisibility{sketch: sk}
	if !rd.vis.CompareAndSwap(nil, rv) {
		v.live.Add(-1)
		return rd.vis.Load()
	}
	return rv
}

// recordDecision counts one decision of c for key: the decision counters
// and, with visibility on, the rule's sketch and series. permits is what
// the caller asked for. Admitted permits are the granted ones; a denial
// (or a shadow denial: what the rule would have denied) counts the
// permits asked for on the sketch's denied side.
func (n *Node) recordDecision(c *rule.Compiled, key string, permits int64, d *shard.Decision) {
	rd := n.decisions.record(c, d.Allowed, d.ShadowDenied)
	if n.vis == nil {
		return
	}
	rv := n.vis.of(rd)
	if rv == nil {
		return
	}
	now := n.vis.wall()
	switch {
	case d.ShadowDenied:
		rv.series.Add(now, 0, 0, 1, d.Granted)
		rv.sketch.Observe(now, key, permits, true)
	case d.Allowed:
		rv.series.Add(now, 1, 0, 0, d.Granted)
		rv.sketch.Observe(now, key, d.Granted, false)
	default:
		rv.series.Add(now, 0, 1, 0, 0)
		rv.sketch.Observe(now, key, permits, true)
	}
}

// visibilityOf returns the visibility of the generation of c on this
// node, nil when it has not decided here (or visibility is off).
func (n *Node) visibilityOf(c *rule.Compiled) *ruleVisibility {
	if n.vis == nil || c == nil {
		return nil
	}
	rd := n.decisions.find(c)
	if rd == nil {
		return nil
	}
	return rd.vis.Load()
}

// find returns the counters of c's generation, nil when it has none.
func (d *decisions) find(c *rule.Compiled) *ruleDecisions {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.byGen[decisionKey{c.Rule.Name, c.Rule.Generation}]
}

// dropVisibility releases rd's share of the visibility cap when prune
// forgets rd. Called with d.mu held.
func (d *decisions) dropVisibility(rd *ruleDecisions) {
	if d.vis != nil && rd != nil && rd.vis.Swap(nil) != nil {
		d.vis.live.Add(-1)
	}
}

// visible returns the visibility of every rule generation that has one.
func (d *decisions) visible() []*ruleVisibility {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]*ruleVisibility, 0, len(d.byGen))
	for _, rd := range d.byGen {
		if rv := rd.vis.Load(); rv != nil {
			out = append(out, rv)
		}
	}
	return out
}
