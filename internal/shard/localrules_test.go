package shard

import (
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// TestImportLocalRules: a bucket of a rule the node makes itself (an
// Envoy counter's, in no rule table) is installed by Import only when
// the Map's LocalRules know that rule generation, and then goes on from
// the count it left with.
func TestImportLocalRules(t *testing.T) {
	own := rule.Compile(&rule.Rule{Name: "envoy/token-bucket/DAY/3/0", Algorithm: bucket.TokenBucket, Limit: 3, Period: 24 * time.Hour, Version: 1 << 62, Generation: 1})
	other := rule.Compile(&rule.Rule{Name: own.Rule.Name, Algorithm: bucket.TokenBucket, Limit: 3, Period: 24 * time.Hour, Version: 1 << 62, Generation: 2})
	s, _ := store(t) // an empty rule table
	for _, tc := range []struct {
		name      string
		local     LocalRules
		installed bool
		left      int64 // what the key has left on the importer
	}{
		{"no local rules: dropped", nil, false, 3},
		{"a local rule of another name: dropped", func(string) *rule.Compiled { return nil }, false, 3},
		{"another generation: dropped", func(string) *rule.Compiled { return other }, false, 3},
		{"the local rule: installed", func(n string) *rule.Compiled {
			if n == own.Rule.Name {
				return own
			}
			return nil
		}, true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := New(Config{}), New(Config{})
			aNow, bNow := int64(9e14), int64(4e12)
			acquire(t, a, own, "k", 2, aNow)
			var states []BucketState
			if err := a.HandOver(aNow, func(string, string) bool { return true }, func(s BucketState) error {
				states = append(states, s)
				return nil
			}); err != nil || len(states) != 1 {
				t.Fatalf("hand over: %d states, %v", len(states), err)
			}
			b.SetLocalRules(tc.local)
			ok, err := b.Import(s.Table(), states[0], bNow)
			if err != nil || ok != tc.installed {
				t.Fatalf("Import = %v, %v; want %v, nil", ok, err, tc.installed)
			}
			c := own
			if tc.local != nil && tc.local(own.Rule.Name) == other {
				c = other
			}
			if got := acquire(t, b, c, "k", 0, bNow).Remaining; got != tc.left {
				t.Fatalf("remaining after the import %d, want %d", got, tc.left)
			}
		})
	}
}
