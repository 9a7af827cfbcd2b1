package shard

import (
	"errors"
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// compiled compiles r as a store would at version 1.
func compiled(t testing.TB, r *rule.Rule) *rule.Compiled {
	t.Helper()
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	r.Version, r.Generation = 1, 1
	return rule.Compile(r)
}

// costStep is one step of a commit table: at a time (seconds after t0), an
// acquire of n (grant kept under name g), or a commit of grant g at used.
type costStep struct {
	at      float64
	op      string // "acquire", "commit", "refill"
	g       string
	n       int64
	allowed bool  // acquire
	remain  int64 // acquire, commit: remaining after
	debt    int64 // commit
	settled bool  // commit
	err     error // commit
}

func runCost(t *testing.T, r *rule.Rule, steps []costStep) {
	t.Helper()
	c := compiled(t, r)
	m := New(Config{})
	t0 := 100 * sec
	grants := map[string]string{}
	for i, s := range steps {
		now := t0 + int64(s.at*float64(sec))
		switch s.op {
		case "acquire":
			d, err := m.Acquire(c, "k", bucket.Request{Permits: s.n}, now)
			if err != nil {
				t.Fatalf("step %d: acquire: %v", i, err)
			}
			if d.Allowed != s.allowed || d.Remaining != s.remain {
				t.Fatalf("step %d: acquire %d = allowed %v remaining %d, want %v %d", i, s.n, d.Allowed, d.Remaining, s.allowed, s.remain)
			}
			if d.Allowed {
				grants[s.g] = d.Grant.String()
			}
		case "commit":
			res, err := m.Commit(c, "k", grants[s.g], s.n, now)
			if !errors.Is(err, s.err) || (s.err == nil) != (err == nil) {
				t.Fatalf("step %d: commit %s at %d: err %v, want %v", i, s.g, s.n, err, s.err)
			}
			if err != nil {
				continue
			}
			if res.Remaining != s.remain || res.Debt != s.debt || res.Settled != s.settled {
				t.Fatalf("step %d: commit %s at %d = remaining %d debt %d settled %v, want %d %d %v", i, s.g, s.n, res.Remaining, res.Debt, res.Settled, s.remain, s.debt, s.settled)
			}
		case "refill":
			if _, _, err := m.Refill(c, "k", grants[s.g], s.n, now); err != nil {
				t.Fatalf("step %d: refill: %v", i, err)
			}
		}
	}
}

// TestCommitSteps: reserve → commit through the shard, per algorithm,
// with a fake clock: used below the estimate gives back, above it goes
// into debt that denies until repaid, a retried commit changes nothing,
// and a commit after the reservation TTL changes nothing and says so.
func TestCommitSteps(t *testing.T) {
	tests := []struct {
		name  string
		r     *rule.Rule
		steps []costStep
	}{
		{"token bucket", &rule.Rule{Name: "tb", Algorithm: bucket.TokenBucket, Limit: 10, Period: 10 * time.Second}, []costStep{
			{at: 0, op: "acquire", g: "a", n: 4, allowed: true, remain: 6},
			{at: 0, op: "commit", g: "a", n: 1, remain: 9, settled: true},
			{at: 0, op: "commit", g: "a", n: 20, remain: 9}, // retried: nothing changes
			{at: 0, op: "refill", g: "a", n: 3},             // already settled: nothing
			{at: 0, op: "acquire", g: "b", n: 9, allowed: true, remain: 0},
			{at: 0, op: "commit", g: "b", n: 14, remain: 0, debt: 5, settled: true},
			{at: 4, op: "acquire", g: "x", n: 1, allowed: false, remain: 0}, // 4 repaid of 5
			{at: 6, op: "acquire", g: "c", n: 1, allowed: true, remain: 0},
		}},
		{"fixed window", &rule.Rule{Name: "fw", Algorithm: bucket.FixedWindow, Limit: 10, Period: 10 * time.Second}, []costStep{
			{at: 0, op: "acquire", g: "a", n: 5, allowed: true, remain: 5},
			{at: 1, op: "commit", g: "a", n: 17, remain: 0, debt: 7, settled: true},
			{at: 2, op: "acquire", g: "x", n: 1, allowed: false, remain: 0},
			{at: 10, op: "acquire", g: "b", n: 1, allowed: true, remain: 2}, // next window repays 7 of 10
		}},
		{"leaky bucket", &rule.Rule{Name: "lb", Algorithm: bucket.LeakyBucket, Limit: 10, Period: 10 * time.Second, Burst: 10}, []costStep{
			{at: 0, op: "acquire", g: "a", n: 2, allowed: true, remain: 0},
			{at: 0, op: "commit", g: "a", n: 5, remain: 0, debt: 5, settled: true},
			{at: 0, op: "commit", g: "a", n: 0, remain: 0, debt: 5},
			{at: 3.5, op: "acquire", g: "x", n: 1, allowed: false, remain: 0},
			{at: 5, op: "acquire", g: "b", n: 1, allowed: true, remain: 0},
		}},
		{"sliding window", &rule.Rule{Name: "sw", Algorithm: bucket.SlidingWindow, Limit: 10, Period: 10 * time.Second, SampleCount: 10}, []costStep{
			{at: 0, op: "acquire", g: "a", n: 6, allowed: true, remain: 4},
			{at: 0.5, op: "commit", g: "a", n: 2, remain: 8, settled: true},
		}},
		{"ttl passed", &rule.Rule{Name: "ttl", Algorithm: bucket.TokenBucket, Limit: 10, Period: 10 * time.Second, ReservationTTL: 2 * time.Second}, []costStep{
			{at: 0, op: "acquire", g: "a", n: 8, allowed: true, remain: 2},
			{at: 2, op: "commit", g: "a", n: 0, err: ErrGrantExpired},
			{at: 2, op: "acquire", g: "b", n: 5, allowed: false, remain: 4}, // still charged at 8 (2 refilled)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { runCost(t, tt.r, tt.steps) })
	}
}

// TestCommitBadInput: refused commits change nothing.
func TestCommitBadInput(t *testing.T) {
	c := compiled(t, &rule.Rule{Name: "tb", Algorithm: bucket.TokenBucket, Limit: 10, Period: time.Second})
	other := compiled(t, &rule.Rule{Name: "other", Algorithm: bucket.TokenBucket, Limit: 10, Period: time.Second})
	log := compiled(t, &rule.Rule{Name: "log", Algorithm: bucket.SlidingLog, Limit: 10, Period: time.Second})
	m := New(Config{})
	now := 100 * sec
	d, err := m.Acquire(c, "k", bucket.Request{Permits: 5}, now)
	if err != nil {
		t.Fatal(err)
	}
	id := d.Grant.String()
	for _, tc := range []struct {
		name string
		c    *rule.Compiled
		key  string
		id   string
		used int64
		want error
	}{
		{"negative used", c, "k", id, -1, rule.ErrInvalid},
		{"malformed id", c, "k", "nope", 1, rule.ErrInvalid},
		{"other key", c, "j", id, 1, ErrGrantNotFound},
		{"other rule", other, "k", id, 1, ErrGrantNotFound},
		{"no commits", log, "k", id, 1, rule.ErrInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := m.Commit(tc.c, tc.key, tc.id, tc.used, now); !errors.Is(err, tc.want) {
				t.Fatalf("Commit = %v, want %v", err, tc.want)
			}
		})
	}
	if d := acquire(t, m, c, "k", 0, now); d.Remaining != 5 {
		t.Fatalf("remaining %d after refused commits, want 5", d.Remaining)
	}
	if res, err := m.Commit(c, "k", id, 5, now); err != nil || !res.Settled {
		t.Fatalf("the grant commits once refused commits passed: %+v %v", res, err)
	}
}

// TestCommitAfterEviction: an overrun committed after the key's bucket
// was evicted (back at its initial state) is charged all the same, once.
func TestCommitAfterEviction(t *testing.T) {
	c := compiled(t, &rule.Rule{Name: "tb", Algorithm: bucket.TokenBucket, Limit: 10, Period: 10 * time.Second, Burst: 2})
	m := New(Config{})
	now := 100 * sec
	d := acquire(t, m, c, "k", 2, now)
	now += 5 * sec // refilled: idle
	m.Sweep(now, rule.NewTable(1, []*rule.Rule{c.Rule}, nil))
	if m.Live() != 0 {
		t.Fatalf("live %d after sweep, want 0", m.Live())
	}
	res, err := m.Commit(c, "k", d.Grant.String(), 6, now)
	if err != nil || res.Debt != 2 {
		t.Fatalf("commit after eviction = %+v, %v; want debt 2", res, err)
	}
	if res, err = m.Commit(c, "k", d.Grant.String(), 6, now); err != nil || res.Settled || res.Debt != 2 {
		t.Fatalf("retried commit after eviction = %+v, %v; want no change", res, err)
	}
}
