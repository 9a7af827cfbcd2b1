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
		}, []int64{2, 0}}, // the lease held 2 permits
		{"tb", func(t *testing.T, m *Map, c *rule.Compiled, g Decision, now int64, _ int) int64 {
			n, _, err := m.Refill(c, "k", g.Grant.String(), -1, now)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}, []int64{2, 0}},
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
			if left := acquire(t, b, c, "k", 0, bNow).Remaining; left != 1 {
				t.Fatalf("remaining after the import %d, want 1 (the state handed over, with fewer left, is kept)", left)
			}
			for i, want := range tc.want {
				if got := tc.settle(t, b, c, g, bNow, i); got != want {
					t.Fatalf("settlement %d of a grant made before the move gave back %d, want %d", i+1, got, want)
				}
			}
		})
	}
}
