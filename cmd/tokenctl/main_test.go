package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tokenserver/tokenserver/internal/raftfsm"
	"github.com/tokenserver/tokenserver/internal/server"
)

// startServer runs a real single-node tokenserver (in-memory rules, no
// Raft) on 127.0.0.1:0 until the test ends and returns its gRPC address.
func startServer(t *testing.T) string {
	t.Helper()
	cfg := server.DefaultConfig()
	cfg.GRPCAddr = "127.0.0.1:0"
	cfg.HTTPAddr = ""
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	store, err := raftfsm.NewInmem("node-1", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	n, err := server.New(cfg, server.NewStandalone("node-1", cfg.GRPCAddr, store).Deps())
	if err != nil {
		t.Fatal(err)
	}
	lis, err := server.Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return lis.GRPC.Addr().String()
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// result is one run of tokenctl.
type result struct {
	stdout, stderr string
	err            error
}

// tokenctl runs the command tree in-process with args and stdin.
func tokenctl(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	return tokenctlCtx(context.Background(), t, stdin, args...)
}

func tokenctlCtx(ctx context.Context, t *testing.T, stdin string, args ...string) result {
	t.Helper()
	var out, errb syncBuffer
	root := newRootCmd(&out, &errb)
	root.SetArgs(args)
	root.SetIn(strings.NewReader(stdin))
	err := root.ExecuteContext(ctx)
	r := result{stdout: out.String(), stderr: errb.String(), err: err}
	t.Logf("tokenctl %s\n--- stdout:\n%s--- stderr:\n%s--- err: %v", strings.Join(args, " "), r.stdout, r.stderr, err)
	return r
}

// ok runs tokenctl and fails the test on an error.
func ok(t *testing.T, addr string, args ...string) string {
	t.Helper()
	r := tokenctl(t, "", append([]string{"--server", addr}, args...)...)
	if r.err != nil {
		t.Fatalf("tokenctl %s: %v", strings.Join(args, " "), r.err)
	}
	return r.stdout
}

// decode unmarshals JSON output into v, failing the test on an error.
func decode(t *testing.T, s string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(s), v); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, s)
	}
}

func TestRuleRoundTrip(t *testing.T) {
	t.Parallel()
	addr := startServer(t)

	out := ok(t, addr, "rule", "put", "api", "--algorithm", "token-bucket", "--limit", "100", "--period", "1s",
		"--burst", "200", "--penalty", "5s", "--override", "vip=1000/2000", "--override", "a=b=5",
		"--deny", "bad", "--allow", "good", "--shadow", "--fallback", "local", "--fallback-limit", "10",
		"--lease-max", "20", "--lease-ttl", "100ms")
	for _, want := range []string{"name:", "api", "token-bucket", "200", "vip=1000/2000", "a=b=5", "bad", "good", "local (limit 10)", "version:"} {
		if !strings.Contains(out, want) {
			t.Errorf("rule put output lacks %q:\n%s", want, out)
		}
	}
	ok(t, addr, "rule", "put", "login", "--algorithm", "sliding-window", "--limit", "5", "--period", "1m", "--sample-count", "6")

	var got map[string]any
	decode(t, ok(t, addr, "rule", "get", "api", "-o", "json"), &got)
	for k, want := range map[string]any{"name": "api", "algorithm": "TOKEN_BUCKET", "limit": "100", "burst": "200", "period": "1s", "shadow": true} {
		if got[k] != want {
			t.Errorf("rule get -o json: %s = %v, want %v", k, got[k], want)
		}
	}
	version := got["version"].(string)

	var list struct {
		Rules []map[string]any `json:"rules"`
	}
	decode(t, ok(t, addr, "rule", "list", "-o", "json"), &list)
	if len(list.Rules) != 2 || list.Rules[0]["name"] != "api" || list.Rules[1]["name"] != "login" || list.Rules[1]["sampleCount"] != 6.0 {
		t.Errorf("rule list -o json = %v, want api and login (sampleCount 6)", list.Rules)
	}
	table := ok(t, addr, "rule", "list", "--local")
	if !strings.Contains(table, "NAME") || !strings.Contains(table, "sliding-window") {
		t.Errorf("rule list table:\n%s", table)
	}

	// Compare-and-set: a stale version is refused.
	r := tokenctl(t, "", "--server", addr, "rule", "delete", "api", "--expected-version", "999")
	if status.Code(r.err) != codes.FailedPrecondition {
		t.Errorf("delete with a stale version: %v, want FailedPrecondition", r.err)
	}
	ok(t, addr, "rule", "delete", "api", "--expected-version", version)
	r = tokenctl(t, "", "--server", addr, "rule", "get", "api")
	if status.Code(r.err) != codes.NotFound {
		t.Errorf("get after delete: %v, want NotFound", r.err)
	}
	decode(t, ok(t, addr, "rule", "list", "-o", "json"), &list)
	if len(list.Rules) != 1 {
		t.Errorf("after delete, %d rules, want 1", len(list.Rules))
	}
}

func TestRulePutErrors(t *testing.T) {
	t.Parallel()
	addr := startServer(t)
	base := []string{"--server", addr, "rule", "put", "r", "--algorithm", "token-bucket", "--limit", "3", "--period", "1s"}
	for _, tc := range []struct {
		name  string
		args  []string
		usage bool       // a usage error (exit 2)
		code  codes.Code // else the gRPC code
		want  string     // in the message
	}{
		{"override without =", []string{"--override", "vip"}, true, 0, "--override"},
		{"override bad limit", []string{"--override", "vip=x"}, true, 0, "--override"},
		{"override zero limit", []string{"--override", "vip=0"}, true, 0, "--override"},
		{"override bad burst", []string{"--override", "vip=5/"}, true, 0, "--override"},
		{"override empty key", []string{"--override", "=5"}, true, 0, "--override"},
		{"bad algorithm", []string{"--algorithm", "tokenbucket"}, true, 0, "--algorithm"},
		{"bad fallback", []string{"--fallback", "maybe"}, true, 0, "--fallback"},
		{"bad limit syntax", []string{"--limit", "x"}, true, 0, "--limit"},
		{"bad duration", []string{"--period", "1x"}, true, 0, "--period"},
		{"unknown flag", []string{"--limt", "3"}, true, 0, "--limt"},
		{"limit zero", []string{"--limit", "0"}, false, codes.InvalidArgument, "limit"},
		{"sample count", []string{"--algorithm", "sliding-window", "--sample-count", "7"}, false, codes.InvalidArgument, "sample_count"},
		{"stale version", []string{"--expected-version", "5"}, false, codes.FailedPrecondition, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tokenctl(t, "", append(base, tc.args...)...)
			if r.err == nil {
				t.Fatal("no error")
			}
			var ue *usageError
			if got := errors.As(r.err, &ue); got != tc.usage {
				t.Errorf("usage error = %v, want %v (%v)", got, tc.usage, r.err)
			}
			if !tc.usage && status.Code(r.err) != tc.code {
				t.Errorf("code %v, want %v (%v)", status.Code(r.err), tc.code, r.err)
			}
			if !strings.Contains(r.err.Error(), tc.want) {
				t.Errorf("error %q does not name %q", r.err, tc.want)
			}
		})
	}
	t.Run("missing flags", func(t *testing.T) {
		r := tokenctl(t, "", "--server", addr, "rule", "put", "r", "--algorithm", "token-bucket", "--limit", "3")
		if !errors.As(r.err, new(*usageError)) || !strings.Contains(r.err.Error(), "--period") {
			t.Errorf("error %v, want a usage error naming --period", r.err)
		}
	})
}

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

func TestApply(t *testing.T) {
	t.Parallel()
	addr := startServer(t)
	out := ok(t, addr, "rule", "apply", "-f", writeFile(t, multiDoc))
	for _, name := range []string{"one", "two", "three", "four"} {
		if !strings.Contains(out, name) {
			t.Errorf("apply output lacks %s:\n%s", name, out)
		}
	}
	var list struct {
		Rules []map[string]any `json:"rules"`
	}
	decode(t, ok(t, addr, "rule", "list", "-o", "json"), &list)
	got := map[string]map[string]any{}
	for _, r := range list.Rules {
		got[r["name"].(string)] = r
	}
	if len(got) != 4 || got["two"]["sampleCount"] != 5.0 || got["four"]["period"] != "90s" || got["one"]["burst"] != "20" {
		t.Errorf("rules after apply: %v", list.Rules)
	}

	// Applying the output of rule list -o json from stdin works too.
	listed := ok(t, addr, "rule", "list", "-o", "json")
	r := tokenctl(t, listed, "--server", addr, "rule", "apply", "-f", "-", "-o", "json")
	if r.err != nil {
		t.Fatal(r.err)
	}
	decode(t, r.stdout, &list)
	if len(list.Rules) != 4 {
		t.Errorf("apply -o json printed %d rules, want 4", len(list.Rules))
	}
}

func TestApplyErrors(t *testing.T) {
	t.Parallel()
	addr := startServer(t)
	for _, tc := range []struct {
		name, yaml string
		want       []string // all in the error
	}{
		{"malformed", "name: a\nalgorithm: TOKEN_BUCKET\nlimit: 1\nperiod: 1s\n---\nname: b\nlimit: 5\n  period: 1s\n",
			[]string{"<stdin>: ", "line 8"}},
		{"unclosed flow", "name: [\n", []string{"<stdin>: ", "line 1"}},
		{"unknown field", "- name: a\n  algorithm: TOKEN_BUCKET\n  limit: 1\n  period: 1s\n- name: b\n  algorithm: TOKEN_BUCKET\n  limit: 1\n  sampleCont: 3\n  period: 1s\n",
			[]string{"<stdin>:8:3: ", `unknown field "sampleCont"`, `rule "b"`}},
		{"bad enum", "name: a\nalgorithm: TOKEN_BUCKT\nlimit: 1\nperiod: 1s\n", []string{"<stdin>:2:12: ", "TOKEN_BUCKT"}},
		{"bad duration", "name: a\nalgorithm: TOKEN_BUCKET\nlimit: 1\nperiod: soon\n", []string{"<stdin>:4:9: ", "soon"}},
		{"invalid rule", "name: a\nalgorithm: TOKEN_BUCKET\nlimit: 1\nperiod: 1s\n---\nname: b\nalgorithm: SLIDING_WINDOW\nlimit: 1\nperiod: 1s\nsampleCount: 3\n",
			[]string{"<stdin>:10:1: ", "sample_count"}},
		{"duplicate key", "name: a\nname: b\n", []string{"<stdin>:2:1: ", "name"}},
		{"duplicate rule", "name: a\nalgorithm: TOKEN_BUCKET\nlimit: 1\nperiod: 1s\n---\nname: a\nalgorithm: TOKEN_BUCKET\nlimit: 2\nperiod: 1s\n",
			[]string{"<stdin>:6:1: ", `rule "a" appears again`, "first at <stdin>:1:1"}},
		{"beside rules", "rules: []\nextra: 1\n", []string{"<stdin>:2:1: ", "extra"}},
		{"scalar", "just text\n", []string{"<stdin>:1:1: ", "want a rule"}},
		{"empty", "---\n# nothing\n---\n", []string{"no rules"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tokenctl(t, tc.yaml, "--server", addr, "rule", "apply", "-f", "-")
			if r.err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(r.err.Error(), w) {
					t.Errorf("error %q lacks %q", r.err, w)
				}
			}
		})
	}
	// Nothing was sent: every file above had an error somewhere.
	var list struct {
		Rules []map[string]any `json:"rules"`
	}
	decode(t, ok(t, addr, "rule", "list", "-o", "json"), &list)
	if len(list.Rules) != 0 {
		t.Errorf("rules stored despite errors: %v", list.Rules)
	}
	r := tokenctl(t, "", "--server", addr, "rule", "apply")
	if !errors.As(r.err, new(*usageError)) {
		t.Errorf("apply without -f: %v, want a usage error", r.err)
	}
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	f := t.TempDir() + "/rules.yaml"
	if err := os.WriteFile(f, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// acquireJSON is the JSON acquire prints.
type acquireJSON struct {
	Allowed     int64  `json:"allowed"`
	Denied      int64  `json:"denied"`
	Granted     int64  `json:"granted"`
	Remaining   int64  `json:"remaining"`
	RetryAfter  string `json:"retryAfter"`
	LastGrantID string `json:"lastGrantId"`
	RuleVersion uint64 `json:"ruleVersion"`
}

func TestAcquire(t *testing.T) {
	t.Parallel()
	addr := startServer(t)
	ok(t, addr, "rule", "put", "three", "--algorithm", "token-bucket", "--limit", "3", "--period", "1h")

	out := ok(t, addr, "acquire", "three", "alice", "--count", "5")
	for _, want := range []string{"allowed:", " 3\n", "denied:", " 2\n", "last grant id:"} {
		if !strings.Contains(out, want) {
			t.Errorf("acquire output lacks %q:\n%s", want, out)
		}
	}
	var got acquireJSON
	decode(t, ok(t, addr, "acquire", "three", "bob", "--count", "5", "-o", "json"), &got)
	if got.Allowed != 3 || got.Denied != 2 || got.Granted != 3 || got.Remaining != 0 || got.LastGrantID == "" || got.RuleVersion == 0 {
		t.Errorf("acquire -o json = %+v, want allowed 3, denied 2, granted 3", got)
	}
	if d, err := time.ParseDuration(got.RetryAfter); err != nil || d <= 0 {
		t.Errorf("retry_after %q, want a positive duration", got.RetryAfter)
	}
	var peek acquireJSON
	decode(t, ok(t, addr, "acquire", "three", "carol", "--permits", "0", "-o", "json"), &peek)
	if peek.Allowed != 1 || peek.Granted != 0 || peek.Remaining != 3 {
		t.Errorf("peek = %+v, want allowed, nothing granted, 3 remaining", peek)
	}
	var dur acquireJSON
	decode(t, ok(t, addr, "acquire", "three", "dave", "--duration", "100ms", "-o", "json"), &dur)
	if dur.Allowed != 3 || dur.Denied < 1 {
		t.Errorf("acquire --duration = %+v, want 3 allowed and some denied", dur)
	}

	for _, tc := range []struct {
		name string
		args []string
		code codes.Code // 0: a usage error
	}{
		{"unknown rule", []string{"acquire", "nope", "alice"}, codes.NotFound},
		{"above capacity", []string{"acquire", "three", "alice", "--permits", "4"}, codes.InvalidArgument},
		{"negative permits", []string{"acquire", "three", "alice", "--permits", "-1"}, codes.InvalidArgument},
		{"key too long", []string{"acquire", "three", strings.Repeat("k", 300)}, codes.InvalidArgument},
		{"count and duration", []string{"acquire", "three", "alice", "--count", "2", "--duration", "1s"}, 0},
		{"zero count", []string{"acquire", "three", "alice", "--count", "0"}, 0},
		{"missing key", []string{"acquire", "three"}, 0},
		{"empty key", []string{"acquire", "three", ""}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tokenctl(t, "", append([]string{"--server", addr}, tc.args...)...)
			if tc.code == 0 {
				if !errors.As(r.err, new(*usageError)) {
					t.Errorf("%v, want a usage error", r.err)
				}
				return
			}
			if status.Code(r.err) != tc.code {
				t.Errorf("%v, want %v", r.err, tc.code)
			}
		})
	}
}

func TestRefill(t *testing.T) {
	t.Parallel()
	addr := startServer(t)
	// A fixed window counts whole permits, so the refill is exact.
	ok(t, addr, "rule", "put", "win", "--algorithm", "fixed-window", "--limit", "5", "--period", "1h")
	var got acquireJSON
	decode(t, ok(t, addr, "acquire", "win", "alice", "--permits", "3", "-o", "json"), &got)
	if got.Remaining != 2 || got.LastGrantID == "" {
		t.Fatalf("acquire = %+v", got)
	}
	var refill struct {
		Refilled  int64 `json:"refilled"`
		Remaining int64 `json:"remaining"`
	}
	decode(t, ok(t, addr, "refill", "win", "alice", "--grant", got.LastGrantID, "--permits", "2", "-o", "json"), &refill)
	if refill.Refilled != 2 || refill.Remaining != 4 {
		t.Errorf("refill = %+v, want 2 refilled, 4 remaining", refill)
	}
	out := ok(t, addr, "refill", "win", "alice", "--grant", got.LastGrantID)
	if !strings.Contains(out, "refilled:") || !strings.Contains(out, " 0\n") {
		t.Errorf("a second refill of the grant should give back nothing:\n%s", out)
	}
	r := tokenctl(t, "", "--server", addr, "refill", "win", "alice")
	if !errors.As(r.err, new(*usageError)) || !strings.Contains(r.err.Error(), "--grant") {
		t.Errorf("refill without --grant: %v", r.err)
	}
	r = tokenctl(t, "", "--server", addr, "refill", "win", "alice", "--grant", "garbage")
	if status.Code(r.err) != codes.InvalidArgument {
		t.Errorf("refill with a bad grant: %v, want InvalidArgument", r.err)
	}
}

func TestLeaseRenew(t *testing.T) {
	t.Parallel()
	addr := startServer(t)
	ok(t, addr, "rule", "put", "jobs", "--algorithm", "concurrency", "--limit", "2", "--period", "1m")
	var got acquireJSON
	decode(t, ok(t, addr, "acquire", "jobs", "w1", "-o", "json"), &got)
	var renew struct {
		Renewed bool `json:"renewed"`
	}
	decode(t, ok(t, addr, "lease", "renew", "jobs", "w1", "--grant", got.LastGrantID, "-o", "json"), &renew)
	if !renew.Renewed {
		t.Error("lease not renewed")
	}
}

func TestUnreachableTimeout(t *testing.T) {
	t.Parallel()
	start := time.Now()
	// Port 1 on loopback: nothing listens, the connection is refused.
	r := tokenctl(t, "", "--server", "127.0.0.1:1", "--timeout", "600ms", "rule", "list")
	elapsed := time.Since(start)
	if status.Code(r.err) != codes.Unavailable {
		t.Errorf("error %v, want Unavailable", r.err)
	}
	if elapsed < 400*time.Millisecond || elapsed > 3*time.Second {
		t.Errorf("gave up after %v, want about the 600ms timeout", elapsed)
	}
	if !strings.Contains(r.err.Error(), "127.0.0.1:1") || !strings.Contains(r.stderr, "retrying") {
		t.Errorf("error %q / stderr %q should name the server and show retries", r.err, r.stderr)
	}
}

func TestExitCodes(t *testing.T) {
	t.Parallel()
	addr := startServer(t)
	for _, tc := range []struct {
		args []string
		code int
		want string // in stderr
	}{
		{[]string{"rule", "list"}, 0, ""},
		{[]string{"rule", "get", "nope"}, 1, "tokenctl: get rule \"nope\": NotFound"},
		{[]string{"rule", "put", "x", "--algorithm", "token-bucket", "--limit", "1", "--period", "1s", "--override", "k"}, 2, "tokenctl: --override"},
		{[]string{"-o", "xml", "rule", "list"}, 2, "-o/--output"},
		{[]string{"rule", "bogus"}, 2, "unknown command"},
		{[]string{"rul"}, 2, "did you mean rule"},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), append([]string{"--server", addr}, tc.args...), &out, &errb)
		if code != tc.code || !strings.Contains(errb.String(), tc.want) {
			t.Errorf("tokenctl %v: exit %d, stderr %q; want exit %d and %q", tc.args, code, errb.String(), tc.code, tc.want)
		}
	}
}

// benchJSON is the JSON line bench prints.
type benchJSON struct {
	Mode            string  `json:"mode"`
	DecisionsPerSec float64 `json:"decisionsPerSec"`
	RPCsPerSec      float64 `json:"rpcsPerSec"`
	P50Ms           float64 `json:"p50Ms"`
	P90Ms           float64 `json:"p90Ms"`
	P99Ms           float64 `json:"p99Ms"`
	P999Ms          float64 `json:"p999Ms"`
	Allowed         int64   `json:"allowed"`
	Denied          int64   `json:"denied"`
	Errors          int64   `json:"errors"`
}

func TestBench(t *testing.T) {
	t.Parallel()
	addr := startServer(t)
	ok(t, addr, "rule", "put", "bench", "--algorithm", "token-bucket", "--limit", "50", "--period", "1s")
	for _, mode := range []string{"unary", "batch"} {
		t.Run(mode, func(t *testing.T) {
			// 1.5s, so that the progress line of second 1 comes before the end.
			r := tokenctl(t, "", "--server", addr, "bench", "--rule", "bench", "--mode", mode, "--duration", "1500ms",
				"--concurrency", "8", "--conns", "2", "--keys", "100", "--batch", "50", "-o", "json")
			if r.err != nil {
				t.Fatal(r.err)
			}
			if lines := strings.Count(r.stdout, "\n"); lines != 1 {
				t.Errorf("bench printed %d lines, want one JSON line", lines)
			}
			var got benchJSON
			decode(t, r.stdout, &got)
			if got.Mode != mode || got.DecisionsPerSec <= 0 || got.RPCsPerSec <= 0 || got.Errors != 0 || got.Allowed == 0 {
				t.Errorf("bench = %+v", got)
			}
			if mode == "batch" && got.DecisionsPerSec < 10*got.RPCsPerSec {
				t.Errorf("batch of 50: %v decisions/s for %v RPC/s", got.DecisionsPerSec, got.RPCsPerSec)
			}
			if !(0 < got.P50Ms && got.P50Ms <= got.P90Ms && got.P90Ms <= got.P99Ms && got.P99Ms <= got.P999Ms) {
				t.Errorf("latencies not ordered: %+v", got)
			}
			if !strings.Contains(r.stderr, "rpc/s") {
				t.Errorf("no progress line on stderr:\n%s", r.stderr)
			}
		})
	}
	t.Run("table", func(t *testing.T) {
		out := ok(t, addr, "bench", "--rule", "bench", "--duration", "200ms", "--concurrency", "2")
		for _, want := range []string{"rpc/s:", "decisions/s:", "allowed:", "p99"} {
			if !strings.Contains(out, want) {
				t.Errorf("bench table lacks %q:\n%s", want, out)
			}
		}
	})
	t.Run("unknown rule", func(t *testing.T) {
		start := time.Now()
		r := tokenctl(t, "", "--server", addr, "bench", "--rule", "nope", "--duration", "5s")
		if status.Code(r.err) != codes.NotFound || time.Since(start) > 2*time.Second {
			t.Errorf("bench on an unknown rule: %v after %v, want NotFound at once", r.err, time.Since(start))
		}
	})
	t.Run("flags", func(t *testing.T) {
		for _, args := range [][]string{{"--mode", "unary"}, {"--mode", "fast", "--rule", "bench"}, {"--rule", "bench", "--batch", "1001", "--mode", "batch"}, {"--rule", "bench", "--concurrency", "0"}} {
			r := tokenctl(t, "", append([]string{"--server", addr, "bench"}, args...)...)
			if !errors.As(r.err, new(*usageError)) {
				t.Errorf("bench %v: %v, want a usage error", args, r.err)
			}
		}
	})
}

func TestBenchBare(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	var out, errb syncBuffer
	root := newRootCmd(&out, &errb)
	root.SetArgs([]string{"bench-server", "--addr", "127.0.0.1:0"})
	served := make(chan error, 1)
	go func() { served <- root.ExecuteContext(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("bench-server: %v", err)
		}
	})
	var addr string
	for deadline := time.Now().Add(5 * time.Second); addr == "" && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		addr = strings.TrimSpace(out.String())
	}
	if addr == "" {
		t.Fatalf("bench-server printed no address; stderr:\n%s", errb.String())
	}
	r := tokenctl(t, "", "--server", addr, "bench", "--mode", "bare", "--duration", "1s", "--concurrency", "8", "-o", "json")
	if r.err != nil {
		t.Fatal(r.err)
	}
	var got benchJSON
	decode(t, r.stdout, &got)
	if got.Mode != "bare" || got.RPCsPerSec <= 0 || got.DecisionsPerSec != got.RPCsPerSec || got.Errors != 0 {
		t.Errorf("bare bench = %+v", got)
	}
}

// TestNodeStatus: `node status` answers from the node alone, in both
// formats, every JSON field present.
func TestNodeStatus(t *testing.T) {
	addr := startServer(t)
	out := ok(t, addr, "node", "status")
	for _, want := range []string{"id:", "node-1", "ready:", "true", "insecure:", "version:"} {
		if !strings.Contains(out, want) {
			t.Fatalf("node status lacks %q:\n%s", want, out)
		}
	}
	var v map[string]any
	decode(t, ok(t, addr, "node", "status", "-o", "json"), &v)
	for _, k := range []string{"id", "role", "term", "commitIndex", "appliedIndex", "lastIndex", "leader", "epoch", "ready", "draining", "insecure", "rules", "rulesDigest", "version"} {
		if _, ok := v[k]; !ok {
			t.Errorf("node status -o json lacks %q: %v", k, v)
		}
	}
	if v["id"] != "node-1" || v["ready"] != true {
		t.Errorf("node status -o json: %v", v)
	}
}
