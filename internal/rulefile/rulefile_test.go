package rulefile

import (
	"errors"
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
)

const multiDoc = `# three documents: one rule, a list, and {rules: [...]}
name: one
algorithm: TOKEN_BUCKET
limit: 10
period: 1s
burst: 20
---
- name: two
  algorithm: sliding-window
  limit: 10
  period: 1s
  sample_count: 5
- name: three
  algorithm: CONCURRENCY
  limit: 4
  period: 1m
  fallback: {policy: local, limit: 2}
---
rules:
  - {name: four, algorithm: FIXED_WINDOW, limit: 5, period: 1m30s, sampleCount: 0, overrides: [{key: vip, limit: 50}]}
`

func TestParseShapes(t *testing.T) {
	rs, err := Parse("rules.yaml", []byte(multiDoc))
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		name string
		pos  string
		rule rule.Rule
	}{
		{"one", "rules.yaml:2:1", rule.Rule{Name: "one", Algorithm: bucket.TokenBucket, Limit: 10, Period: time.Second, Burst: 20}},
		{"two", "rules.yaml:8:3", rule.Rule{Name: "two", Algorithm: bucket.SlidingWindow, Limit: 10, Period: time.Second, SampleCount: 5}},
		{"three", "rules.yaml:13:3", rule.Rule{Name: "three", Algorithm: bucket.Concurrency, Limit: 4, Period: time.Minute,
			Fallback: rule.Fallback{Policy: rule.FallbackLocal, Limit: 2}}},
		{"four", "rules.yaml:20:5", rule.Rule{Name: "four", Algorithm: bucket.FixedWindow, Limit: 5, Period: 90 * time.Second,
			Overrides: []rule.Override{{Key: "vip", Limit: 50}}}},
	}
	if len(rs) != len(want) {
		t.Fatalf("Parse: %d rules, want %d", len(rs), len(want))
	}
	for i, w := range want {
		if got := rs[i].Pos.String(); got != w.pos {
			t.Errorf("rule %s at %s, want %s", w.name, got, w.pos)
		}
		if !reflect.DeepEqual(*rs[i].Rule, w.rule) {
			t.Errorf("rule %s = %+v, want %+v", w.name, *rs[i].Rule, w.rule)
		}
	}
}

// TestParseListOutput: what 'rule list -o json' prints (int64 as strings,
// durations as seconds, output-only fields) reads back.
func TestParseListOutput(t *testing.T) {
	in := `{"rules":[{"name":"api","algorithm":"TOKEN_BUCKET","limit":"100","period":"1.500s","burst":"200",` +
		`"maxKeys":"7","penalty":"5s","deny":["bad"],"allow":["good"],"shadow":true,` +
		`"fallback":{"policy":"LOCAL","limit":"10"},"lease":{"maxBatch":"20","ttl":"0.100s"},` +
		`"version":"12","generation":"3","updatedBy":"alice"}]}`
	rs, err := Parse("list.json", []byte(in))
	if err != nil {
		t.Fatal(err)
	}
	want := rule.Rule{Name: "api", Algorithm: bucket.TokenBucket, Limit: 100, Period: 1500 * time.Millisecond, Burst: 200,
		MaxKeys: 7, Penalty: 5 * time.Second, Deny: []string{"bad"}, Allow: []string{"good"}, Shadow: true,
		Fallback: rule.Fallback{Policy: rule.FallbackLocal, Limit: 10}, Lease: rule.Lease{MaxBatch: 20, TTL: 100 * time.Millisecond}}
	if len(rs) != 1 || !reflect.DeepEqual(*rs[0].Rule, want) {
		t.Fatalf("Parse = %+v, want %+v", rs, want)
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     string // the whole message
	}{
		{"syntax", "name: a\nalgorithm: TOKEN_BUCKET\nlimit: 1\nperiod: 1s\n---\nname: b\nlimit: 5\n  period: 1s\n",
			"f.yaml: yaml: line 8: mapping values are not allowed in this context"},
		{"unknown field", "- name: a\n  algorithm: TOKEN_BUCKET\n  limit: 1\n  period: 1s\n- name: b\n  algorithm: TOKEN_BUCKET\n  limit: 1\n  sampleCont: 3\n  period: 1s\n",
			`f.yaml:8:3: rule "b": unknown field "sampleCont" (want name, algorithm, limit, period, burst, sampleCount, warmup, penalty, maxKeys, overrides, deny, allow, shadow, fallback, lease, calendar, timeZone, inline, reservationTtl, durable, version, generation, updatedBy)`},
		{"unknown nested field", "name: a\nalgorithm: TOKEN_BUCKET\nlimit: 1\nperiod: 1s\nlease: {ttl: 1s, max: 3}\n",
			`f.yaml:5:18: rule "a": unknown field "max" (want maxBatch, ttl)`},
		{"bad enum", "name: a\nalgorithm: TOKEN_BUCKT\nlimit: 1\nperiod: 1s\n",
			`f.yaml:2:12: rule "a": unknown algorithm "TOKEN_BUCKT" (want TOKEN_BUCKET, LEAKY_BUCKET, FIXED_WINDOW, SLIDING_WINDOW, SLIDING_LOG or CONCURRENCY; token-bucket ... works too)`},
		{"enum number out of range", "name: a\nalgorithm: 9\nlimit: 1\nperiod: 1s\n", `f.yaml:2:12: rule "a": unknown algorithm 9`},
		{"bad policy", "name: a\nalgorithm: TOKEN_BUCKET\nlimit: 1\nperiod: 1s\nfallback:\n  policy: maybe\n",
			`f.yaml:6:11: rule "a": unknown fallback policy "maybe" (want LOCAL, ALLOW or DENY, in any case)`},
		{"bad duration", "name: a\nalgorithm: TOKEN_BUCKET\nlimit: 1\nperiod: soon\n",
			`f.yaml:4:9: rule "a": want a duration like 1s, 250ms or 1m30s (under 292 years), got soon`},
		{"duration as a number", "name: a\nalgorithm: TOKEN_BUCKET\nlimit: 1\nperiod: 1\n",
			`f.yaml:4:9: rule "a": want a duration like 1s, 250ms or 1m30s (under 292 years), got 1`},
		{"float limit", "name: a\nalgorithm: TOKEN_BUCKET\nlimit: 1.5\nperiod: 1s\n", `f.yaml:3:8: rule "a": want an integer, got 1.5`},
		{"int32 overflow", "name: a\nalgorithm: SLIDING_WINDOW\nlimit: 1\nperiod: 1s\nsampleCount: 4294967296\n",
			`f.yaml:5:14: rule "a": want an integer of 32 bits, got 4294967296`},
		{"number as name", "name: 12\nalgorithm: TOKEN_BUCKET\nlimit: 1\nperiod: 1s\n", `f.yaml:1:7: want a string, got 12 (quote it)`},
		{"mapping for a scalar", "name: a\nalgorithm: TOKEN_BUCKET\nlimit: {x: 1}\nperiod: 1s\n", `f.yaml:3:8: rule "a": want an integer, got a mapping`},
		{"scalar for a mapping", "name: a\nalgorithm: TOKEN_BUCKET\nlimit: 1\nperiod: 1s\nfallback: local\n",
			`f.yaml:5:11: rule "a": want a mapping of policy, limit, got "local"`},
		{"scalar for a list", "name: a\nalgorithm: TOKEN_BUCKET\nlimit: 1\nperiod: 1s\ndeny: x\n", `f.yaml:5:7: rule "a": want a list, got "x"`},
		{"duplicate key", "name: a\nname: b\n", `f.yaml:2:1: rule "a": field "name" appears twice`},
		{"both spellings", "name: a\nalgorithm: SLIDING_WINDOW\nlimit: 1\nperiod: 1s\nsampleCount: 2\nsample_count: 2\n",
			`f.yaml:6:1: rule "a": field "sample_count" is set twice (also as "sampleCount")`},
		{"beside rules", "rules: []\nextra: 1\n", `f.yaml:2:1: unknown field "extra" beside "rules"`},
		{"rules not a list", "rules: 3\n", `f.yaml:1:8: "rules" must be a list of rules`},
		{"scalar document", "just text\n", `f.yaml:1:1: want a rule, a list of rules or {rules: [...]}, got "just text"`},
		{"scalar item", "- name: a\n- 3\n", `f.yaml:2:3: want a rule (a mapping), got "3"`},
		// Validation errors point at the field the rule.FieldError names.
		{"invalid field", "name: a\nalgorithm: TOKEN_BUCKET\nlimit: 1\nperiod: 1s\n---\nname: b\nalgorithm: SLIDING_WINDOW\nlimit: 1\nperiod: 1s\nsampleCount: 3\n",
			`f.yaml:10:1: rule "b": sample_count 3 must divide the period 1s`},
		{"missing field points at the rule", "x: &r 1\n", `f.yaml:1:1: unknown field "x" (want name, algorithm, limit, period, burst, sampleCount, warmup, penalty, maxKeys, overrides, deny, allow, shadow, fallback, lease, calendar, timeZone, inline, reservationTtl, durable, version, generation, updatedBy)`},
		{"missing limit", "- name: a\n  algorithm: TOKEN_BUCKET\n  period: 1s\n", `f.yaml:1:3: rule "a": limit must be > 0, got 0`},
		{"override", "name: api\nalgorithm: token-bucket\nlimit: 10\nperiod: 1s\noverrides:\n  - {key: a, limit: 5}\n  - key: b\n    limit: 0\n",
			`f.yaml:8:5: rule "api": overrides[1] (key "b"): limit must be > 0, got 0`},
		{"override index as written", "name: api\nalgorithm: token-bucket\nlimit: 10\nperiod: 1s\noverrides:\n  - {key: z, limit: 0}\n  - {key: a, limit: 5}\n",
			`f.yaml:6:14: rule "api": overrides[0] (key "z"): limit must be > 0, got 0`},
		{"deny entry", "name: api\nalgorithm: token-bucket\nlimit: 10\nperiod: 1s\ndeny: [ok, \"\"]\n",
			`f.yaml:5:12: rule "api": deny[1]: key is empty`},
		{"lease", "name: api\nalgorithm: token-bucket\nlimit: 10\nperiod: 1s\nlease:\n  max_batch: 5\n",
			`f.yaml:5:1: rule "api": lease.ttl must be > 0 when lease.max_batch is set`},
		{"name", "name: \"a b\"\nalgorithm: token-bucket\nlimit: 10\nperiod: 1s\n",
			`f.yaml:1:1: rule name "a b": character ' ' at 1 is not one of [A-Za-z0-9_.:/-]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs, err := Parse("f.yaml", []byte(tc.in))
			if err == nil {
				t.Fatalf("Parse = %d rules, want an error", len(rs))
			}
			if err.Error() != tc.want {
				t.Errorf("error\n %s\nwant\n %s", err, tc.want)
			}
			var fe *Error
			if !errors.As(err, &fe) {
				t.Errorf("%v is not a *rulefile.Error", err)
			}
		})
	}
}

// TestParseFieldError: a validation error keeps rule.FieldError, so that a
// caller can find the field and that it is rule.ErrInvalid.
func TestParseFieldError(t *testing.T) {
	_, err := Parse("f.yaml", []byte("name: a\nalgorithm: TOKEN_BUCKET\nlimit: 0\nperiod: 1s\n"))
	var fe *rule.FieldError
	if !errors.As(err, &fe) || fe.Path != "limit" || !errors.Is(err, rule.ErrInvalid) {
		t.Fatalf("Parse: %v, want a rule.FieldError at limit", err)
	}
}

func TestParseAccepts(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     int // rules
	}{
		{"empty", "", 0},
		{"empty documents", "---\n# nothing\n---\n", 0},
		{"null rules", "rules:\n", 0},
		{"document end marker", "name: a\nalgorithm: TOKEN_BUCKET\nlimit: 1\nperiod: 1s\n...\n---\n- name: b\n  algorithm: TOKEN_BUCKET\n  limit: 1\n  period: 1s\n", 2},
		{"enum numbers", "name: a\nalgorithm: 1\nlimit: 1\nperiod: 1s\nfallback: {policy: 2}\n", 1},
		{"yaml 1.1 bool", "name: a\nalgorithm: TOKEN_BUCKET\nlimit: 1\nperiod: 1s\nshadow: yes\n", 1},
		{"null field", "name: a\nalgorithm: TOKEN_BUCKET\nlimit: 1\nperiod: 1s\nfallback: null\nburst:\n", 1},
		{"anchors and merge keys", "- &base {name: a, algorithm: TOKEN_BUCKET, limit: 1, period: 1s}\n- <<: *base\n  name: b\n", 2},
		{"unspecified policy", "name: a\nalgorithm: TOKEN_BUCKET\nlimit: 1\nperiod: 1s\nfallback: {policy: FALLBACK_POLICY_UNSPECIFIED}\n", 1},
		{"duplicate deny entries", "name: a\nalgorithm: TOKEN_BUCKET\nlimit: 1\nperiod: 1s\ndeny: [x, x]\n", 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs, err := Parse("f.yaml", []byte(tc.in))
			if err != nil || len(rs) != tc.want {
				t.Fatalf("Parse = %d rules, %v; want %d rules", len(rs), err, tc.want)
			}
		})
	}
}

// TestRepositoryFiles: the rule files the repository ships still parse.
func TestRepositoryFiles(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(readme), "cat > rules.yaml <<'YAML'\n")
	block, _, ok2 := strings.Cut(block, "\nYAML\n")
	if !ok || !ok2 {
		t.Fatal("README.md has no rules.yaml example")
	}
	if rs, err := Parse("README.md", []byte(block)); err != nil || len(rs) != 2 {
		t.Errorf("README example: %d rules, %v; want 2", len(rs), err)
	}

	raw, err := os.ReadFile("../../deploy/kubernetes/rules-configmap.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cm struct {
		Data map[string]string `yaml:"data"`
	}
	if err := yaml.Unmarshal(raw, &cm); err != nil {
		t.Fatal(err)
	}
	rs, err := Parse("rules.yaml", []byte(cm.Data["rules.yaml"]))
	if err != nil || len(rs) != 3 {
		t.Fatalf("deploy rules: %d rules, %v; want 3", len(rs), err)
	}
	if api := rs[0].Rule; api.Lease != (rule.Lease{MaxBatch: 20, TTL: 500 * time.Millisecond}) || api.Fallback != (rule.Fallback{Policy: rule.FallbackLocal, Limit: 20}) {
		t.Errorf("deploy rule api = %+v", api)
	}
}

// TestParseAliasBomb: a document whose merge keys expand to a billion
// nodes is refused.
func TestParseAliasBomb(t *testing.T) {
	in := "- &m0 {name: a, algorithm: TOKEN_BUCKET, limit: 1, period: 1s}\n"
	for k := 1; k <= 9; k++ {
		prev := "*m" + strconv.Itoa(k-1)
		in += "- &m" + strconv.Itoa(k) + " {<<: [" + strings.Repeat(prev+", ", 9) + prev + "]}\n"
	}
	// Without the bound the walk would visit 10^9 nodes (the test's
	// timeout); with it, it stops early.
	_, err := Parse("f.yaml", []byte(in))
	if err == nil || !strings.Contains(err.Error(), "too many nodes") {
		t.Fatalf("Parse: %v, want too many nodes", err)
	}
}

// TestParseLargestRule: a rule at the list caps parses within the walk's
// node bound.
func TestParseLargestRule(t *testing.T) {
	var b strings.Builder
	b.WriteString("name: big\nalgorithm: TOKEN_BUCKET\nlimit: 10\nperiod: 1s\noverrides:\n")
	for i := range rule.MaxListLen {
		fmt.Fprintf(&b, "  - {key: k%d, limit: 5, burst: 6}\n", i)
	}
	for _, list := range []string{"deny", "allow"} {
		b.WriteString(list + ":\n")
		for i := range rule.MaxListLen {
			fmt.Fprintf(&b, "  - %s%d\n", list, i)
		}
	}
	rs, err := Parse("big.yaml", []byte(b.String()))
	if err != nil || len(rs) != 1 || len(rs[0].Rule.Overrides) != rule.MaxListLen {
		t.Fatalf("Parse: %v", err)
	}
}
