package server

import (
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// TestDecisionsByGeneration: counts follow a rule across versions of one
// generation, start from zero for a new generation (new algorithm, or the
// rule deleted and created again), and prune forgets generations the table
// no longer holds.
func TestDecisionsByGeneration(t *testing.T) {
	tb := func(name string, version, gen uint64, alg bucket.Algorithm) *rule.Rule {
		return &rule.Rule{Name: name, Algorithm: alg, Limit: 5, Period: time.Second, Version: version, Generation: gen}
	}
	d := newDecisions()
	v1 := rule.Compile(tb("r", 1, 1, bucket.TokenBucket))
	v2 := rule.Compile(tb("r", 2, 1, bucket.TokenBucket)) // same generation
	v3 := rule.Compile(tb("r", 3, 3, bucket.FixedWindow)) // new algorithm: new generation
	for _, step := range []struct {
		c                     *rule.Compiled
		allowed, shadowDenied bool
	}{
		{v1, true, false}, {v1, false, false}, {v2, true, false}, {v2, true, true}, {v3, false, false},
	} {
		d.record(step.c, step.allowed, step.shadowDenied)
	}
	for _, tc := range []struct {
		name string
		c    *rule.Compiled
		want DecisionCounts
	}{
		{"first version", v1, DecisionCounts{Allowed: 2, Denied: 1, ShadowDenied: 1}},
		{"same generation", v2, DecisionCounts{Allowed: 2, Denied: 1, ShadowDenied: 1}},
		{"new generation", v3, DecisionCounts{Denied: 1}},
	} {
		if got := d.counts(tc.c); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
	d.prune(rule.NewTable(3, []*rule.Rule{v3.Rule}, nil))
	if got := d.counts(v1); got != (DecisionCounts{}) {
		t.Errorf("after prune, the old generation still counts %+v", got)
	}
	if got := d.counts(v3); got != (DecisionCounts{Denied: 1}) {
		t.Errorf("after prune, the current generation counts %+v, want 1 denied", got)
	}
	d.prune(rule.NewTable(4, nil, nil))
	if got := d.counts(v3); got != (DecisionCounts{}) {
		t.Errorf("after the rule is deleted it still counts %+v", got)
	}
}
