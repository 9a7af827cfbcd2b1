package shard

import (
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// TestImportOverLocalBucketHonoursMovedGrants: a key's new owner that
// already made a bucket of its own for the key (a call decided there
// before the state came) keeps the handed-over state when it has fewer
// permits left, and then honours the grants of that state: a lease is
// released and renewed, a token-bucket grant given back, each once.
// Regression: the bucket kept its own first grant nonce, newer than every
// grant of the state (the nodes' clocks differ), so each release of a
// moved lease answered 0 and the lease stayed held until it expired (the
// multi-process TestHandoffRollingRestart found it: a restarted node's
// clock is ahead of its old grants).
func TestImportOverLocalBucketHonoursMovedGrants(t *testing.T) {
	s, get := store(t,
		&rule.Rule{Name: "cc", Algorithm: bucket.Concurrency, Limit: 5, Period: time.Hour},
		&rule.Rule{Name: "tb", Algorithm: bucket.TokenBucket, Limit: 5, Period: 24 * time.Hour},
	)
	for _, tc := range []struct {
		rule string
		// settle gives grant g back on m at now and reports what came back.
		// (the i-th time).
		settle func(t *testing.T, m *Map, c *rule.Compiled, g Decision, now int64, i int) int64
		want   []int64 // per settlement of the same grant
		left   int64   // what the key has left after the import
	}{
		{"cc", func(t *testing.T, m *Map, c *rule.Compiled, g Decision, now int64, i int) int64 {
			if ok, err := m.Renew(c, "k", g.Grant.String(), now); err != nil || ok != (i == 0) {
				t.Fatalf("renew of the moved lease before release %d: %v, %v; want %v", i+1, ok, err, i == 0)
			}
			n, _, err := m.Refill(c, "k", g.Grant.String(), -1, now)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}, []int64{2, 0}, 0}, // the lease held 2 permits; every lease of both sides is held
		{"tb", func(t *testing.T, m *Map, c *rule.Compiled, g Decision, now int64, _ int) int64 {
			n, _, err := m.Refill(c, "k", g.Grant.String(), -1, now)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}, []int64{2, 0}, 1}, // the state handed over, with fewer left, is kept
	} {
		t.Run(tc.rule, func(t *testing.T) {
			c := get(tc.rule)
			a, b := New(Config{}), New(Config{})
			aNow := int64(1e15)
			bNow := aNow + int64(time.Minute) // b's clock is ahead (a node restarted since)
			g := acquire(t, a, c, "k", 2, aNow)
			acquire(t, a, c, "k", 2, aNow)
			acquire(t, b, c, "k", 1, bNow) // b decided the key before its state came
			var states []BucketState
			if err := a.HandOver(aNow, func(string, string) bool { return true }, func(s BucketState) error { states = append(states, s); return nil }); err != nil {
				t.Fatal(err)
			}
			b.AddIssuers([]Issuer{{Keys: a.Issuers()[0].Keys, Offset: bNow - aNow}})
			if ok, err := b.Import(s.Table(), states[0], bNow); !ok || err != nil {
				t.Fatalf("import: %v, %v", ok, err)
			}
			if left := acquire(t, b, c, "k", 0, bNow).Remaining; left != tc.left {
				t.Fatalf("remaining after the import %d, want %d", left, tc.left)
			}
			for i, want := range tc.want {
				if got := tc.settle(t, b, c, g, bNow, i); got != want {
					t.Fatalf("settlement %d of a grant made before the move gave back %d, want %d", i+1, got, want)
				}
			}
		})
	}
}

// TestImportMergesLeases: concurrency buckets that meet on import hold
// the leases of both sides, each once, and each side's leases are
// released and renewed where they meet. Regression: Import kept the
// bucket with fewer permits left whole, so the leases the new owner
// granted while the state was on its way (or those of the state) were
// forgotten: the key admitted past its limit and their releases
// answered 0 (the lease load of TestHandoffRollingRestart: a key held 6
// leases of 5).
func TestImportMergesLeases(t *testing.T) {
	s, get := store(t, &rule.Rule{Name: "cc", Algorithm: bucket.Concurrency, Limit: 10, Period: time.Hour})
	c := get("cc")
	for _, tc := range []struct {
		name        string
		there, here int64 // leases of one permit granted on each side
		importTwice bool  // a retried stream installs the state again
		left        int64
	}{
		{"more leases there", 4, 1, false, 5},
		{"more leases here", 1, 4, false, 5},
		{"none here", 3, 0, false, 7},
		{"installed twice: counted once", 3, 2, true, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := New(Config{}), New(Config{})
			aNow, bNow := int64(1e15), int64(1e15)+int64(time.Minute)
			var grants []Decision
			for range tc.there {
				grants = append(grants, acquire(t, a, c, "k", 1, aNow))
			}
			for range tc.here {
				grants = append(grants, acquire(t, b, c, "k", 1, bNow))
			}
			var states []BucketState
			if err := a.HandOver(aNow, func(string, string) bool { return true }, func(s BucketState) error { states = append(states, s); return nil }); err != nil {
				t.Fatal(err)
			}
			b.AddIssuers([]Issuer{{Keys: a.Issuers()[0].Keys, Offset: bNow - aNow}})
			for range map[bool]int{false: 1, true: 2}[tc.importTwice] {
				if ok, err := b.Import(s.Table(), states[0], bNow); !ok || err != nil {
					t.Fatalf("import: %v, %v", ok, err)
				}
			}
			if left := acquire(t, b, c, "k", 0, bNow).Remaining; left != tc.left {
				t.Fatalf("remaining after the import %d, want %d (%d leases there and %d here, each once)", left, tc.left, tc.there, tc.here)
			}
			for i, g := range grants {
				if ok, err := b.Renew(c, "k", g.Grant.String(), bNow); !ok || err != nil {
					t.Fatalf("renew of lease %d: %v, %v", i, ok, err)
				}
				if n, _, err := b.Refill(c, "k", g.Grant.String(), -1, bNow); n != 1 || err != nil {
					t.Fatalf("release of lease %d: %d, %v; want 1", i, n, err)
				}
			}
			if left := acquire(t, b, c, "k", 0, bNow).Remaining; left != 10 {
				t.Fatalf("remaining once every lease was released %d, want 10", left)
			}
		})
	}
}

// TestUnionLeases pins unionLeases to bucket.MarshalState's encoding:
// the union decodes, holds every lease once in expiry order, and keeps
// the later expiry of a lease both sides hold.
func TestUnionLeases(t *testing.T) {
	cfg := &bucket.Config{Algorithm: bucket.Concurrency, Limit: 10, Period: int64(time.Hour)}
	const now = int64(5e14)
	x, y := bucket.New(cfg, now), bucket.New(cfg, now)
	x.Acquire(cfg, now, bucket.Request{Permits: 2, LeaseID: 1})
	y.Acquire(cfg, now+10, bucket.Request{Permits: 1, LeaseID: 2})
	y.Acquire(cfg, now+20, bucket.Request{Permits: 2, LeaseID: 1}) // the same lease, renewed later there
	u, err := unionLeases(cfg, cfg, x, cfg, y, now+30)
	if err != nil {
		t.Fatal(err)
	}
	if left := u.Acquire(cfg, now+30, bucket.Request{}).Remaining; left != 7 {
		t.Fatalf("remaining %d, want 7 (lease 1 of 2 permits and lease 2 of 1, each once)", left)
	}
	// Lease 1 lives until now+20+Period (the later expiry), lease 2 until
	// now+10+Period.
	if left := u.Acquire(cfg, now+10+int64(time.Hour), bucket.Request{}).Remaining; left != 8 {
		t.Fatalf("remaining once lease 2 expired %d, want 8", left)
	}
	if left := u.Acquire(cfg, now+20+int64(time.Hour), bucket.Request{}).Remaining; left != 10 {
		t.Fatalf("remaining once both expired %d, want 10", left)
	}
	if _, _, err := decodeLeases([]byte{1, byte(bucket.Concurrency), 0, 2, 1}); err == nil {
		t.Fatal("a truncated state decoded")
	}
}
