package shard

import (
	"context"
	"errors"
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
	if n := cur.KeyCount.Load(); n > 2 {
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
	if n := cur.KeyCount.Load(); n > 2 {
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
