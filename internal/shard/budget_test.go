package shard

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// flood fills rule c's fair share of m with distinct keys (prefix + n),
// each spending one token at now, and returns how many were admitted.
func flood(t *testing.T, m *Map, c *rule.Compiled, prefix string, now int64) int {
	t.Helper()
	for i := 0; ; i++ {
		_, err := m.Acquire(c, fmt.Sprintf("%s%05d", prefix, i), bucket.Request{Permits: 1}, now)
		if err != nil {
			if !errors.Is(err, ErrBucketCap) || !strings.Contains(err.Error(), "fair share") {
				t.Fatalf("flood stopped by %v, want the fair share", err)
			}
			return i
		}
	}
}

// TestIssue20Item6_FairShareEvictsOwnFullBuckets: a flood of distinct keys
// fills a rule's fair share; while the flood's buckets still carry state,
// a new key of the rule is refused (ErrBucketCap); once they have refilled
// (full buckets are the same as none), every legitimate new key is
// decided, the rule's full buckets making room, least recently used first,
// and no other rule's bucket is evicted for it.
func TestIssue20Item6_FairShareEvictsOwnFullBuckets(t *testing.T) {
	hourly := &rule.Rule{Name: "r", Algorithm: bucket.TokenBucket, Limit: 1, Period: time.Hour}
	_, get := store(t, hourly, tb("other", 10))
	const hour = int64(time.Hour)
	now := 100 * sec
	per := entryFixed + 16 + 24 // "r\0flood00000" is 12 bytes; token bucket 24
	m := New(Config{MaxBytes: 1000 * per})

	for i := range 20 { // another rule's full buckets: never evicted for r
		acquire(t, m, get("other"), fmt.Sprintf("o%05d", i), 1, now) // full again within a second
	}
	flooded := flood(t, m, get("r"), "flood", now)
	if flooded < 700 {
		t.Fatalf("the flood got %d keys, want about its fair share", flooded)
	}

	steps := []struct {
		name    string
		at      int64
		keys    int
		decided bool
	}{
		{"flood buckets still spent: a new key is refused", now + sec, 5, false},
		{"flood buckets refilled: every new key is decided", now + hour + sec, flooded, true},
		{"the share holds only spent legitimate buckets: refused again", now + hour + 2*sec, 5, false},
	}
	next := 0
	for _, s := range steps {
		for range s.keys {
			i := next
			next++
			d, err := m.Acquire(get("r"), fmt.Sprintf("legit%05d", i), bucket.Request{Permits: 1}, s.at)
			switch {
			case s.decided && err != nil:
				t.Fatalf("%s: key %d: %v", s.name, i, err)
			case s.decided && !d.Allowed:
				t.Fatalf("%s: key %d denied: %+v", s.name, i, d)
			case !s.decided && !errors.Is(err, ErrBucketCap):
				t.Fatalf("%s: key %d: err %v, want ErrBucketCap", s.name, i, err)
			}
		}
	}
	if got := m.KeyCount(get("other")); got != 20 {
		t.Errorf("the other rule holds %d buckets, want its 20", got)
	}
	if m.Bytes() > m.MaxBytes() || m.Evicted() < int64(flooded) {
		t.Errorf("%d of %d bytes counted, %d evicted, want within the budget and the flood's %d evicted", m.Bytes(), m.MaxBytes(), m.Evicted(), flooded)
	}
}

// TestIssue20Item6_EvictsLeastRecentlyUsedFirst: among a rule's full
// buckets, the one no decision found for longest goes first.
func TestIssue20Item6_EvictsLeastRecentlyUsedFirst(t *testing.T) {
	hourly := &rule.Rule{Name: "r", Algorithm: bucket.TokenBucket, Limit: 1, Period: time.Hour}
	_, get := store(t, hourly)
	const hour = int64(time.Hour)
	per := entryFixed + 16 + 24 // "r\0flood00000" is 12 bytes
	const keys = 10
	for _, oldest := range []int{0, keys / 2, keys - 1} {
		t.Run(fmt.Sprint("oldest=", oldest), func(t *testing.T) {
			m := New(Config{Shards: 1, MaxBytes: 14 * per}) // ten keys fill the share
			now := 100 * sec
			// Each key spends its token, the oldest first, the others
			// later in turn: their last use orders them.
			order := append([]int{oldest}, slices.DeleteFunc(seq(keys), func(i int) bool { return i == oldest })...)
			for n, i := range order {
				acquire(t, m, get("r"), fmt.Sprintf("flood%05d", i), 1, now+int64(n)*sec)
			}
			if _, err := m.Acquire(get("r"), "flood99999", bucket.Request{Permits: 1}, now+keys*sec); !errors.Is(err, ErrBucketCap) {
				t.Fatalf("key past the share: %v, want ErrBucketCap", err)
			}
			acquire(t, m, get("r"), "new00000", 1, now+hour+keys*sec) // all flood buckets full
			if got := m.Evicted(); got != 1 {
				t.Fatalf("%d buckets evicted for one new key, want 1", got)
			}
			for i := range keys {
				key := fmt.Sprintf("flood%05d", i)
				if held, want := has(m, "r", key), i != oldest; held != want {
					t.Errorf("%s held: %v, want %v (the least recently used full bucket goes first)", key, held, want)
				}
			}
		})
	}
}

// seq returns 0..n-1.
func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// has reports whether m holds a bucket of rule name for key.
func has(m *Map, name, key string) bool {
	bk := bucketKey(nil, name, key)
	sh, h := m.shardOf(bk)
	e := m.lookup(sh, h, bk)
	if e != nil {
		e.mu.Unlock()
	}
	return e != nil
}
