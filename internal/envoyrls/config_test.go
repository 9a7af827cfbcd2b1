package envoyrls

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/tokenserver/tokenserver/internal/bucket"
)

func loadTestdata(t *testing.T, names ...string) (*Config, error) {
	t.Helper()
	var files []File
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join("testdata", n))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, File{Name: n, Data: b})
	}
	return ParseFiles(files)
}

func mustLoad(t *testing.T, names ...string) *Config {
	t.Helper()
	c, err := loadTestdata(t, names...)
	if err != nil {
		t.Fatalf("load %v: %v", names, err)
	}
	return c
}

// The reference's test/config cases of refused files, with its messages.
func TestRefusedFiles(t *testing.T) {
	cases := []struct {
		files []string
		want  string
	}{
		{[]string{"empty_domain.yaml"}, "empty_domain.yaml: config file cannot have empty domain"},
		{[]string{"basic_config.yaml", "duplicate_domain.yaml"}, "duplicate_domain.yaml: duplicate domain 'test-domain' in config file"},
		{[]string{"empty_key.yaml"}, "empty_key.yaml: line 3: descriptor has empty key"},
		{[]string{"duplicate_key.yaml"}, "duplicate_key.yaml: line 6: duplicate descriptor composite key 'test-domain.key1_value1'"},
		{[]string{"bad_limit_unit.yaml"}, "bad_limit_unit.yaml: line 3: invalid rate limit unit 'foo'"},
		{[]string{"replaces_self.yaml"}, "replaces should not contain name of same descriptor"},
		{[]string{"replaces_empty.yaml"}, "should not have an empty replaces entry"},
		{[]string{"bad_yaml.yaml"}, "bad_yaml.yaml: error loading config file: yaml: line"},
		{[]string{"misspelled_key.yaml"}, "misspelled_key.yaml: line 5: config error, unknown key 'ratelimit'"},
		{[]string{"misspelled_key2.yaml"}, "misspelled_key2.yaml: line 7: config error, unknown key 'requestsperunit'"},
		{[]string{"non_string_key.yaml"}, "non_string_key.yaml: line 1: config error, key is not of type string: 0.25"},
		{[]string{"non_map_list.yaml"}, "non_map_list.yaml: line 3: config error, yaml file contains list of type other than map: a"},
		{[]string{"unlimited_with_unit.yaml"}, "should not specify rate limit unit when unlimited"},
	}
	for _, tc := range cases {
		t.Run(tc.files[len(tc.files)-1], func(t *testing.T) {
			_, err := loadTestdata(t, tc.files...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestRefusedInline(t *testing.T) {
	cases := []struct{ name, yaml, want string }{
		{"float value", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: 1.5\n", "line 6: error checking config"},
		{"negative", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: -1\n", "error loading config file"},
		{"list root", "- a\n", "not a map"},
		{"unknown algorithm", "domain: d\ndescriptors:\n  - key: k\n    algorithm: magic\n    rate_limit: {unit: second, requests_per_unit: 1}\n", "line 3: algorithm: unknown algorithm"},
		{"algorithm without limit", "domain: d\ndescriptors:\n  - key: k\n    algorithm: sliding_window\n", "need a rate_limit"},
		{"burst on window", "domain: d\ndescriptors:\n  - key: k\n    burst: 5\n    rate_limit: {unit: second, requests_per_unit: 1}\n", "burst applies to token-bucket"},
		{"algorithm unlimited", "domain: d\ndescriptors:\n  - key: k\n    algorithm: token_bucket\n    rate_limit: {unlimited: true}\n", "do not apply to an unlimited"},
		{"share without wildcard", "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n", "share_threshold can only be used with wildcard"},
		{"unknown nested", "domain: d\ndescriptors:\n  - key: k\n    descriptors:\n      - key: j\n        typo: 1\n", "line 6: config error, unknown key 'typo'"},
		{"bool key", "true: x\ndomain: d\n", "key is not of type string: true"},
		{"sliding log cap", "domain: d\ndescriptors:\n  - key: k\n    algorithm: sliding-log\n    rate_limit: {unit: second, requests_per_unit: 20000}\n", "sliding-log cap"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseDomain("f.yaml", []byte(tc.yaml), Meta{})
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "f.yaml: ") {
				t.Fatalf("got %v, want an error naming f.yaml containing %q", err, tc.want)
			}
		})
	}
}

func TestAcceptedLikeTheReference(t *testing.T) {
	cases := []struct{ name, yaml string }{
		// The reference's key check is flat: a known key out of place is ignored.
		{"misplaced known key", "domain: d\nunit: second\ndescriptors:\n  - key: k\n"},
		{"metadata anything", "domain: d\ndescriptors:\n  - key: k\n    metadata: {a: [1, 2.5, {b: c}], 7: x}\n    rate_limit: {unit: second, requests_per_unit: 1}\n"},
		{"anchors", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: &l {unit: minute, requests_per_unit: 3}\n  - key: j\n    rate_limit: *l\n"},
		{"unlimited without unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, requests_per_unit: 5}\n"},
		{"extensions", "domain: d\ndescriptors:\n  - key: k\n    algorithm: TOKEN_BUCKET\n    burst: 20\n    rate_limit: {unit: second, requests_per_unit: 10}\n"},
		{"zero limit with algorithm", "domain: d\ndescriptors:\n  - key: k\n    algorithm: sliding-window\n    rate_limit: {unit: second, requests_per_unit: 0}\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := ParseDomain("f.yaml", []byte(tc.yaml), Meta{}); err != nil {
				t.Fatal(err)
			}
		})
	}
	for _, n := range []string{"basic_config.yaml", "metadata.yaml", "shadowmode_config.yaml", "share_threshold.yaml", "wildcard.yaml", "merge_domain_key1.yaml"} {
		mustLoad(t, n)
	}
	// Two files of one domain are refused: there is no MERGE_DOMAIN_CONFIG.
	if _, err := loadTestdata(t, "merge_domain_key1.yaml", "merge_domain_key2.yaml"); err == nil {
		t.Fatal("duplicate domain accepted")
	}
}

func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

type matchCase struct {
	name   string
	domain string
	d      *ratelimitv3.RateLimitDescriptor
	// want: nil when no limit applies; else these fields.
	none      bool
	rpu       uint32
	unit      Unit
	unlimited bool
	shadow    bool
	limName   string
	rule      string
	detailed  string
	key       string
}

func runMatch(t *testing.T, c *Config, cases []matchCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dom := tc.domain
			if dom == "" {
				dom = "test-domain"
			}
			l := c.Resolve(dom, tc.d)
			if tc.none {
				if l != nil {
					t.Fatalf("got %+v, want no limit", l)
				}
				return
			}
			if l == nil {
				t.Fatal("no limit, want one")
			}
			if l.RequestsPerUnit != tc.rpu || l.Unit != tc.unit || l.Unlimited != tc.unlimited || l.Shadow != tc.shadow || l.Name != tc.limName {
				t.Fatalf("got %d/%v unlimited=%v shadow=%v name=%q", l.RequestsPerUnit, l.Unit, l.Unlimited, l.Shadow, l.Name)
			}
			if tc.rule != "" && l.Rule != tc.rule {
				t.Errorf("rule %q, want %q", l.Rule, tc.rule)
			}
			if l.DetailedRule != tc.detailed {
				t.Errorf("detailed rule %q, want %q", l.DetailedRule, tc.detailed)
			}
			if tc.key != "" && l.Key != tc.key {
				t.Errorf("key %q, want %q", l.Key, tc.key)
			}
		})
	}
}

// The reference's TestBasicConfig, TestShadowModeConfig and TestWildcardConfig.
func TestMatchBasic(t *testing.T) {
	c := mustLoad(t, "basic_config.yaml")
	runMatch(t, c, []matchCase{
		{name: "unknown domain", domain: "foo_domain", d: desc(), none: true},
		{name: "no entries", d: desc(), none: true},
		{name: "key1 other value", d: desc("key1", "something"), none: true},
		{name: "key1 placeholder", d: desc("key1", "value1"), none: true},
		{name: "deeper than config", d: desc("key2", "value2", "subkey", "subvalue"), none: true},
		{name: "key5 sub value mismatch", d: desc("key5", "value5", "subkey5", "subvalue"), none: true},
		{name: "key without value", d: desc("key1", "value1", "subkey1", "something"), rpu: 5, unit: UnitSecond, rule: "key1_value1.subkey1", key: "test-domain_key1_value1_subkey1_something_"},
		{name: "most specific", d: desc("key1", "value1", "subkey1", "subvalue1"), rpu: 10, unit: UnitSecond, rule: "key1_value1.subkey1_subvalue1"},
		{name: "key2 default", d: desc("key2", "something"), rpu: 20, unit: UnitMinute, rule: "key2"},
		{name: "key2 value2", d: desc("key2", "value2"), rpu: 30, unit: UnitMinute, rule: "key2_value2"},
		{name: "key2 value3 whitelisted", d: desc("key2", "value3"), none: true},
		{name: "key3", d: desc("key3", "foo"), rpu: 1, unit: UnitHour, rule: "key3"},
		{name: "key4 named", d: desc("key4", "foo"), rpu: 1, unit: UnitDay, limName: "key4_rate_limit", rule: "key4"},
		{name: "key6 unlimited", d: desc("key6", "foo"), unlimited: true},
		{name: "key7 detailed", d: desc("key7", "unspecified_value"), rpu: 70, unit: UnitMinute, rule: "key7", detailed: "key7_unspecified_value"},
		{name: "key7 detailed other", d: desc("key7", "another_value"), rpu: 70, unit: UnitMinute, detailed: "key7_another_value"},
	})
	s := mustLoad(t, "shadowmode_config.yaml")
	runMatch(t, s, []matchCase{
		{name: "shadow sub", d: desc("key1", "value1", "subkey1", "subvalue1"), rpu: 10, unit: UnitSecond, shadow: true},
		{name: "not shadow", d: desc("key1", "value1", "subkey1", "x"), rpu: 5, unit: UnitSecond},
		{name: "shadow top", d: desc("key2", "x"), rpu: 20, unit: UnitMinute, shadow: true},
		{name: "value beats shadow default", d: desc("key2", "value2"), rpu: 30, unit: UnitMinute},
	})
	w := mustLoad(t, "wildcard.yaml")
	runMatch(t, w, []matchCase{
		{name: "trailing wildcard", d: desc("wild", "foo2"), rpu: 20, unit: UnitMinute, rule: "wild_foo*", key: "test-domain_wild_foo2_"},
		{name: "trailing wildcard empty rest", d: desc("wild", "foo"), rpu: 20, unit: UnitMinute},
		{name: "trailing wildcard miss", d: desc("wild", "bar"), none: true},
		{name: "no wildcard exact", d: desc("noWild", "foo"), rpu: 20, unit: UnitMinute},
		{name: "no wildcard literal star", d: desc("noWild", "foo1"), none: true},
		{name: "no value", d: desc("noVal", "foo"), rpu: 20, unit: UnitMinute},
		{name: "middle wildcard", d: desc("midWild", "barxyzb"), rpu: 20, unit: UnitMinute},
		{name: "middle wildcard miss", d: desc("midWild", "barxyzc"), none: true},
		{name: "multi wildcard", d: desc("multiWild", "foo1bar2baz"), rpu: 10, unit: UnitMinute},
		{name: "multi wildcard adjacent", d: desc("multiWild", "foobarbaz"), rpu: 10, unit: UnitMinute},
		{name: "multi wildcard order", d: desc("multiWild", "foobazbar"), none: true},
		{name: "nested wildcard", d: desc("nestedWild", "val1", "wild", "goo2"), rpu: 20, unit: UnitMinute},
		{name: "nested wildcard miss", d: desc("nestedWild", "val1", "wild", "foo2"), none: true},
	})
}

func TestShareThresholdKeys(t *testing.T) {
	c := mustLoad(t, "share_threshold.yaml")
	runMatch(t, c, []matchCase{
		{name: "shared a", d: desc("files", "files/a.pdf"), rpu: 100, unit: UnitMinute, key: "test-domain_files_files/*_", rule: "files_files/*"},
		{name: "nested shared", d: desc("nested", "parent", "files", "nested/x"), rpu: 200, unit: UnitMinute, key: "test-domain_nested_parent_files_nested/*_"},
		{name: "explicit beats wildcard", d: desc("file", "test1"), rpu: 50, unit: UnitMinute, key: "test-domain_file_test1_"},
		{name: "wildcard shared", d: desc("file", "test2"), rpu: 100, unit: UnitMinute, key: "test-domain_file_test*_", rule: "file_test*"},
		{name: "mixed", d: desc("path", "path/a", "file", "file/b", "type", "t"), rpu: 120, unit: UnitMinute, key: "test-domain_path_path/*_file_file/b_type_t_", rule: "path_path/*.file_file/*.type"},
		{name: "detailed with share", d: desc("service", "svc/a", "endpoint", "e1"), rpu: 80, unit: UnitMinute, key: "test-domain_service_svc/*_endpoint_e1_", detailed: "service_svc/*.endpoint_e1"},
	})
	a := c.Resolve("test-domain", desc("files", "files/a.pdf"))
	b := c.Resolve("test-domain", desc("files", "files/b.csv"))
	if a.CounterKey() != b.CounterKey() {
		t.Fatalf("share_threshold: %q and %q are different counters", a.CounterKey(), b.CounterKey())
	}
}

// README examples 2, 3, 4, 5, 7 (matching; the answers are in service_test).
func TestMatchReadmeExamples(t *testing.T) {
	ex4a := mustParse(t, "domain: example4\ndescriptors:\n  - key: key\n    value: value\n    rate_limit: {requests_per_unit: 300, unit: second}\n")
	runMatch(t, ex4a, []matchCase{{name: "ex4 depth mismatch", domain: "example4", d: desc("key", "value", "subkey", "subvalue"), none: true}})
	ex4b := mustParse(t, "domain: example4\ndescriptors:\n  - key: key\n    value: value\n    descriptors:\n      - key: subkey\n        rate_limit: {requests_per_unit: 300, unit: second}\n")
	runMatch(t, ex4b, []matchCase{{name: "ex4 depth match", domain: "example4", d: desc("key", "value", "subkey", "subvalue"), rpu: 300, unit: UnitSecond}})
	ex3 := mustParse(t, readmeExample3)
	runMatch(t, ex3, []matchCase{
		{name: "ex3 generic", domain: "edge_proxy_per_ip", d: desc("remote_address", "50.0.0.1"), rpu: 10, unit: UnitSecond},
		{name: "ex3 blacklist", domain: "edge_proxy_per_ip", d: desc("remote_address", "50.0.0.5"), rpu: 0, unit: UnitSecond},
	})
}

func mustParse(t *testing.T, yamls ...string) *Config {
	t.Helper()
	var ds []*Domain
	for i, y := range yamls {
		d, err := ParseDomain("inline"+string(rune('0'+i))+".yaml", []byte(y), Meta{})
		if err != nil {
			t.Fatal(err)
		}
		ds = append(ds, d)
	}
	c, err := NewConfig(ds...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

const readmeExample3 = `domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
`

// The reference's TestConfigLimitOverride: the override's key is the
// request's entries; a different value is a different counter; the same
// entries and unit as a configured limit share its counter.
func TestOverrideKeying(t *testing.T) {
	c := mustLoad(t, "basic_config.yaml")
	ov := func(rpu uint32, u typev3.RateLimitUnit, kv ...string) *ratelimitv3.RateLimitDescriptor {
		d := desc(kv...)
		d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: u}
		return d
	}
	if l := c.Resolve("foo_domain", ov(10, typev3.RateLimitUnit_DAY)); l != nil {
		t.Fatal("override in an unknown domain applied")
	}
	a := c.Resolve("test-domain", ov(10, typev3.RateLimitUnit_DAY, "key1", "value1", "subkey1", "something"))
	if a == nil || a.RequestsPerUnit != 10 || a.Unit != UnitDay || !a.Override || a.Rule != OverrideRule || a.Key != "test-domain_key1_value1_subkey1_something_" {
		t.Fatalf("override: %+v", a)
	}
	other := c.Resolve("test-domain", ov(42, typev3.RateLimitUnit_HOUR, "key1", "value1", "subkey1", "something_else"))
	if other.CounterKey() == a.CounterKey() {
		t.Fatal("different values share a counter")
	}
	sameUnit := c.Resolve("test-domain", ov(99, typev3.RateLimitUnit_SECOND, "key1", "value1", "subkey1", "something"))
	conf := c.Resolve("test-domain", desc("key1", "value1", "subkey1", "something"))
	if sameUnit.CounterKey() != conf.CounterKey() || sameUnit.HashKey() != conf.HashKey() {
		t.Fatalf("override with the configured unit: %q, configured %q: want one counter", sameUnit.CounterKey(), conf.CounterKey())
	}
	if a.CounterKey() == conf.CounterKey() {
		t.Fatal("override with another unit shares the configured counter")
	}
	if got := conf.CacheKey(1234567); got != "test-domain_key1_value1_subkey1_something_1234567" {
		t.Fatalf("cache key %q", got)
	}
	if got := a.CacheKey(1234567); got != "test-domain_key1_value1_subkey1_something_1209600" {
		t.Fatalf("day cache key %q", got)
	}
}

func TestExtensionFields(t *testing.T) {
	c := mustParse(t, "domain: d\ndescriptors:\n  - key: k\n    algorithm: sliding_window\n    rate_limit: {unit: minute, requests_per_unit: 60}\n  - key: j\n    algorithm: token-bucket\n    burst: 30\n    rate_limit: {unit: second, requests_per_unit: 10}\n")
	k := c.Resolve("d", desc("k", "x"))
	if k.Algorithm != bucket.SlidingWindow || k.CounterKey() == "d_k_x_MINUTE" {
		t.Fatalf("k: %v %q", k.Algorithm, k.CounterKey())
	}
	j := c.Resolve("d", desc("j", "y"))
	if j.Algorithm != bucket.TokenBucket || j.Burst != 30 {
		t.Fatalf("j: %v %d", j.Algorithm, j.Burst)
	}
	bc := j.BucketConfig()
	if err := bc.Validate(); err != nil || bc.Capacity() != 30 {
		t.Fatalf("bucket config %+v: %v", bc, err)
	}
	def := mustLoad(t, "basic_config.yaml").Resolve("test-domain", desc("key2", "x"))
	if def.Algorithm != bucket.FixedWindow {
		t.Fatalf("default algorithm %v", def.Algorithm)
	}
}

func TestConfigMarshalDeterministic(t *testing.T) {
	a, err := ParseDomain("a.yaml", []byte(readmeExample3), Meta{Version: 7, Author: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	basic, err := os.ReadFile("testdata/basic_config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	b, err := ParseDomain("basic_config.yaml", basic, Meta{Version: 9, Author: "file:basic_config.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	c1, err := NewConfig(a, b)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := NewConfig(b, a)
	if err != nil {
		t.Fatal(err)
	}
	m1, err := c1.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	m2, err := c2.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(m1, m2) {
		t.Fatalf("marshal depends on order:\n%s\n%s", m1, m2)
	}
	back, err := UnmarshalConfig(m1)
	if err != nil {
		t.Fatal(err)
	}
	m3, err := back.Marshal()
	if err != nil || !bytes.Equal(m1, m3) {
		t.Fatalf("round trip changed: %v\n%s\n%s", err, m1, m3)
	}
	if got := back.Domain("test-domain").Meta(); got != (Meta{Version: 9, Author: "file:basic_config.yaml", Source: "basic_config.yaml"}) {
		t.Fatalf("meta %+v", got)
	}
	if !bytes.Equal(back.Domain("test-domain").YAML(), basic) {
		t.Fatal("YAML not kept unchanged")
	}
	if l := back.Resolve("test-domain", desc("key2", "value2")); l == nil || l.RequestsPerUnit != 30 {
		t.Fatalf("resolve after round trip: %+v", l)
	}
	// With and Without leave the original untouched.
	w := c1.Without("test-domain")
	if w.Len() != 1 || c1.Len() != 2 || c1.With(a.WithMeta(Meta{Version: 8})).Domain("edge_proxy_per_ip").Meta().Version != 8 || c1.Domain("edge_proxy_per_ip").Meta().Version != 7 {
		t.Fatal("With/Without changed the original")
	}
}
