package shard

import (
	"errors"
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// move exports every bucket of from at fromNow and imports it into to at
// toNow, with from's grant issuers, as internal/handoff does.
func move(t *testing.T, from, to *Map, tbl *rule.Table, fromNow, toNow int64) int {
	t.Helper()
	var states []BucketState
	if err := from.Export(fromNow, func(string, string) bool { return true }, func(s BucketState) error {
		states = append(states, s)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var is []Issuer
	for _, in := range from.Issuers() {
		in.Offset += toNow - fromNow
		is = append(is, in)
	}
	to.AddIssuers(is)
	for _, s := range states {
		if ok, err := to.Import(tbl, s, toNow); err != nil || !ok {
			t.Fatalf("import %q: %v %v", s.Key, ok, err)
		}
	}
	return len(states)
}

func TestExportImportKeepsCountsAndGrants(t *testing.T) {
	day := 24 * time.Hour
	s, get := store(t,
		&rule.Rule{Name: "tb", Algorithm: bucket.TokenBucket, Limit: 10, Period: day, Penalty: time.Hour},
		&rule.Rule{Name: "fw", Algorithm: bucket.FixedWindow, Limit: 10, Period: day},
		&rule.Rule{Name: "cc", Algorithm: bucket.Concurrency, Limit: 10, Period: time.Hour},
	)
	for _, name := range []string{"tb", "fw", "cc"} {
		t.Run(name, func(t *testing.T) {
			c := get(name)
			a, b, z := New(Config{}), New(Config{}), New(Config{})
			aNow, bNow, zNow := int64(1e15), int64(3e12), int64(7e17) // three processes' clocks
			var grants []Decision
			for i := 0; i < 6; i++ {
				grants = append(grants, acquire(t, a, c, "k", 1, aNow))
			}
			id := grants[0].Grant.String()
			move(t, a, b, s.Table(), aNow, bNow)
			// Two moves in a row: a's grant still names its bucket on z.
			for i := 0; i < 2; i++ {
				acquire(t, b, c, "k", 1, bNow)
			}
			move(t, b, z, s.Table(), bNow, zNow)
			left := acquire(t, z, c, "k", 0, zNow).Remaining
			if left != 2 {
				t.Fatalf("remaining after two moves = %d, want 2", left)
			}
			got, _, err := z.Refill(c, "k", id, -1, zNow)
			if err != nil || got != 1 {
				t.Fatalf("refill of the first owner's grant on the third = %d, %v; want 1", got, err)
			}
			if again, _, _ := z.Refill(c, "k", id, -1, zNow); again != 0 {
				t.Fatalf("second refill gave back %d", again)
			}
			admitted := 0
			for i := 0; i < 20; i++ {
				if acquire(t, z, c, "k", 1, zNow).Allowed {
					admitted++
				}
			}
			if admitted != 3 {
				t.Fatalf("admitted %d after the moves, want 3 (10 - 6 - 2 + 1 refilled)", admitted)
			}
		})
	}
}

func TestImportKeepsTheEmptierBucket(t *testing.T) {
	s, get := store(t, &rule.Rule{Name: "tb", Algorithm: bucket.TokenBucket, Limit: 10, Period: 24 * time.Hour})
	c := get("tb")
	for _, tc := range []struct {
		name          string
		old, here     int64
		wantRemaining int64
	}{
		{"import emptier", 8, 2, 2},
		{"here emptier", 3, 9, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := New(Config{}), New(Config{})
			acquire(t, a, c, "k", tc.old, 100)
			acquire(t, b, c, "k", tc.here, 100) // landed here before the state did
			move(t, a, b, s.Table(), 100, 100)
			if r := acquire(t, b, c, "k", 0, 100).Remaining; r != tc.wantRemaining {
				t.Fatalf("remaining = %d, want %d", r, tc.wantRemaining)
			}
		})
	}
}

func TestImportDropsOtherGeneration(t *testing.T) {
	s, get := store(t, tb("r", 10))
	c := get("r")
	a := New(Config{})
	acquire(t, a, c, "k", 3, 100)
	var st BucketState
	_ = a.Export(100, func(string, string) bool { return true }, func(x BucketState) error { st = x; return nil })
	st.Generation++
	if ok, err := New(Config{}).Import(s.Table(), st, 100); ok || err != nil {
		t.Fatalf("import of another generation = %v, %v; want false, nil", ok, err)
	}
}

// TestHandOverFreezesTheBucket is the regression test of the rolling
// restart that admitted one request too many for 85 of 5,000 keys: a
// bucket handed over takes no decision on the old owner after its export
// (ErrMoved), is not exported twice, and is replaced by the state that
// comes back (Import) or goes on from its own (Thaw), never fresh.
func TestHandOverFreezesTheBucket(t *testing.T) {
	day := 24 * time.Hour
	s, get := store(t,
		&rule.Rule{Name: "fw", Algorithm: bucket.FixedWindow, Limit: 10, Period: day},
		&rule.Rule{Name: "tb", Algorithm: bucket.TokenBucket, Limit: 10, Period: day},
		&rule.Rule{Name: "sl", Algorithm: bucket.SlidingLog, Limit: 10, Period: day},
	)
	for _, name := range []string{"fw", "tb", "sl"} {
		t.Run(name, func(t *testing.T) {
			c := get(name)
			a, b := New(Config{}), New(Config{})
			aNow, bNow := int64(1e15), int64(3e12)
			admitted := int64(0)
			for i := 0; i < 7; i++ {
				admitted += acquire(t, a, c, "k", 1, aNow).Granted
			}
			var sent []BucketState
			handOver := func() int {
				n := 0
				if err := a.HandOver(aNow, func(string, string) bool { return true }, func(st BucketState) error {
					sent = append(sent, st)
					n++
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				return n
			}
			if n := handOver(); n != 1 {
				t.Fatalf("HandOver exported %d buckets, want 1", n)
			}
			if _, err := a.Acquire(c, "k", bucket.Request{Permits: 1}, aNow); !errors.Is(err, ErrMoved) {
				t.Fatalf("a decision after the handoff: %v, want ErrMoved", err)
			}
			if held, moved := a.Held(name, "k"); !held || !moved || a.Has(name, "k") {
				t.Fatalf("Held = %v, %v; Has = %v: want a held, moved bucket that Has does not count", held, moved, a.Has(name, "k"))
			}
			if n := handOver(); n != 0 {
				t.Fatalf("a frozen bucket was exported again (%d)", n)
			}
			if ok, err := b.Import(s.Table(), sent[0], bNow); err != nil || !ok {
				t.Fatalf("import: %v %v", ok, err)
			}
			for i := 0; i < 5; i++ {
				admitted += acquire(t, b, c, "k", 1, bNow).Granted
			}
			if admitted != 10 {
				t.Fatalf("admitted %d across the handoff, want exactly the limit 10", admitted)
			}
			// The key comes back to a: b's state replaces a's frozen one,
			// though a's had more left.
			move(t, b, a, s.Table(), bNow, aNow)
			if d := acquire(t, a, c, "k", 1, aNow); d.Allowed {
				t.Fatal("the state handed back was not installed over the frozen bucket")
			}
			// A handoff that never comes back: Thaw goes on from the
			// frozen state, never from a fresh bucket.
			z := New(Config{})
			for i := 0; i < 9; i++ {
				acquire(t, z, c, "q", 1, aNow)
			}
			if err := z.HandOver(aNow, func(string, string) bool { return true }, func(BucketState) error { return nil }); err != nil {
				t.Fatal(err)
			}
			if !z.Thaw(name, "q") || z.Thaw(name, "q") {
				t.Fatal("Thaw: want true once, then false")
			}
			if got := acquire(t, z, c, "q", 0, aNow).Remaining; got != 1 {
				t.Fatalf("thawed bucket has %d left, want the 1 it left with", got)
			}
		})
	}
}
