package replica

import (
	"context"
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/cluster"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// TestSuccessorKeepsRequestLimitAndCommits: after kill -9 of a durable
// key's owner, the successor's copy keeps the request's limit the bucket
// was spent under (5, where the rule's is 100), and settles the
// reservations made on the dead owner, once.
func TestSuccessorKeepsRequestLimitAndCommits(t *testing.T) {
	tbl := table(&rule.Rule{Name: "quota", Algorithm: bucket.FixedWindow, Limit: 100, Period: time.Hour, Durable: true,
		Inline: rule.InlinePolicy{MaxLimit: 100}})
	view := cluster.NewView(1, []cluster.Member{{ID: "a", GRPCAddr: "a"}, {ID: "b", GRPCAddr: "b"}})
	a, b := newNode("a", tbl, view, 1e15, true), newNode("b", tbl, view, 7e12, true)
	dialB := serve(t, b)
	c := tbl.Get("quota")
	key := keyOwnedBy(t, view, "a")
	limit := rule.InlineLimit{Limit: 5}
	d, err := a.m.AcquireInline(c, key, limit, bucket.Request{Permits: 5}, a.now)
	if err != nil || !d.Allowed {
		t.Fatalf("acquire: %+v %v", d, err)
	}
	a.r.Touch(c, key, d.Granted)
	if err := a.r.Tick(context.Background(), dialB); err != nil {
		t.Fatal(err)
	}
	// a dies; b installs its copy on the first call for the key.
	b.now += int64(time.Minute)
	if err := b.r.Install(c, key); err != nil {
		t.Fatal(err)
	}
	res, err := b.m.Commit(c, key, d.Grant.String(), 7, b.now)
	if err != nil || !res.Settled || res.Debt != 2 {
		t.Fatalf("commit on the successor of a grant of the dead owner = %+v, %v; want settled, a debt of 2", res, err)
	}
	if res, err = b.m.Commit(c, key, d.Grant.String(), 7, b.now); err != nil || res.Settled || res.Debt != 2 {
		t.Fatalf("retried commit = %+v, %v; want no change", res, err)
	}
	if d, err := b.m.AcquireInline(c, key, limit, bucket.Request{Permits: 1}, b.now); err != nil || d.Allowed {
		t.Fatalf("the key spent under its limit of 5 is granted on the successor: %+v %v", d, err)
	}
}
