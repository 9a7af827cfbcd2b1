package shard

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// TestDropFrozen: DropFrozen drops a bucket only while the HandOver its
// ref marks still has it frozen, and gives its memory back.
func TestDropFrozen(t *testing.T) {
	s, get := store(t, &rule.Rule{Name: "q", Algorithm: bucket.FixedWindow, Limit: 100, Period: 24 * time.Hour})
	c := get("q")
	const now = int64(1e15)
	all := func(string, string) bool { return true }
	// handOver freezes every bucket of m and returns the refs.
	handOver := func(t *testing.T, m *Map) []FrozenRef {
		t.Helper()
		var refs []FrozenRef
		if err := m.HandOver(now, all, func(s BucketState) error { refs = append(refs, s.Ref()); return nil }); err != nil {
			t.Fatal(err)
		}
		return refs
	}
	for _, tc := range []struct {
		name string
		// between runs after the HandOver that made refs, and returns the
		// refs DropFrozen gets.
		between func(t *testing.T, m *Map, refs []FrozenRef) []FrozenRef
		dropped int
	}{
		{"frozen: dropped", func(_ *testing.T, _ *Map, refs []FrozenRef) []FrozenRef { return refs }, 3},
		{"thawed since: kept", func(_ *testing.T, m *Map, refs []FrozenRef) []FrozenRef {
			for _, r := range refs {
				m.Thaw(r.Rule, r.Key)
			}
			return refs
		}, 0},
		{"installed back since: kept", func(t *testing.T, m *Map, refs []FrozenRef) []FrozenRef {
			for i := range refs {
				st := BucketState{Rule: "q", Generation: c.Rule.Generation, Key: refs[i].Key, State: mustState(t, c), Seq: 1, First: 1}
				if ok, err := m.Import(s.Table(), st, now); !ok || err != nil {
					t.Fatalf("import: %v %v", ok, err)
				}
			}
			return refs
		}, 0},
		{"thawed and frozen again by a later handoff: kept", func(t *testing.T, m *Map, refs []FrozenRef) []FrozenRef {
			for _, r := range refs {
				m.Thaw(r.Rule, r.Key)
			}
			if again := handOver(t, m); len(again) != len(refs) || again[0].Mark == refs[0].Mark {
				t.Fatalf("the later handoff froze %v, want new marks for %v", again, refs)
			}
			return refs
		}, 0},
		{"thawed, then exported without a freeze: kept", func(t *testing.T, m *Map, refs []FrozenRef) []FrozenRef {
			for _, r := range refs {
				m.Thaw(r.Rule, r.Key)
			}
			var plain []FrozenRef
			if err := m.Export(now, all, func(s BucketState) error { plain = append(plain, s.Ref()); return nil }); err != nil {
				t.Fatal(err)
			}
			return plain
		}, 0},
		{"unknown keys: nothing", func(_ *testing.T, _ *Map, refs []FrozenRef) []FrozenRef {
			return []FrozenRef{{Rule: "q", Key: "nobody", Mark: refs[0].Mark}, {Rule: "gone", Key: refs[0].Key, Mark: refs[0].Mark}}
		}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := New(Config{})
			for i := 0; i < 3; i++ {
				acquire(t, m, c, fmt.Sprintf("k%d", i), 7, now)
			}
			refs := handOver(t, m)
			if len(refs) != 3 {
				t.Fatalf("handed over %d buckets, want 3", len(refs))
			}
			refs = tc.between(t, m, refs)
			live, bytes := m.Live(), m.Bytes()
			if got := m.DropFrozen(refs); got != tc.dropped {
				t.Fatalf("DropFrozen dropped %d, want %d", got, tc.dropped)
			}
			if m.Live() != live-int64(tc.dropped) {
				t.Fatalf("Live %d after the drop, want %d", m.Live(), live-int64(tc.dropped))
			}
			if tc.dropped > 0 && (m.Bytes() >= bytes || m.Bytes() != 0) {
				t.Fatalf("Bytes %d after dropping every bucket (before: %d), want 0", m.Bytes(), bytes)
			}
			if tc.dropped == 0 && m.Bytes() != bytes {
				t.Fatalf("Bytes %d after dropping nothing, want %d", m.Bytes(), bytes)
			}
			if m.DropFrozen(refs) != 0 {
				t.Fatal("a second DropFrozen of the same refs dropped more")
			}
		})
	}
}

// TestDropFrozenGrantsGoToTheNewOwner: after DropFrozen a grant of the
// dropped bucket gives nothing back on the old owner, and a key that
// comes back (a handoff back) goes on from the state its new owner
// held, its old grants still honoured once.
func TestDropFrozenGrantsGoToTheNewOwner(t *testing.T) {
	s, get := store(t, &rule.Rule{Name: "cc", Algorithm: bucket.Concurrency, Limit: 3, Period: time.Hour})
	c := get("cc")
	a, b := New(Config{}), New(Config{})
	aNow, bNow := int64(9e14), int64(2e12)
	lease := acquire(t, a, c, "k", 1, aNow)
	acquire(t, a, c, "k", 1, aNow)
	var states []BucketState
	if err := a.HandOver(aNow, func(string, string) bool { return true }, func(s BucketState) error { states = append(states, s); return nil }); err != nil {
		t.Fatal(err)
	}
	b.AddIssuers([]Issuer{{Keys: a.Issuers()[0].Keys, Offset: bNow - aNow}})
	if ok, err := b.Import(s.Table(), states[0], bNow); !ok || err != nil {
		t.Fatalf("import on b: %v %v", ok, err)
	}
	if n := a.DropFrozen([]FrozenRef{states[0].Ref()}); n != 1 || a.Live() != 0 {
		t.Fatalf("DropFrozen: %d dropped, %d live; want 1, 0", n, a.Live())
	}
	// A settlement that still reaches a finds nothing to give back.
	if got, _, err := a.Refill(c, "k", lease.Grant.String(), -1, aNow); err != nil || got != 0 {
		t.Fatalf("refill on the old owner after the drop: %d, %v; want 0, nil", got, err)
	}
	// The key comes back: b hands it back, and the lease is released
	// once, where the state is.
	var back []BucketState
	if err := b.HandOver(bNow, func(string, string) bool { return true }, func(s BucketState) error { back = append(back, s); return nil }); err != nil {
		t.Fatal(err)
	}
	if ok, err := a.Import(s.Table(), back[0], aNow); !ok || err != nil {
		t.Fatalf("import back on a: %v %v", ok, err)
	}
	if left := acquire(t, a, c, "k", 0, aNow).Remaining; left != 1 {
		t.Fatalf("remaining on a after the round trip %d, want 1 (two leases held)", left)
	}
	for i, want := range []int64{1, 0} {
		got, _, err := a.Refill(c, "k", lease.Grant.String(), -1, aNow)
		if err != nil || got != want {
			t.Fatalf("release %d of a's lease after the round trip: %d, %v; want %d", i+1, got, err, want)
		}
	}
	if _, _, err := b.Refill(c, "k", lease.Grant.String(), -1, bNow); !errors.Is(err, ErrMoved) {
		t.Fatalf("release on b, which handed the key back: %v, want ErrMoved", err)
	}
}

// mustState is the state of a fresh bucket of c's default configuration.
func mustState(t *testing.T, c *rule.Compiled) []byte {
	t.Helper()
	b, err := bucket.MarshalState(&c.Config, bucket.New(&c.Config, 0), 0)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
