package envoyrls

import (
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) Now() time.Time { return c.t }

func newTestService(t *testing.T, c *Config, o Options) (*Service, *fakeClock) {
	t.Helper()
	clk := &fakeClock{t: time.Unix(1_700_000_000, 0)} // a Tuesday, 22:13:20 UTC
	o.Now = clk.Now
	return NewService(func() *Config { return c }, NewMemDecider(), o), clk
}

func call(t *testing.T, s *Service, domain string, ds ...*ratelimitv3.RateLimitDescriptor) *rlpb.RateLimitResponse {
	t.Helper()
	r, err := s.ShouldRateLimit(context.Background(), &rlpb.RateLimitRequest{Domain: domain, Descriptors: ds})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func codes(r *rlpb.RateLimitResponse) string {
	var b strings.Builder
	b.WriteString(r.GetOverallCode().String())
	for _, s := range r.GetStatuses() {
		b.WriteString(" " + s.GetCode().String())
	}
	return b.String()
}

const readmeExample2 = `domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
`

// README example 2: both descriptors counted, a logical OR, request order.
func TestAnswerExample2(t *testing.T) {
	s, _ := newTestService(t, mustParse(t, readmeExample2), Options{})
	mk := desc("message_type", "marketing", "to_number", "2061111111")
	num := desc("to_number", "2061111111")
	for i := 1; i <= 5; i++ {
		r := call(t, s, "messaging", mk, num)
		if codes(r) != "OK OK OK" || r.Statuses[0].LimitRemaining != uint32(5-i) || r.Statuses[1].LimitRemaining != uint32(100-i) {
			t.Fatalf("call %d: %v", i, r)
		}
	}
	r := call(t, s, "messaging", mk, num)
	if codes(r) != "OVER_LIMIT OVER_LIMIT OK" || r.Statuses[1].LimitRemaining != 94 {
		t.Fatalf("6th: %v", r)
	}
	// Another number has its own counters (a key without value counts each value).
	if r := call(t, s, "messaging", desc("message_type", "marketing", "to_number", "2062222222")); codes(r) != "OK OK" {
		t.Fatalf("other number: %v", r)
	}
	st := r.Statuses[0]
	if st.CurrentLimit.GetRequestsPerUnit() != 5 || st.CurrentLimit.GetUnit() != UnitDay || st.DurationUntilReset.AsDuration() != DurationUntilReset(UnitDay, 1_700_000_000) {
		t.Fatalf("status %v", st)
	}
}

// README example 3: a 0 limit is always over.
func TestAnswerBlacklist(t *testing.T) {
	s, _ := newTestService(t, mustParse(t, readmeExample3), Options{})
	if r := call(t, s, "edge_proxy_per_ip", desc("remote_address", "50.0.0.5")); codes(r) != "OVER_LIMIT OVER_LIMIT" {
		t.Fatalf("%v", r)
	}
}

// README examples 5 (unlimited), 6 (shadow), 7 (replaces), an unknown domain
// and an override of 0.
func TestAnswerSemantics(t *testing.T) {
	c := mustParse(t, `domain: internal
descriptors:
  - key: ldap
    rate_limit:
      unlimited: true
  - key: azure
    rate_limit:
      unit: minute
      requests_per_unit: 1
`, `domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit: {requests_per_unit: 1, unit: second}
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit: {requests_per_unit: 1, unit: second}
`, `domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          name: specific_limit
          requests_per_unit: 1
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bkthomps
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 2
          unit: second
`)
	s, clk := newTestService(t, c, Options{})
	r := call(t, s, "internal", desc("ldap", "x"), desc("azure", "y"))
	if codes(r) != "OK OK OK" || r.Statuses[0].LimitRemaining != math.MaxUint32 || r.Statuses[0].CurrentLimit != nil {
		t.Fatalf("unlimited: %v", r)
	}
	if r := call(t, s, "internal", desc("ldap", "x"), desc("azure", "y")); codes(r) != "OVER_LIMIT OK OVER_LIMIT" {
		t.Fatalf("azure over: %v", r)
	}
	call(t, s, "example6", desc("service", "auth", "user", "user-a"))
	if r := call(t, s, "example6", desc("service", "auth", "user", "user-a"), desc("service", "auth", "user", "user-b")); codes(r) != "OK OK OK" || r.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("shadow: %v", r)
	}
	// replaces: with both, only the replacing limit counts; specific_limit is untouched.
	both := []*ratelimitv3.RateLimitDescriptor{desc("key_1", "value_1", "user", "bkthomps"), desc("key_2", "value_2", "user", "bkthomps")}
	for i := 0; i < 2; i++ {
		if r := call(t, s, "example7", both...); codes(r) != "OK OK OK" || r.Statuses[0].CurrentLimit != nil {
			t.Fatalf("replaces %d: %v", i, r)
		}
	}
	if r := call(t, s, "example7", both...); codes(r) != "OVER_LIMIT OK OVER_LIMIT" {
		t.Fatalf("replacing limit over: %v", r)
	}
	if r := call(t, s, "example7", both[0]); codes(r) != "OK OK" || r.Statuses[0].LimitRemaining != 0 {
		t.Fatalf("replaced limit was counted: %v", r)
	}
	// Unknown domain: OK, no limit.
	if r := call(t, s, "nope", desc("a", "b")); codes(r) != "OK OK" || r.Statuses[0].CurrentLimit != nil {
		t.Fatalf("unknown domain: %v", r)
	}
	// An override of 0 is over; the next second, a new window.
	zero := desc("azure", "z")
	zero.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 0, Unit: typev3.RateLimitUnit_SECOND}
	if r := call(t, s, "internal", zero); codes(r) != "OVER_LIMIT OVER_LIMIT" {
		t.Fatalf("override 0: %v", r)
	}
	clk.t = clk.t.Add(time.Minute)
	if r := call(t, s, "internal", desc("azure", "y")); codes(r) != "OK OK" {
		t.Fatalf("next window: %v", r)
	}
}

func TestHitsAddend(t *testing.T) {
	s, _ := newTestService(t, mustParse(t, readmeExample2), Options{})
	num := func(h *uint64) *ratelimitv3.RateLimitDescriptor {
		d := desc("to_number", "1")
		if h != nil {
			d.HitsAddend = wrapperspb.UInt64(*h)
		}
		return d
	}
	u := func(v uint64) *uint64 { return &v }
	steps := []struct {
		reqHits uint32
		d       *uint64
		remain  uint32
		code    string
	}{
		{0, nil, 99, "OK"},   // 0 or unset counts 1
		{10, nil, 89, "OK"},  // the request's hits_addend
		{10, u(0), 89, "OK"}, // descriptor 0: check only
		{1, u(89), 0, "OK"},  // exactly the limit
		{0, u(0), 0, "OK"},   // checking at the limit is not over
		{0, u(1), 0, "OVER_LIMIT"},
	}
	for i, st := range steps {
		r, err := s.ShouldRateLimit(context.Background(), &rlpb.RateLimitRequest{Domain: "messaging", HitsAddend: st.reqHits, Descriptors: []*ratelimitv3.RateLimitDescriptor{num(st.d)}})
		if err != nil {
			t.Fatal(err)
		}
		if r.OverallCode.String() != st.code || r.Statuses[0].LimitRemaining != st.remain {
			t.Fatalf("step %d: %v", i, r)
		}
	}
}

func TestValidation(t *testing.T) {
	s, _ := newTestService(t, mustParse(t, readmeExample2), Options{})
	many := make([]*ratelimitv3.RateLimitDescriptor, MaxDescriptors+1)
	for i := range many {
		many[i] = desc("to_number", "1")
	}
	long := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i <= MaxEntries; i++ {
		long.Entries = append(long.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: "k"})
	}
	unknownUnit := desc("to_number", "1")
	unknownUnit.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 3}
	huge := desc("to_number", "1")
	huge.HitsAddend = wrapperspb.UInt64(math.MaxUint64)
	cases := []struct {
		name  string
		req   *rlpb.RateLimitRequest
		field string
	}{
		{"empty domain", &rlpb.RateLimitRequest{Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a", "b")}}, "domain"},
		{"bad utf8 domain", &rlpb.RateLimitRequest{Domain: "\xff", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a", "b")}}, "domain"},
		{"no descriptors", &rlpb.RateLimitRequest{Domain: "messaging"}, "descriptors"},
		{"too many", &rlpb.RateLimitRequest{Domain: "messaging", Descriptors: many}, "descriptors"},
		{"too many entries", &rlpb.RateLimitRequest{Domain: "messaging", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a", "b"), long}}, "descriptors[1].entries"},
		{"bad utf8 value", &rlpb.RateLimitRequest{Domain: "messaging", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("a", "\xc3")}}, "descriptors[0].entries[0].value"},
		{"bad utf8 key", &rlpb.RateLimitRequest{Domain: "messaging", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("\xc3", "b")}}, "descriptors[0].entries[0].key"},
		{"unit unknown", &rlpb.RateLimitRequest{Domain: "messaging", Descriptors: []*ratelimitv3.RateLimitDescriptor{unknownUnit}}, "descriptors[0].limit.unit"},
		{"huge hits", &rlpb.RateLimitRequest{Domain: "messaging", Descriptors: []*ratelimitv3.RateLimitDescriptor{huge}}, "descriptors[0].hits_addend"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.ShouldRateLimit(context.Background(), tc.req)
			var re *RequestError
			if !errors.As(err, &re) || re.Field != tc.field {
				t.Fatalf("got %v, want a RequestError on %s", err, tc.field)
			}
		})
	}
	// Nothing was counted: the full limit remains.
	if r := call(t, s, "messaging", desc("to_number", "1")); r.Statuses[0].LimitRemaining != 99 {
		t.Fatalf("a refused request counted: %v", r)
	}
}

func TestHeaders(t *testing.T) {
	c := mustParse(t, "domain: h\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 10, name: per_a}\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 3}\n")
	hdr := func(r *rlpb.RateLimitResponse) string {
		var out []string
		for _, h := range r.ResponseHeadersToAdd {
			out = append(out, h.Key+": "+h.Value)
		}
		return strings.Join(out, "|")
	}
	// 1_700_000_000 is 20 s into its minute and 13 min 20 s into its hour.
	cases := []struct {
		mode  HeaderMode
		names HeaderNames
		want  string
	}{
		{HeadersOff, HeaderNames{}, ""},
		{HeadersXRateLimit, HeaderNames{}, "X-RateLimit-Limit: 3|X-RateLimit-Remaining: 2|X-RateLimit-Reset: 2800"},
		{HeadersReference, HeaderNames{}, "RateLimit-Limit: 3|RateLimit-Remaining: 2|RateLimit-Reset: 2800"},
		{HeadersReference, HeaderNames{Reset: "X-Reset"}, "RateLimit-Limit: 3|RateLimit-Remaining: 2|X-Reset: 2800"},
		{HeadersDraft, HeaderNames{}, `RateLimit: "default";r=2;t=2800|RateLimit-Policy: "default";q=3;w=3600`},
	}
	for _, tc := range cases {
		s, _ := newTestService(t, c, Options{Headers: tc.mode, HeaderNames: tc.names})
		if got := hdr(call(t, s, "h", desc("a", "1"), desc("b", "1"))); got != tc.want {
			t.Errorf("mode %v: %q, want %q", tc.mode, got, tc.want)
		}
	}
	// Over limit: the over descriptor is reported.
	s, _ := newTestService(t, c, Options{Headers: HeadersDraft})
	for i := 0; i < 10; i++ {
		call(t, s, "h", desc("a", "1"))
	}
	if got := hdr(call(t, s, "h", desc("a", "1"), desc("b", "1"))); got != `RateLimit: "per_a";r=0;t=40|RateLimit-Policy: "per_a";q=10;w=60` {
		t.Fatalf("over: %q", got)
	}
	for _, in := range []string{"", "off", "draft", "x-ratelimit", "reference"} {
		if _, err := ParseHeaderMode(in); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ParseHeaderMode("bogus"); err == nil {
		t.Fatal("bogus mode accepted")
	}
}

func TestGlobalShadow(t *testing.T) {
	s, _ := newTestService(t, mustParse(t, readmeExample3), Options{GlobalShadow: true})
	if r := call(t, s, "edge_proxy_per_ip", desc("remote_address", "50.0.0.5")); codes(r) != "OK OVER_LIMIT" {
		t.Fatalf("%v", r)
	}
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := NewMetrics(reg, 2)
	if err != nil {
		t.Fatal(err)
	}
	c := mustParse(t, readmeExample2, "domain: d\ndescriptors:\n  - key: user\n    detailed_metric: true\n    rate_limit: {unit: minute, requests_per_unit: 1}\n  - key: v\n    shadow_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 10}\n")
	s, _ := newTestService(t, c, Options{Metrics: m})
	mk := desc("message_type", "marketing", "to_number", "2061111111")
	for i := 0; i < 7; i++ { // 5 within (4 and 5 near), 2 over
		call(t, s, "messaging", mk)
	}
	for _, u := range []string{"a", "b", "c", "a"} {
		call(t, s, "d", desc("user", u))
	}
	r, err := s.ShouldRateLimit(context.Background(), &rlpb.RateLimitRequest{Domain: "d", HitsAddend: 12, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("v", "x")}})
	if err != nil || codes(r) != "OK OK" {
		t.Fatalf("shadow: %v %v", r, err)
	}
	call(t, s, "nope", desc("x", "y"))
	rule := "message_type_marketing.to_number"
	checks := []struct {
		c    prometheus.Collector
		lbl  []string
		want float64
	}{
		{m.counters[statTotalHits], []string{"messaging", rule}, 7},
		{m.counters[statWithinLimit], []string{"messaging", rule}, 5},
		{m.counters[statNearLimit], []string{"messaging", rule}, 1},
		{m.counters[statOverLimit], []string{"messaging", rule}, 2},
		{m.counters[statTotalHits], []string{"d", "user_a"}, 2},
		{m.counters[statTotalHits], []string{"d", "user_b"}, 1},
		{m.counters[statTotalHits], []string{"d", "user"}, 1}, // past the cap of 2
		{m.counters[statOverLimit], []string{"d", "v"}, 2},
		{m.counters[statNearLimit], []string{"d", "v"}, 2},
		{m.counters[statShadowMode], []string{"d", "v"}, 2},
		{m.unknown, nil, 1},
		{m.detailedDenied, nil, 1},
	}
	for _, ck := range checks {
		var got float64
		if ck.lbl == nil {
			got = testutil.ToFloat64(ck.c)
		} else {
			got = testutil.ToFloat64(ck.c.(*prometheus.CounterVec).WithLabelValues(ck.lbl...))
		}
		if got != ck.want {
			t.Errorf("%v: %v, want %v", ck.lbl, got, ck.want)
		}
	}
	if _, err := NewMetrics(reg, 0); err == nil {
		t.Fatal("registering twice succeeded")
	}
}
