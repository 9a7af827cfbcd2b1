package main

import (
	"encoding/json"
	"io"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"sigs.k8s.io/yaml"

	"github.com/tokenserver/tokenserver/internal/grant"
	"github.com/tokenserver/tokenserver/internal/rulefile"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// structuredCommands are the commands with -o json (and so -o yaml) that
// a single in-process node answers, in an order that works: each entry's
// args after --server ADDR, with {grant} and {dir} filled in.
func structuredCommands() [][]string {
	return [][]string{
		{"rule", "put", "api", "--algorithm", "token-bucket", "--limit", "5", "--period", "1m", "--override", "vip=10/20", "--deny", "bad", "--penalty", "5s", "--fallback", "local", "--fallback-limit", "2", "--lease-max", "3", "--lease-ttl", "1s"},
		{"rule", "put", "jobs", "--algorithm", "concurrency", "--limit", "2", "--period", "1m"},
		{"rule", "get", "api"},
		{"rule", "list"},
		{"rule", "apply", "-f", "{dir}/extra.yaml"},
		{"rule", "delete", "extra"},
		{"acquire", "api", "alice", "--count", "2"},
		{"refill", "api", "alice", "--grant", "{grant}"},
		{"lease", "renew", "jobs", "w1", "--grant", "{lease}"},
		{"node", "status"},
		{"cluster", "status"},
		{"snapshot", "save", "{dir}/snap"},
		{"envoy", "apply", "-f", "{dir}/envoy.yaml"},
		{"envoy", "get", "edge"},
		{"envoy", "list"},
		{"envoy", "delete", "edge"},
		{"version"},
		{"token", "create", "ci", "editor"},
		{"certs", "--out-dir", "{dir}/pki", "create-ca"},
	}
}

// TestOutputOneJSONStyle: every command's -o json uses one casing
// (lowerCamelCase keys, no snake_case anywhere), and its -o yaml is the
// same document.
func TestOutputOneJSONStyle(t *testing.T) {
	addr := startServer(t)
	dir := t.TempDir()
	writeFileAt(t, filepath.Join(dir, "extra.yaml"), "name: extra\nalgorithm: FIXED_WINDOW\nlimit: 1\nperiod: 1s\n")
	writeFileAt(t, filepath.Join(dir, "envoy.yaml"), "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit:\n      unit: second\n      requests_per_unit: 10\n")
	ok(t, addr, "rule", "put", "api", "--algorithm", "token-bucket", "--limit", "5", "--period", "1m")
	ok(t, addr, "rule", "put", "jobs", "--algorithm", "concurrency", "--limit", "2", "--period", "1m")
	var got acquireJSON
	decode(t, ok(t, addr, "acquire", "api", "bob", "-o", "json"), &got)
	var lease acquireJSON
	decode(t, ok(t, addr, "acquire", "jobs", "w1", "-o", "json"), &lease)
	camel := regexp.MustCompile(`^[a-z][a-zA-Z0-9]*$`)
	for _, args := range structuredCommands() {
		fill := func(format string) []string {
			out := make([]string, len(args))
			for i, a := range args {
				a = strings.ReplaceAll(a, "{dir}", dir)
				a = strings.ReplaceAll(a, "{grant}", got.LastGrantID)
				out[i] = strings.ReplaceAll(a, "{lease}", lease.LastGrantID)
			}
			return append(out, "-o", format)
		}
		name := strings.Join(args[:min(2, len(args))], " ")
		if args[0] == "certs" {
			name = "certs create-ca"
		}
		t.Run(name, func(t *testing.T) {
			var js any
			decode(t, ok(t, addr, fill("json")...), &js)
			walkKeys(js, func(k string) {
				if !camel.MatchString(k) {
					t.Errorf("-o json key %q is not lowerCamelCase", k)
				}
			})
			if args[0] == "certs" {
				// create-ca refuses to overwrite; the YAML run gets a
				// directory of its own.
				dir2 := t.TempDir()
				args := fill("yaml")
				args[2] = dir2 + "/pki"
				y := ok(t, addr, args...)
				var ys any
				if err := yaml.Unmarshal([]byte(y), &ys); err != nil {
					t.Fatalf("-o yaml is not YAML: %v\n%s", err, y)
				}
				return
			}
			if len(args) > 1 && args[1] == "delete" { // put back what the JSON run deleted
				ok(t, addr, args[0], "apply", "-f", filepath.Join(dir, map[string]string{"rule": "extra.yaml", "envoy": "envoy.yaml"}[args[0]]))
			}
			y := ok(t, addr, fill("yaml")...)
			if strings.HasPrefix(strings.TrimSpace(y), "{") {
				t.Errorf("-o yaml printed JSON:\n%s", y)
			}
			var ys any
			if err := yaml.Unmarshal([]byte(y), &ys); err != nil {
				t.Fatalf("-o yaml is not YAML: %v\n%s", err, y)
			}
			if !reflect.DeepEqual(keySet(js), keySet(ys)) {
				t.Errorf("-o yaml keys %v, -o json keys %v", keySet(ys), keySet(js))
			}
		})
	}
}

// walkKeys calls f with every object key in v, at any depth.
func walkKeys(v any, f func(string)) {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			f(k)
			walkKeys(e, f)
		}
	case []any:
		for _, e := range v {
			walkKeys(e, f)
		}
	}
}

// keySet is the sorted top-level keys of an object, or nil.
func keySet(v any) []string {
	m, _ := v.(map[string]any)
	var keys []string
	walkKeys(m, func(k string) { keys = append(keys, k) })
	if keys == nil {
		return nil
	}
	return slices.Compact(slices.Sorted(slices.Values(keys)))
}

// TestOutputYAMLRoundTrip: `rule get -o yaml` and `rule list -o yaml` are
// read by internal/rulefile and accepted back by `rule apply -f`, which
// stores the same rules.
func TestOutputYAMLRoundTrip(t *testing.T) {
	addr := startServer(t)
	ok(t, addr, "rule", "put", "api", "--algorithm", "token-bucket", "--limit", "100", "--period", "1500ms", "--burst", "200",
		"--override", "vip=1000/2000", "--deny", "bad-ip", "--allow", "ops", "--penalty", "5m", "--max-keys", "50",
		"--fallback", "local", "--fallback-limit", "10", "--lease-max", "20", "--lease-ttl", "1s", "--shadow")
	ok(t, addr, "rule", "put", "search", "--algorithm", "sliding-window", "--limit", "10", "--period", "1s", "--sample-count", "5")
	ok(t, addr, "rule", "put", "warm", "--algorithm", "token-bucket", "--limit", "10", "--period", "1s", "--warmup", "30s")
	stored := func() []*pb.Rule {
		var list struct {
			Rules []json.RawMessage `json:"rules"`
		}
		decode(t, ok(t, addr, "rule", "list", "-o", "json"), &list)
		var rules []*pb.Rule
		for _, raw := range list.Rules {
			r := new(pb.Rule)
			if err := protojson.Unmarshal(raw, r); err != nil {
				t.Fatal(err)
			}
			r.Version, r.Generation = 0, 0
			rules = append(rules, r)
		}
		return rules
	}
	before := stored()

	one := ok(t, addr, "rule", "get", "api", "-o", "yaml")
	if _, err := rulefile.Parse("get.yaml", []byte(one)); err != nil {
		t.Fatalf("rulefile does not read rule get -o yaml: %v\n%s", err, one)
	}
	all := ok(t, addr, "rule", "list", "-o", "yaml")
	rs, err := rulefile.Parse("list.yaml", []byte(all))
	if err != nil || len(rs) != 3 {
		t.Fatalf("rulefile reads %d rules of rule list -o yaml: %v\n%s", len(rs), err, all)
	}
	for _, y := range []string{one, all} {
		if r := tokenctl(t, y, "--server", addr, "rule", "apply", "-f", "-"); r.err != nil {
			t.Fatalf("rule apply -f - of the YAML: %v\n%s", r.err, y)
		}
	}
	after := stored()
	if len(after) != len(before) {
		t.Fatalf("%d rules after applying their own YAML, want %d", len(after), len(before))
	}
	for i := range before {
		if !proto.Equal(before[i], after[i]) {
			t.Errorf("rule after applying its own YAML:\n%v\nwant\n%v", after[i], before[i])
		}
	}
}

// TestVersionFlag: --version prints what `tokenctl version` prints.
func TestVersionFlag(t *testing.T) {
	flag := tokenctl(t, "", "--version")
	cmd := tokenctl(t, "", "version")
	if flag.err != nil || cmd.err != nil || flag.stdout != cmd.stdout || !strings.HasPrefix(flag.stdout, "tokenctl ") {
		t.Errorf("--version %q (%v), version %q (%v): want the same line", flag.stdout, flag.err, cmd.stdout, cmd.err)
	}
}

// TestShellCompletion: cobra's completion scripts for bash, zsh and fish.
func TestShellCompletion(t *testing.T) {
	for shell, want := range map[string]string{"bash": "bash completion", "zsh": "zsh completion", "fish": "fish completion"} {
		r := tokenctl(t, "", "completion", shell)
		if r.err != nil || !strings.Contains(r.stdout, want) || !strings.Contains(r.stdout, "tokenctl") {
			t.Errorf("completion %s: %v, want a script with %q", shell, r.err, want)
		}
	}
	// The completion of subcommands works through cobra's __complete.
	r := tokenctl(t, "", "__complete", "ru")
	if r.err != nil || !strings.Contains(r.stdout, "rule") {
		t.Errorf("__complete ru: %v %q, want rule", r.err, r.stdout)
	}
}

// TestRefillZeroSaysWhy: a refill that gives nothing back, or less than
// asked, says what that can mean, in both formats.
func TestRefillZeroSaysWhy(t *testing.T) {
	addr := startServer(t)
	ok(t, addr, "rule", "put", "win", "--algorithm", "fixed-window", "--limit", "5", "--period", "1h")
	var got acquireJSON
	decode(t, ok(t, addr, "acquire", "win", "alice", "--permits", "3", "-o", "json"), &got)
	var res refillResult
	decode(t, ok(t, addr, "refill", "win", "alice", "--grant", got.LastGrantID, "--permits", "5", "-o", "json"), &res)
	if res.Refilled != 3 || !strings.Contains(res.Reason, "clamped from 5") {
		t.Errorf("refill of 5 from a grant of 3: %+v, want 3 and a clamped reason", res)
	}
	out := ok(t, addr, "refill", "win", "alice", "--grant", got.LastGrantID)
	if !strings.Contains(out, "why:") || !strings.Contains(out, "already refilled") || !strings.Contains(out, "unknown") {
		t.Errorf("second refill:\n%s\nwant a why line naming an already refilled or unknown grant", out)
	}
	decode(t, ok(t, addr, "refill", "win", "alice", "--grant", got.LastGrantID, "-o", "json"), &res)
	if res.Refilled != 0 || !strings.Contains(res.Reason, "already refilled") {
		t.Errorf("second refill -o json: %+v", res)
	}
}

func writeFileAt(t *testing.T, path, content string) {
	t.Helper()
	if err := writeFileAtomic(path, []byte(content)); err != nil {
		t.Fatal(err)
	}
}

// TestExampleGrantIDsWellFormed: every grant id in tokenctl's examples
// and help is a well-formed grant id (grant.IDLen characters), not a
// made-up shorter one.
func TestExampleGrantIDsWellFormed(t *testing.T) {
	root := newRootCmd(io.Discard, io.Discard)
	flag := regexp.MustCompile(`--grant ([A-Za-z0-9_-]+)`)
	seen := 0
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, m := range flag.FindAllStringSubmatch(c.Example+"\n"+c.Long, -1) {
			if m[1] == "ID" {
				continue
			}
			seen++
			if _, err := grant.Parse(m[1]); err != nil {
				t.Errorf("%s: example grant id %q: %v", c.CommandPath(), m[1], err)
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	if seen == 0 {
		t.Fatal("no example grant ids found; the test looks in the wrong place")
	}
}
