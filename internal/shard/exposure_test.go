package shard

import (
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// TestOwedCountsDebtAndLeases: Owed reports a bucket's debt and the
// permits its live concurrency leases hold, skips buckets that owe and
// hold nothing, and skips a bucket handed over (its new owner counts it).
func TestOwedCountsDebtAndLeases(t *testing.T) {
	_, get := store(t,
		&rule.Rule{Name: "fw", Algorithm: bucket.FixedWindow, Limit: 10, Period: time.Hour},
		&rule.Rule{Name: "cc", Algorithm: bucket.Concurrency, Limit: 10, Period: time.Hour},
	)
	fw, cc := get("fw"), get("cc")
	m := New(Config{})
	now := int64(1e12)
	g := acquire(t, m, fw, "debtor", 5, now)
	if _, err := m.Commit(fw, "debtor", g.Grant.String(), 17, now); err != nil {
		t.Fatal(err)
	}
	acquire(t, m, fw, "fine", 3, now)
	for i := 0; i < 3; i++ {
		acquire(t, m, cc, "worker", 1, now)
	}
	acquire(t, m, cc, "moved", 2, now)
	if err := m.HandOver(now, func(_, key string) bool { return key == "moved" }, func(BucketState) error { return nil }); err != nil {
		t.Fatal(err)
	}
	got := map[string][2]int64{}
	m.Owed(now, func(c *rule.Compiled, debt, leased int64) {
		v := got[c.Rule.Name]
		got[c.Rule.Name] = [2]int64{v[0] + debt, v[1] + leased}
	})
	want := map[string][2]int64{"fw": {7, 0}, "cc": {0, 3}}
	if len(got) != len(want) || got["fw"] != want["fw"] || got["cc"] != want["cc"] {
		t.Fatalf("Owed per rule (debt, leased) = %v, want %v", got, want)
	}
}
