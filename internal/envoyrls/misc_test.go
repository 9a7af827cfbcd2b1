package envoyrls

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tokenserver/tokenserver/internal/bucket"
)

func TestWindows(t *testing.T) {
	const thu = 0                                               // 1970-01-01 was a Thursday
	mon := time.Date(2023, 11, 13, 0, 0, 0, 0, time.UTC).Unix() // a Monday
	cases := []struct {
		unit  Unit
		now   int64
		start int64
		reset time.Duration
	}{
		{UnitSecond, 1_700_000_000, 1_700_000_000, time.Second},
		{UnitMinute, 1_700_000_000, 1_699_999_980, 40 * time.Second},
		{UnitMinute, 1_699_999_980, 1_699_999_980, time.Minute}, // a window's first second: the whole unit
		{UnitHour, 1_700_000_000, 1_699_999_200, 2800 * time.Second},
		{UnitDay, 1_700_000_000, 1_699_920_000, 6400 * time.Second},
		{UnitWeek, thu + 3, thu, 7*24*time.Hour - 3*time.Second},
		{UnitWeek, mon, mon - 4*86400, 3 * 24 * time.Hour}, // weeks start on Thursdays
		{UnitMonth, 1_700_000_000, 1_700_000_000 / 2_592_000 * 2_592_000, time.Duration(2_592_000-1_700_000_000%2_592_000) * time.Second},
		{UnitYear, 1_700_000_000, 53 * 31_536_000, time.Duration(54*31_536_000-1_700_000_000) * time.Second},
	}
	for _, tc := range cases {
		if got := WindowStart(tc.unit, tc.now); got != tc.start {
			t.Errorf("%v start at %d: %d, want %d", tc.unit, tc.now, got, tc.start)
		}
		if got := DurationUntilReset(tc.unit, tc.now); got != tc.reset {
			t.Errorf("%v reset at %d: %v, want %v", tc.unit, tc.now, got, tc.reset)
		}
	}
	if UnitSeconds(UnitMonth) != 30*86400 || UnitSeconds(UnitYear) != 365*86400 || UnitSeconds(UnitWeek) != 7*86400 || UnitSeconds(UnitUnknown) != 0 || ValidUnit(Unit(99)) {
		t.Fatal("unit lengths differ from the reference")
	}
}

func TestJSONHandler(t *testing.T) {
	s, _ := newTestService(t, mustParse(t, readmeExample3), Options{})
	h := NewJSONHandler(s.ShouldRateLimit)
	do := func(body string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(body)))
		return rec.Code, strings.TrimSpace(rec.Body.String())
	}
	code, body := do(`{"domain":"edge_proxy_per_ip","descriptors":[{"entries":[{"key":"remote_address","value":"50.0.0.1"}]}]}`)
	if code != 200 || !strings.Contains(body, `"overallCode":"OK"`) || !strings.Contains(body, `"limitRemaining":9`) || !strings.Contains(body, `"unit":"SECOND"`) {
		t.Fatalf("%d %s", code, body)
	}
	code, body = do(`{"domain":"edge_proxy_per_ip","descriptors":[{"entries":[{"key":"remote_address","value":"50.0.0.5"}]}]}`)
	if code != 429 || !strings.Contains(body, `"overallCode":"OVER_LIMIT"`) {
		t.Fatalf("%d %s", code, body)
	}
	for _, bad := range []string{`{`, `{"domain":""}`, `{"nope":1}`} {
		if code, body := do(bad); code != 400 || body != "Bad Request" {
			t.Fatalf("%q: %d %s", bad, code, body)
		}
	}
	fail := NewJSONHandler(func(context.Context, *rlpb.RateLimitRequest) (*rlpb.RateLimitResponse, error) {
		return &rlpb.RateLimitResponse{}, nil
	})
	rec := httptest.NewRecorder()
	fail.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(`{"domain":"d"}`)))
	if rec.Code != 500 {
		t.Fatalf("UNKNOWN overall code: %d", rec.Code)
	}
	refused := NewJSONHandler(func(context.Context, *rlpb.RateLimitRequest) (*rlpb.RateLimitResponse, error) {
		return nil, fmt.Errorf("authorize: %w", &HTTPError{Code: http.StatusForbidden, Msg: "needs the client role"})
	})
	rec = httptest.NewRecorder()
	refused.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(`{"domain":"d"}`)))
	if rec.Code != http.StatusForbidden || strings.TrimSpace(rec.Body.String()) != "needs the client role" {
		t.Fatalf("an HTTPError: %d %q", rec.Code, rec.Body.String())
	}
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// A ConfigMap volume: files are links to ..data/NAME, ..data links to a
// timestamped directory, and an update swaps ..data.
func TestLoadDirConfigMap(t *testing.T) {
	dir := t.TempDir()
	v1 := filepath.Join(dir, "..2024_01_01_00_00_00.1")
	if err := os.Mkdir(v1, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(v1, "ip.yaml"), readmeExample3)
	writeFile(t, filepath.Join(v1, "msg.yml"), readmeExample2)
	for _, l := range [][2]string{{"..2024_01_01_00_00_00.1", "..data"}, {"..data/ip.yaml", "ip.yaml"}, {"..data/msg.yml", "msg.yml"}} {
		if err := os.Symlink(l[0], filepath.Join(dir, l[1])); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(dir, "ip.yaml~"), "garbage: [")
	writeFile(t, filepath.Join(dir, ".ip.yaml.swp"), "garbage: [")
	writeFile(t, filepath.Join(dir, "notes.txt"), "garbage: [")
	c, err := LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if c.Len() != 2 || c.Domain("messaging").Meta().Author != "file:msg.yml" || c.Domain("edge_proxy_per_ip").Meta().Source != "ip.yaml" {
		t.Fatalf("domains %v", c.Domains())
	}
	// The swap: a new version with a changed limit.
	v2 := filepath.Join(dir, "..2024_01_02_00_00_00.2")
	if err := os.Mkdir(v2, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(v2, "ip.yaml"), strings.Replace(readmeExample3, "requests_per_unit: 10", "requests_per_unit: 11", 1))
	writeFile(t, filepath.Join(v2, "msg.yml"), readmeExample2)
	if err := os.Symlink("..2024_01_02_00_00_00.2", filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	c, err = LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if l := c.Resolve("edge_proxy_per_ip", desc("remote_address", "1.2.3.4")); l == nil || l.RequestsPerUnit != 11 {
		t.Fatalf("after swap: %+v", l)
	}
}

func TestLoadDirRefusesWhole(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, filepath.Join(dir, "a.yaml"), readmeExample3)
	writeFile(t, filepath.Join(dir, "b.yaml"), "domain: b\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
	writeFile(t, filepath.Join(dir, "c.yaml"), "domain: c\ndescriptors:\n  - value: v\n")
	_, err := LoadDir(dir)
	var ce *ConfigError
	if err == nil || !errors.As(err, &ce) || !strings.Contains(err.Error(), "b.yaml: line 3: invalid rate limit unit 'fortnight'") || !strings.Contains(err.Error(), "c.yaml: line 3: descriptor has empty key") {
		t.Fatalf("got %v", err)
	}
	writeFile(t, filepath.Join(dir, "b.yaml"), readmeExample3)
	writeFile(t, filepath.Join(dir, "c.yaml"), readmeExample2)
	if _, err := LoadDir(dir); err == nil || !strings.Contains(err.Error(), "duplicate domain 'edge_proxy_per_ip'") {
		t.Fatalf("duplicate across files: %v", err)
	}
	if _, err := LoadDir(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("missing dir loaded")
	}
}

func FuzzParseDomain(f *testing.F) {
	entries, err := os.ReadDir("testdata")
	if err != nil {
		f.Fatal(err)
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("testdata", e.Name()))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(readmeExample2))
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := ParseDomain("fuzz.yaml", data, Meta{})
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz.yaml: ") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		c, err := NewConfig(d)
		if err != nil {
			t.Fatal(err)
		}
		b, err := c.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		back, err := UnmarshalConfig(b)
		if err != nil {
			t.Fatalf("accepted config does not round trip: %v", err)
		}
		if back.Domain(d.Name()) == nil {
			t.Fatal("domain lost in round trip")
		}
		back.Resolve(d.Name(), desc("a", "b", "c", "d"))
	})
}

func TestExampleConfigParses(t *testing.T) {
	b, err := os.ReadFile("../../examples/envoy/ratelimit-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c := mustParse(t, string(b))
	l := c.Resolve("edge", desc("tenant", "t1"))
	if l == nil || l.Burst != 300 {
		t.Fatalf("tenant: %+v", l)
	}
	if bc := l.BucketConfig(); bc.Validate() != nil {
		t.Fatalf("tenant bucket: %v", bc.Validate())
	}
}

// TestCounterKeys: Resolve's keys are the ones a Limit built by hand
// computes (unitName spells units as their String), and HashKeyOf gives
// the HashKey back from a CounterKey.
func TestCounterKeys(t *testing.T) {
	for u := UnitUnknown; u <= UnitWeek; u++ {
		if unitName(u) != u.String() {
			t.Errorf("unitName(%d) = %q, want %q", u, unitName(u), u.String())
		}
	}
	for _, alg := range []bucket.Algorithm{bucket.FixedWindow, bucket.TokenBucket, bucket.SlidingLog} {
		for _, u := range []Unit{UnitSecond, UnitMonth, UnitWeek} {
			l := &Limit{Domain: "d", Unit: u, Algorithm: alg}
			entries := []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v_SECOND"}, {Key: "x"}}
			l.setKeys("d", entries, nil)
			byHand := &Limit{Key: l.Key, Unit: u, Algorithm: alg}
			if l.Key != "d_k_v_SECOND_x__" || l.CounterKey() != byHand.CounterKey() {
				t.Errorf("%v %v: key %q counter %q, want d_k_v_SECOND_x__ and %q", alg, u, l.Key, l.CounterKey(), byHand.CounterKey())
			}
			if h, ok := HashKeyOf(l.CounterKey(), u, alg); !ok || h != l.HashKey() {
				t.Errorf("%v %v: HashKeyOf(%q) = %q, %v; want %q", alg, u, l.CounterKey(), h, ok, l.HashKey())
			}
		}
	}
	if _, ok := HashKeyOf("d_k_v_SECOND", UnitMinute, bucket.FixedWindow); ok {
		t.Error("HashKeyOf took a key of another unit")
	}
}
