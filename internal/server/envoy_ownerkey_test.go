package server

import (
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/envoyrls"
)

// TestEnvoyOwnerKey: the handoff finds the owner of an Envoy counter by
// its descriptor's key (Limit.HashKey), as the decider routes it, not by
// its bucket key (regression: a view change froze counters whose
// descriptor stayed on this node, and sent them where nothing decides
// them). Other rules keep their keys.
func TestEnvoyOwnerKey(t *testing.T) {
	d := newEnvoyDecider(nil)
	yaml := "domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: {unit: minute, requests_per_unit: 5}\n" +
		"  - key: tenant\n    algorithm: sliding-window\n    rate_limit: {unit: hour, requests_per_unit: 7}\n"
	dom, err := envoyrls.ParseDomain("edge.yaml", []byte(yaml), envoyrls.Meta{})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := envoyrls.NewConfig(dom)
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range [][2]string{{"ip", "10.0.0.1"}, {"tenant", "a_b/HOUR"}} {
		l := cfg.Resolve("edge", &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: kv[0], Value: kv[1]}}})
		if l == nil {
			t.Fatalf("%v: no limit", kv)
		}
		name := d.ruleName(l.Unit, l.Algorithm, l.RequestsPerUnit, l.Burst)
		if got, ok := envoyOwnerKey(name, l.CounterKey()); !ok || got != l.HashKey() {
			t.Errorf("envoyOwnerKey(%q, %q) = %q, %v; want %q", name, l.CounterKey(), got, ok, l.HashKey())
		}
	}
	for _, tc := range []struct{ rule, key string }{
		{"api", "edge_ip_10.0.0.1_MINUTE"},
		{"envoy", "x_MINUTE"},
		{"envoy/fixed-window", "x_MINUTE"},
		{"envoy/fixed-window/FORTNIGHT", "x_FORTNIGHT"},
		{"envoy/fixed-window/MINUTE", "x_HOUR"},
		{"envoy/token-bucket/MINUTE", "x_MINUTE_token-bucket"},
		{"envoy/fixed-window/MINUTE/5/0", "x_MINUTE"},
	} {
		if got, ok := envoyOwnerKey(tc.rule, tc.key); ok {
			t.Errorf("envoyOwnerKey(%q, %q) = %q, want none", tc.rule, tc.key, got)
		}
	}
	if bucket.FixedWindow.String() != "fixed-window" {
		t.Fatalf("the fixed-window rule names assume %q", bucket.FixedWindow)
	}
}
