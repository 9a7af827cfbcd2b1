package shard

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// TestMemoryBudget: buckets are counted in bytes (key, entry and algorithm
// state), a new key past the budget gets ErrBucketCap, and the count goes
// back to 0 when buckets are evicted.
func TestMemoryBudget(t *testing.T) {
	sw := &rule.Rule{Name: "sw", Algorithm: bucket.SlidingWindow, Limit: 10, Period: time.Second, SampleCount: 1000}
	s, get := store(t, tb("api", 10), sw)
	now := 100 * sec
	for _, tc := range []struct {
		rule string
		key  string
		want int64
	}{
		{"api", "k", entryFixed + 8 + 24},                        // "api\0k" is 5 bytes, rounded to 8; token bucket 24
		{"api", strings.Repeat("x", 250), entryFixed + 256 + 24}, // long keys cost their bytes
		{"sw", "k", entryFixed + 8 + 48 + 8192},                  // 1000 sub-windows: 8000 bytes in the 8 KiB size class
	} {
		m := New(Config{})
		acquire(t, m, get(tc.rule), tc.key, 1, now)
		if m.Bytes() != tc.want {
			t.Errorf("%s/%d-byte key: counted %d bytes, want %d", tc.rule, len(tc.key), m.Bytes(), tc.want)
		}
	}

	per := entryFixed + 8 + 48 + 8192
	m := New(Config{MaxBytes: 10 * per})
	var admitted int
	var err error
	for i := 0; err == nil; i++ {
		if _, err = m.Acquire(get("sw"), fmt.Sprint("k", i), bucket.Request{Permits: 1}, now); err == nil {
			admitted++
		}
	}
	// One rule alone stops at its fair share above FairShareAbove percent.
	if !errors.Is(err, ErrBucketCap) || admitted < 7 || admitted > 8 || m.Bytes() > m.MaxBytes() {
		t.Fatalf("admitted %d keys of %d bytes under a budget of 10 such keys (err %v), counted %d of %d", admitted, per, err, m.Bytes(), m.MaxBytes())
	}
	if _, err := m.Acquire(get("api"), "new", bucket.Request{Permits: 1}, now); err != nil {
		t.Fatalf("another rule's new key: %v", err)
	}
	// Existing keys are still served at the budget.
	if d := acquire(t, m, get("sw"), "k0", 1, now); !d.Allowed {
		t.Fatalf("existing key at the budget: %+v", d)
	}
	if n := m.Sweep(now+2*sec, s.Table()); n != admitted+1 || m.Bytes() != 0 {
		t.Fatalf("sweep dropped %d, %d bytes still counted", n, m.Bytes())
	}
}

// TestFairShare: while one rule floods new keys, another rule's new keys
// are still admitted, until it reaches its fair share or the budget.
func TestFairShare(t *testing.T) {
	_, get := store(t, tb("flood", 10), tb("other", 10), tb("third", 10))
	now := 100 * sec
	per := entryFixed + 16 + 24 // "flood\0k00000" is 12 bytes
	m := New(Config{MaxBytes: 1000 * per})
	var flood int
	for i := 0; ; i++ {
		if _, err := m.Acquire(get("flood"), fmt.Sprintf("k%05d", i), bucket.Request{Permits: 1}, now); err != nil {
			if !errors.Is(err, ErrBucketCap) || !strings.Contains(err.Error(), "fair share") {
				t.Fatalf("flood stopped by %v, want the fair share", err)
			}
			break
		}
		flood++
	}
	// Alone, the flood gets FairShareAbove percent of the budget.
	if flood < 740 || flood > 760 {
		t.Fatalf("a lone flooding rule got %d keys of 1000, want about %d%%", flood, FairShareAbove)
	}
	var other int
	for i := 0; ; i++ {
		if _, err := m.Acquire(get("other"), fmt.Sprintf("k%05d", i), bucket.Request{Permits: 1}, now); err != nil {
			if !errors.Is(err, ErrBucketCap) {
				t.Fatal(err)
			}
			break
		}
		other++
	}
	if other < 200 {
		t.Fatalf("another rule got %d new keys during the flood, want the rest of the budget (about 250)", other)
	}
	if m.Bytes() > m.MaxBytes() {
		t.Fatalf("counted %d bytes above the budget %d", m.Bytes(), m.MaxBytes())
	}
}

// TestLogGrowthBudget: a sliding log that would grow past the budget is
// refused rather than allowed to exceed it.
func TestLogGrowthBudget(t *testing.T) {
	r := &rule.Rule{Name: "log", Algorithm: bucket.SlidingLog, Limit: 10_000, Period: time.Hour}
	_, get := store(t, r)
	m := New(Config{MaxBytes: 4096})
	now := 100 * sec
	var err error
	for i := int64(0); i < 1000 && err == nil; i++ {
		_, err = m.Acquire(get("log"), "k", bucket.Request{Permits: 1}, now+i)
	}
	if !errors.Is(err, ErrBucketCap) {
		t.Fatalf("log growth past the budget: %v", err)
	}
	if m.Bytes() > 2*m.MaxBytes() {
		t.Fatalf("counted %d bytes, budget %d", m.Bytes(), m.MaxBytes())
	}
}

// TestPartialOnlyWhereOffered: partial on an algorithm that grants all or
// nothing is a bad request, not a grant.
func TestPartialOnlyWhereOffered(t *testing.T) {
	var rules []*rule.Rule
	for _, a := range []bucket.Algorithm{bucket.TokenBucket, bucket.LeakyBucket, bucket.FixedWindow, bucket.SlidingWindow, bucket.SlidingLog, bucket.Concurrency} {
		rules = append(rules, &rule.Rule{Name: a.String(), Algorithm: a, Limit: 5, Period: time.Second})
	}
	_, get := store(t, rules...)
	m := New(Config{})
	for _, r := range rules {
		_, err := m.Acquire(get(r.Name), "k", bucket.Request{Permits: 2, Partial: true}, 100*sec)
		if want := bucket.OffersPartial(r.Algorithm); (err == nil) != want || !want && !errors.Is(err, rule.ErrInvalid) {
			t.Errorf("%s: partial acquire error %v, want an error: %v", r.Name, err, !want)
		}
	}
}
