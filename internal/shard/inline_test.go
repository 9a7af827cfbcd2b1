package shard

import (
	"errors"
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// inlineRule is a token bucket of 10/s whose requests may carry limits up
// to 100 per up to a minute.
func inlineRule(name string) *rule.Rule {
	r := tb(name, 10)
	r.Inline = rule.InlinePolicy{MaxLimit: 100, MaxPeriod: time.Minute}
	return r
}

func acquireInline(t *testing.T, m *Map, c *rule.Compiled, key string, limit, permits, now int64) Decision {
	t.Helper()
	d, err := m.AcquireInline(c, key, rule.InlineLimit{Limit: limit}, bucket.Request{Permits: permits}, now)
	if err != nil {
		t.Fatalf("AcquireInline(%s, limit %d, %d) at %d: %v", key, limit, permits, now, err)
	}
	return d
}

// TestInlineSteps: a request's limit judges the key's one bucket; another
// limit resizes that bucket, keeping what was spent (a caller cannot
// escape its quota by changing its limit, as it could with a bucket per
// limit); a request without a limit goes back to the rule's.
func TestInlineSteps(t *testing.T) {
	c := compiled(t, inlineRule("llm"))
	m := New(Config{})
	now := 100 * sec
	for i, s := range []struct {
		limit   int64 // 0: no limit in the request
		permits int64
		allowed bool
		remain  int64
	}{
		{50, 40, true, 10},  // 50 tokens, 40 taken
		{50, 11, false, 10}, // the request's limit judges: 10 left
		{80, 11, false, 10}, // a bigger limit keeps the 10 left: no fresh bucket
		{20, 10, true, 0},   // a smaller one clamps to its capacity
		{100, 1, false, 0},  // still spent
		{0, 1, false, 0},    // the rule's limit, same bucket
	} {
		var d Decision
		if s.limit == 0 {
			d = acquire(t, m, c, "k", s.permits, now)
		} else {
			d = acquireInline(t, m, c, "k", s.limit, s.permits, now)
		}
		if d.Allowed != s.allowed || d.Remaining != s.remain {
			t.Fatalf("step %d: limit %d, %d permits: allowed %v remaining %d, want %v %d", i, s.limit, s.permits, d.Allowed, d.Remaining, s.allowed, s.remain)
		}
	}
	if m.Live() != 1 {
		t.Fatalf("%d buckets, want the key's one", m.Live())
	}
}

// TestInlineRefusedChangesNothing: a limit past a cap, or under a rule
// without an inline policy, is ErrInvalid and makes no bucket.
func TestInlineRefusedChangesNothing(t *testing.T) {
	_, get := store(t, inlineRule("llm"), tb("plain", 10))
	m := New(Config{})
	for _, tc := range []struct {
		rule string
		l    rule.InlineLimit
	}{
		{"plain", rule.InlineLimit{Limit: 5}},
		{"llm", rule.InlineLimit{Limit: 101}},
		{"llm", rule.InlineLimit{Limit: 10, Period: time.Hour}},
		{"llm", rule.InlineLimit{Limit: 10, Algorithm: bucket.LeakyBucket}},
	} {
		if _, err := m.AcquireInline(get(tc.rule), "k", tc.l, bucket.Request{Permits: 1}, sec); !errors.Is(err, rule.ErrInvalid) {
			t.Fatalf("%s %+v: err %v, want ErrInvalid", tc.rule, tc.l, err)
		}
	}
	if m.Live() != 0 {
		t.Fatalf("%d buckets after refused requests", m.Live())
	}
}

// TestInlineSettlesUnderTheRequestLimit: a commit or refill of a grant
// made under a request's limit settles under that limit; it does not
// resize the bucket back to the rule's (regression: settlements used the
// rule's configuration and clamped the bucket to 10).
func TestInlineSettlesUnderTheRequestLimit(t *testing.T) {
	c := compiled(t, inlineRule("llm"))
	m := New(Config{})
	now := 100 * sec
	d := acquireInline(t, m, c, "k", 50, 40, now)
	res, err := m.Commit(c, "k", d.Grant.String(), 10, now)
	if err != nil || res.Remaining != 40 {
		t.Fatalf("commit: remaining %d, %v; want 40 (the request limit's bucket)", res.Remaining, err)
	}
	d = acquireInline(t, m, c, "k", 50, 30, now)
	if got, rem, err := m.Refill(c, "k", d.Grant.String(), -1, now); err != nil || got != 30 || rem != 40 {
		t.Fatalf("refill: %d back, %d remaining, %v; want 30, 40", got, rem, err)
	}
}

// TestSweepKeepsInlineBucket: a bucket under a request's limit is idle by
// that limit (regression: the sweep judged it by the rule's 10 and
// dropped a bucket holding 45 of 50 as full, which a fresh bucket then
// over-admitted).
func TestSweepKeepsInlineBucket(t *testing.T) {
	s, get := store(t, inlineRule("llm"))
	m := New(Config{})
	now := 100 * sec
	acquireInline(t, m, get("llm"), "k", 50, 5, now)
	if n := m.Sweep(now+1, s.Table()); n != 0 {
		t.Fatalf("swept %d: the bucket holds 45 of 50", n)
	}
	if d := acquireInline(t, m, get("llm"), "k", 50, 46, now+1); d.Allowed {
		t.Fatal("46 granted from a bucket holding 45")
	}
	if n := m.Sweep(now+2*sec, s.Table()); n != 1 {
		t.Fatalf("swept %d once full again, want 1", n)
	}
}

// TestOverrideBeatsInline: an operator's override of the key wins over
// the request's limit.
func TestOverrideBeatsInline(t *testing.T) {
	r := inlineRule("llm")
	r.Overrides = []rule.Override{{Key: "vip", Limit: 3}}
	c := compiled(t, r)
	m := New(Config{})
	if d := acquireInline(t, m, c, "vip", 50, 3, sec); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("3 of the override's 3: allowed %v remaining %d", d.Allowed, d.Remaining)
	}
	if d := acquireInline(t, m, c, "other", 50, 40, sec); !d.Allowed {
		t.Fatal("the request's limit refused where no override applies")
	}
}

// TestInlineAllocs: a request's limit costs no allocation over a rule
// request.
func TestInlineAllocs(t *testing.T) {
	c := compiled(t, inlineRule("llm"))
	m := New(Config{})
	now := 100 * sec
	acquire(t, m, c, "a", 1, now)
	acquireInline(t, m, c, "b", 50, 1, now)
	plain := testing.AllocsPerRun(100, func() { _, _ = m.Acquire(c, "a", bucket.Request{Permits: 1}, now) })
	inl := testing.AllocsPerRun(100, func() {
		_, _ = m.AcquireInline(c, "b", rule.InlineLimit{Limit: 50}, bucket.Request{Permits: 1}, now)
	})
	if inl > plain {
		t.Fatalf("inline %v allocs, rule %v", inl, plain)
	}
}

// TestCachedConfigFollowsOverrides: a bucket caches its key's
// configuration, and a runtime override written, changed or deleted
// after the bucket was made applies from the next acquire on (the cache
// is keyed by the overrides' stamp). A fixed window keeps its count
// across a resize, so remaining is the limit less what was taken.
func TestCachedConfigFollowsOverrides(t *testing.T) {
	r := &rule.Rule{Name: "llm", Algorithm: bucket.FixedWindow, Limit: 10, Period: time.Hour, Inline: rule.InlinePolicy{MaxLimit: 100}}
	c := compiled(t, r)
	rt := &rule.Runtime{}
	c.Attach(rt)
	m := New(Config{})
	now := 100 * sec
	for i, s := range []struct {
		write   func()
		limit   int64 // 0: no limit in the request
		permits int64
		allowed bool
		remain  int64
	}{
		{nil, 0, 4, true, 6},
		{func() { rt.Put(rule.RuntimeOverride{Rule: "llm", Key: "k", Limit: 3}) }, 0, 1, false, 0},
		{func() { rt.Put(rule.RuntimeOverride{Rule: "llm", Key: "k", Limit: 8}) }, 0, 2, true, 2},
		{func() { rt.Put(rule.RuntimeOverride{Rule: "llm", Key: "k*", Limit: 1}) }, 0, 1, true, 1}, // exact beats prefix
		{func() { rt.Delete("k") }, 50, 1, false, 0},                                               // the prefix beats the request's limit
		{func() { rt.Delete("k*") }, 50, 5, true, 38},                                              // the request's limit
		{nil, 0, 1, false, 0},  // the rule's 10 again
		{nil, 50, 1, true, 37}, // and back
	} {
		if s.write != nil {
			s.write()
		}
		var d Decision
		if s.limit == 0 {
			d = acquire(t, m, c, "k", s.permits, now)
		} else {
			d = acquireInline(t, m, c, "k", s.limit, s.permits, now)
		}
		if d.Allowed != s.allowed || d.Remaining != s.remain {
			t.Fatalf("step %d: allowed %v remaining %d, want %v %d", i, d.Allowed, d.Remaining, s.allowed, s.remain)
		}
	}
}
