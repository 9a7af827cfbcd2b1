package server

import (
	"testing"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/envoyrls"
)

// TestEnvoyRuleByName: the rules the node's shards install handed-over
// Envoy counters under (shard.LocalRules) are the decider's own, found
// from the names ruleName gives them; any other name is none.
func TestEnvoyRuleByName(t *testing.T) {
	d := newEnvoyDecider(nil)
	day := envoyrls.Unit(rlpb.RateLimitResponse_RateLimit_DAY)
	tb := d.compiled(day, bucket.TokenBucket, 3, 0)
	for _, tc := range []struct {
		name string
		want func() any // the rule byName must return (nil: none)
	}{
		{"envoy/fixed-window/DAY", func() any { return d.fixed[day] }},
		{tb.Rule.Name, func() any { return tb }},
		{"envoy/sliding-window/HOUR/7/0", func() any {
			return d.compiled(envoyrls.Unit(rlpb.RateLimitResponse_RateLimit_HOUR), bucket.SlidingWindow, 7, 0)
		}},
		{"envoy/token-bucket/DAY/03/0", nil},      // not as ruleName writes it
		{"envoy/token-bucket/DAY/0/0", nil},       // a limit of 0 has no bucket
		{"envoy/token-bucket/DAY/3/-1", nil},      // no such burst
		{"envoy/token-bucket/FORTNIGHT/3/0", nil}, // no such unit
		{"envoy/fixed-window/DAY/3/0", nil},       // fixed windows are per unit
		{"envoy/token-bucket/DAY", nil},           // the extension names its limit
		{"q", nil},                                // a rule of the table
		{"envoy/no-such-algorithm/DAY/3/0", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := d.byName(tc.name)
			if tc.want == nil {
				if got != nil {
					t.Fatalf("byName(%q) = %q, want none", tc.name, got.Rule.Name)
				}
				return
			}
			if want := tc.want(); any(got) != want {
				t.Fatalf("byName(%q) = %v, want the decider's own rule %v", tc.name, got, want)
			}
		})
	}
}
