package shard

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// Regression tests for over-admission under rule churn: each interleaving
// below admitted more than the rule allows before the fix.

// recreate deletes the rule of r's name and puts r again: a new generation.
func recreate(t *testing.T, s rule.Store, r *rule.Rule) {
	t.Helper()
	if err := s.Delete(context.Background(), r.Name, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(context.Background(), r, nil); err != nil {
		t.Fatal(err)
	}
}

func perHour(name string, limit int64) *rule.Rule {
	return &rule.Rule{Name: name, Algorithm: bucket.TokenBucket, Limit: limit, Period: time.Hour}
}

// TestSweepWithStaleTable: a sweep judges a bucket by the rule version it
// belongs to, never by a table older than that version. A sweeper that
// loaded its table before a rule was created or re-created must not drop
// that rule's live, drained buckets (they would restart full).
func TestSweepWithStaleTable(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		churn func(t *testing.T, s rule.Store)
	}{
		{"created during the pass", func(t *testing.T, s rule.Store) {
			if _, err := s.Put(ctx, perHour("new", 5), nil); err != nil {
				t.Fatal(err)
			}
		}},
		{"re-created during the pass", func(t *testing.T, s rule.Store) {
			recreate(t, s, perHour("new", 5))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, get := store(t, perHour("other", 5), perHour("new", 5))
			if tc.name == "created during the pass" {
				if err := s.Delete(ctx, "new", nil); err != nil {
					t.Fatal(err)
				}
			}
			m := New(Config{})
			now := 100 * sec
			stale := s.Table() // what a sweeper loaded at the start of its pass
			tc.churn(t, s)
			if d := acquire(t, m, get("new"), "k", 5, now); !d.Allowed {
				t.Fatalf("first acquire: %+v", d)
			}
			if n := m.Sweep(now+sec, stale); n != 0 {
				t.Errorf("a sweep with a table older than the bucket's rule dropped %d live buckets", n)
			}
			if d := acquire(t, m, get("new"), "k", 1, now+sec); d.Allowed {
				t.Fatalf("drained key admitted again after the sweep: %+v", d)
			}
			// A current table still drops buckets of a deleted rule.
			if err := s.Delete(ctx, "new", nil); err != nil {
				t.Fatal(err)
			}
			if n := m.Sweep(now+sec, s.Table()); n != 1 {
				t.Fatalf("sweep after delete dropped %d, want 1", n)
			}
		})
	}
}

// TestNoRollback: requests judged by an older compiled rule (loaded before
// a re-create or change) never move a bucket back to that older version or
// generation, so alternating old and new requests cannot reset it.
func TestNoRollback(t *testing.T) {
	s, get := store(t, perHour("api", 5))
	m := New(Config{})
	now := 100 * sec
	old := get("api")
	recreate(t, s, perHour("api", 5))
	cur := get("api")
	var granted int64
	for i := 0; i < 6; i++ {
		c := old
		if i%2 == 1 {
			c = cur
		}
		d, err := m.Acquire(c, "k", bucket.Request{Permits: 5}, now)
		if err != nil && !errors.Is(err, rule.ErrNotFound) { // the old generation was deleted
			t.Fatal(err)
		}
		granted += d.Granted
	}
	// At most one bucket's worth per generation: 5 of the old, 5 of the new.
	if granted > 10 {
		t.Fatalf("6 alternating requests of 5 across a re-create granted %d, want at most 10", granted)
	}

	// Same generation, changed limit: the old version must not undo it.
	s2, get2 := store(t, perHour("api", 10))
	m2 := New(Config{})
	v1 := get2("api")
	if _, err := s2.Put(context.Background(), perHour("api", 2), nil); err != nil {
		t.Fatal(err)
	}
	v2 := get2("api")
	granted = acquire(t, m2, v2, "k", 2, now).Granted
	for i := 0; i < 4; i++ {
		d, err := m2.Acquire(v1, "k", bucket.Request{Permits: 1}, now)
		if err != nil {
			t.Fatal(err)
		}
		granted += d.Granted
	}
	if granted > 2 {
		t.Fatalf("an old version (limit 10) admitted on a bucket at limit 2: granted %d", granted)
	}
}

// TestMaxKeysAcrossGenerations: a bucket of an older generation that moves
// to the current one counts against the current generation's max_keys like
// a new key.
func TestMaxKeysAcrossGenerations(t *testing.T) {
	r := &rule.Rule{Name: "log", Algorithm: bucket.SlidingLog, Limit: 5, Period: time.Second, MaxKeys: 2}
	s, get := store(t, r)
	m := New(Config{})
	now := 100 * sec
	old := get("log")
	acquire(t, m, old, "a", 1, now)
	recreate(t, s, r)
	cur := get("log")
	acquire(t, m, cur, "b", 1, now)
	acquire(t, m, cur, "c", 1, now)
	_, err := m.Acquire(cur, "a", bucket.Request{Permits: 1}, now)
	if n := m.KeyCount(cur); n > 2 {
		t.Fatalf("rule with max_keys 2 holds %d keys (a moved from the old generation; err %v)", n, err)
	}
	if !errors.Is(err, ErrMaxKeys) {
		t.Fatalf("third key of the new generation: %v, want ErrMaxKeys", err)
	}
	// Alternating generations must not count the key twice either.
	for i := 0; i < 4; i++ {
		m.Acquire(old, "b", bucket.Request{Permits: 1}, now)
		m.Acquire(cur, "b", bucket.Request{Permits: 1}, now)
	}
	if n := m.KeyCount(cur); n > 2 {
		t.Fatalf("after alternating generations the rule holds %d keys", n)
	}
}

// TestRefillNoReplayAfterPeriodGrows: a grant given back once is never given
// back again, even after the rule's period grows past the period its
// refill record was kept for.
func TestRefillNoReplayAfterPeriodGrows(t *testing.T) {
	r := &rule.Rule{Name: "api", Algorithm: bucket.TokenBucket, Limit: 10, Period: 2 * time.Second}
	s, get := store(t, r)
	m := New(Config{})
	now := 100 * sec
	d := acquire(t, m, get("api"), "k", 10, now)
	id := d.Grant.String()
	if n, _, err := m.Refill(get("api"), "k", id, 5, now); err != nil || n != 5 {
		t.Fatalf("first refill: %d %v", n, err)
	}
	acquire(t, m, get("api"), "k", 5, now)
	r.Period = time.Hour
	if _, err := s.Put(context.Background(), r, nil); err != nil {
		t.Fatal(err)
	}
	acquire(t, m, get("api"), "k", 0, now+sec) // move the bucket to the new version
	// Another grant's refill after the old period prunes the record.
	d2 := acquire(t, m, get("api"), "k", 1, now+3*sec)
	if n, _, err := m.Refill(get("api"), "k", d2.Grant.String(), 1, now+3*sec); err != nil || n != 1 {
		t.Fatalf("refill of another grant: %d %v", n, err)
	}
	if n, _, err := m.Refill(get("api"), "k", id, 5, now+3*sec); err != nil || n != 0 {
		t.Fatalf("replayed refill after the period grew from 2s to 1h returned %d (%v), want 0", n, err)
	}
}

// TestKeyCountSharedWithinGeneration: every version of a generation shares
// its key count and bytes, so a rule change keeps them; a new generation
// starts at zero, a key that moves to it leaves the old count, and a sweep
// that drops the old generation's buckets brings its counts to zero.
func TestKeyCountSharedWithinGeneration(t *testing.T) {
	r1 := perHour("api", 10)
	r1.Generation, r1.Version = 1, 1
	t1 := rule.NewTable(1, []*rule.Rule{r1}, nil)
	m := New(Config{})
	now := 100 * sec
	for i := range 7 {
		acquire(t, m, t1.Get("api"), fmt.Sprint("k", i), 1, now)
	}
	r2 := r1.Clone()
	r2.Version, r2.Limit = 2, 50
	t2 := rule.NewTable(2, []*rule.Rule{r2}, t1)
	v1, v2 := t1.Get("api"), t2.Get("api")
	if got := m.KeyCount(v2); got != 7 {
		t.Fatalf("key count after an update = %d, want 7", got)
	}
	if m.RuleBytes(v2) != m.Bytes() || m.RuleBytes(v1) != m.Bytes() || m.Bytes() == 0 {
		t.Fatalf("rule bytes %d (version 1: %d), node bytes %d: want the same, not 0", m.RuleBytes(v2), m.RuleBytes(v1), m.Bytes())
	}
	r3 := r1.Clone()
	r3.Version, r3.Generation = 3, 3
	t3 := rule.NewTable(3, []*rule.Rule{r3}, t2)
	v3 := t3.Get("api")
	if got := m.KeyCount(v3); got != 0 {
		t.Fatalf("key count of a new generation = %d, want 0", got)
	}
	acquire(t, m, v3, "k0", 1, now)
	if old, cur := m.KeyCount(v2), m.KeyCount(v3); old != 6 || cur != 1 {
		t.Fatalf("after k0 moved to the new generation: old %d, new %d keys, want 6 and 1", old, cur)
	}
	if n := m.Sweep(now, t3); n != 6 {
		t.Fatalf("sweep dropped %d buckets of the gone generation, want 6", n)
	}
	if m.KeyCount(v1) != 0 || m.RuleBytes(v1) != 0 || m.KeyCount(v3) != 1 || m.RuleBytes(v3) != m.Bytes() {
		t.Fatalf("after the sweep: old %d keys %d bytes, new %d keys %d bytes of %d", m.KeyCount(v1), m.RuleBytes(v1), m.KeyCount(v3), m.RuleBytes(v3), m.Bytes())
	}
}
