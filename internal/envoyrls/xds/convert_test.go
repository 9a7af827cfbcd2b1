package xds

import (
	"reflect"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	resource "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/tokenserver/tokenserver/internal/envoyrls"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/types/known/anypb"
)

// The same configuration as a file and as an xDS resource.
const sameYAML = `domain: gw
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: subkey1
        value: subvalue1
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20, name: k2}
  - key: key2
    value: value2
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 30, name: k2v2, replaces: [{name: k2}]}
  - key: key2
    value: value3
  - key: key6
    rate_limit: {unlimited: true}
  - key: key7
    detailed_metric: true
    rate_limit: {unit: day, requests_per_unit: 70}
  - key: path
    value: "/api/*"
    rate_limit: {unit: hour, requests_per_unit: 7}
`

func rl(unit rlsconf.RateLimitUnit, n uint32) *rlsconf.RateLimitPolicy {
	return &rlsconf.RateLimitPolicy{Unit: unit, RequestsPerUnit: n}
}

func sameProto() *rlsconf.RateLimitConfig {
	k2v2 := rl(rlsconf.RateLimitUnit_MINUTE, 30)
	k2v2.Name, k2v2.Replaces = "k2v2", []*rlsconf.RateLimitReplace{{Name: "k2"}}
	k2 := rl(rlsconf.RateLimitUnit_MINUTE, 20)
	k2.Name = "k2"
	return &rlsconf.RateLimitConfig{
		Name:   "gw-config",
		Domain: "gw",
		Descriptors: []*rlsconf.RateLimitDescriptor{
			{Key: "key1", Value: "value1", Descriptors: []*rlsconf.RateLimitDescriptor{
				{Key: "subkey1", RateLimit: rl(rlsconf.RateLimitUnit_SECOND, 5)},
				{Key: "subkey1", Value: "subvalue1", RateLimit: rl(rlsconf.RateLimitUnit_SECOND, 10)},
			}},
			{Key: "key2", RateLimit: k2},
			{Key: "key2", Value: "value2", ShadowMode: true, RateLimit: k2v2},
			{Key: "key2", Value: "value3"},
			{Key: "key6", RateLimit: &rlsconf.RateLimitPolicy{Unlimited: true}},
			{Key: "key7", DetailedMetric: true, RateLimit: rl(rlsconf.RateLimitUnit_DAY, 70)},
			{Key: "path", Value: "/api/*", RateLimit: rl(rlsconf.RateLimitUnit_HOUR, 7)},
		},
	}
}

func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func mustAny(t *testing.T, rc *rlsconf.RateLimitConfig) *anypb.Any {
	t.Helper()
	a, err := anypb.New(rc)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestConvertMatchesFile: a resource resolves every descriptor exactly as
// the file it stands for.
func TestConvertMatchesFile(t *testing.T) {
	file, err := envoyrls.ParseDomain("gw.yaml", []byte(sameYAML), envoyrls.Meta{})
	if err != nil {
		t.Fatal(err)
	}
	want, err := envoyrls.NewConfig(file)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Convert([]*anypb.Any{mustAny(t, sameProto())}, "xds:gw:18000")
	if err != nil {
		t.Fatalf("Convert: %v", err)
	}
	d := got.Domain("gw")
	if d == nil {
		t.Fatalf("domain gw missing; have %d domains", got.Len())
	}
	if m := d.Meta(); m.Author != "xds:gw:18000" || m.Source != "xds:gw-config" {
		t.Errorf("Meta = %+v, want author xds:gw:18000, source xds:gw-config", m)
	}
	for _, tc := range []*ratelimitv3.RateLimitDescriptor{
		desc("key1", "value1"),
		desc("key1", "value1", "subkey1", "x"),
		desc("key1", "value1", "subkey1", "subvalue1"),
		desc("key2", "any"),
		desc("key2", "value2"),
		desc("key2", "value3"),
		desc("key6", "a"),
		desc("key7", "b"),
		desc("path", "/api/v1"),
		desc("path", "/other"),
		desc("nokey", "x"),
	} {
		w, g := want.Resolve("gw", tc), got.Resolve("gw", tc)
		if !reflect.DeepEqual(w, g) {
			t.Errorf("Resolve(%v):\n file %+v\n xds  %+v", tc.GetEntries(), w, g)
		}
	}
	if got.Resolve("gw", desc("key2", "value2")) == nil {
		t.Fatal("key2=value2 resolved to nothing: the comparison proves little")
	}
}

// TestYAMLRoundTrip: values YAML would read as other types stay strings.
func TestYAMLRoundTrip(t *testing.T) {
	var ds []*rlsconf.RateLimitDescriptor
	for _, v := range []string{"true", "123", "1.5", "null", "~", "a: b", "- x", "*", "#c", "ünï", "'q'", "\"dq\"", "multi\nline"} {
		ds = append(ds, &rlsconf.RateLimitDescriptor{Key: "k", Value: v, RateLimit: rl(rlsconf.RateLimitUnit_SECOND, 1)})
	}
	rc := &rlsconf.RateLimitConfig{Name: "n", Domain: "yes", Descriptors: ds}
	b, err := YAML(rc)
	if err != nil {
		t.Fatal(err)
	}
	var back yamlRoot
	if err := yaml.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if back.Domain != "yes" || len(back.Descriptors) != len(ds) {
		t.Fatalf("round trip: %+v\n%s", back, b)
	}
	for i, d := range back.Descriptors {
		if d.Value != ds[i].Value {
			t.Errorf("value %d: %q became %q", i, ds[i].Value, d.Value)
		}
	}
	if _, err := Domain("n", rc, envoyrls.Meta{}); err != nil {
		t.Errorf("ParseDomain refused the rendered YAML: %v\n%s", err, b)
	}
}

// TestConvertRefuses: a set the reference's loader would refuse is refused
// whole, with a message naming the resource and the problem.
func TestConvertRefuses(t *testing.T) {
	good := &rlsconf.RateLimitConfig{Name: "good", Domain: "d1", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "k", RateLimit: rl(rlsconf.RateLimitUnit_SECOND, 1)}}}
	one := func(rc *rlsconf.RateLimitConfig) []*anypb.Any {
		return []*anypb.Any{mustAny(t, good), mustAny(t, rc)}
	}
	unitless := &rlsconf.RateLimitPolicy{RequestsPerUnit: 5}
	unlimitedUnit := &rlsconf.RateLimitPolicy{Unlimited: true, Unit: rlsconf.RateLimitUnit_SECOND}
	selfReplace := &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_SECOND, RequestsPerUnit: 1, Name: "a", Replaces: []*rlsconf.RateLimitReplace{{Name: "a"}}}
	emptyReplace := &rlsconf.RateLimitPolicy{Unit: rlsconf.RateLimitUnit_SECOND, RequestsPerUnit: 1, Replaces: []*rlsconf.RateLimitReplace{{}}}
	for _, tc := range []struct {
		name string
		set  []*anypb.Any
		want string
	}{
		{"empty domain", one(&rlsconf.RateLimitConfig{Name: "bad"}), `RateLimitConfig "bad": config file cannot have empty domain`},
		{"unknown unit", one(&rlsconf.RateLimitConfig{Name: "bad", Domain: "d2", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "k", RateLimit: unitless}}}), `RateLimitConfig "bad": invalid rate limit unit 'UNKNOWN'`},
		{"out-of-range unit", one(&rlsconf.RateLimitConfig{Name: "bad", Domain: "d2", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "k", RateLimit: rl(99, 1)}}}), "invalid rate limit unit '99'"},
		{"unlimited with unit", one(&rlsconf.RateLimitConfig{Name: "bad", Domain: "d2", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "k", RateLimit: unlimitedUnit}}}), "should not specify rate limit unit when unlimited"},
		{"empty key", one(&rlsconf.RateLimitConfig{Name: "bad", Domain: "d2", Descriptors: []*rlsconf.RateLimitDescriptor{{Value: "v"}}}), "descriptor has empty key"},
		{"duplicate key", one(&rlsconf.RateLimitConfig{Name: "bad", Domain: "d2", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "k", Value: "v"}, {Key: "k", Value: "v"}}}), "duplicate descriptor composite key 'd2.k_v'"},
		{"replaces itself", one(&rlsconf.RateLimitConfig{Name: "bad", Domain: "d2", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "k", RateLimit: selfReplace}}}), "replaces should not contain name of same descriptor"},
		{"empty replaces", one(&rlsconf.RateLimitConfig{Name: "bad", Domain: "d2", Descriptors: []*rlsconf.RateLimitDescriptor{{Key: "k", RateLimit: emptyReplace}}}), "should not have an empty replaces entry"},
		{"duplicate domain", one(&rlsconf.RateLimitConfig{Name: "again", Domain: "d1"}), "duplicate domain 'd1'"},
		{"wrong type", []*anypb.Any{mustAny(t, good), {TypeUrl: "type.googleapis.com/envoy.config.cluster.v3.Cluster"}}, "resource 1: type"},
		{"undecodable", []*anypb.Any{{TypeUrl: TypeURL, Value: []byte{0xff, 0xff}}}, "resource 0: decode RateLimitConfig"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Convert(tc.set, "a")
			if err == nil {
				t.Fatalf("Convert accepted the set: %d domains", cfg.Len())
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

func TestTypeURL(t *testing.T) {
	if TypeURL != resource.RateLimitConfigType {
		t.Fatalf("TypeURL = %q, go-control-plane says %q", TypeURL, resource.RateLimitConfigType)
	}
}

func TestConvertEmptySet(t *testing.T) {
	cfg, err := Convert(nil, "a")
	if err != nil || cfg.Len() != 0 {
		t.Fatalf("Convert(nil) = %v domains, %v; want an empty Config", cfg.Len(), err)
	}
}
