package handoff

import (
	"context"
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/raftfsm"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// TestHandoffKeepsRequestLimitAndCommits: over the wire, a bucket spent
// under a request's limit of 5 (the rule's is 100) stays spent on the
// new owner, and a reservation made before the move is committed there,
// once: the limit, the grant issuers and the record of settled grants
// travel with the bucket.
func TestHandoffKeepsRequestLimitAndCommits(t *testing.T) {
	s, err := raftfsm.NewInmem("handoff-test", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	r := &rule.Rule{Name: "llm", Algorithm: bucket.FixedWindow, Limit: 100, Period: 24 * time.Hour,
		Inline: rule.InlinePolicy{MaxLimit: 100}}
	if _, err := s.Put(context.Background(), r, nil); err != nil {
		t.Fatal(err)
	}
	c := s.Table().Get("llm")
	a, b := newNode(t, "a", s.Table, 9e14, true), newNode(t, "b", s.Table, 2e12, true)
	limit := rule.InlineLimit{Limit: 5}
	spent, err := a.l.Buckets.AcquireInline(c, "k", limit, bucket.Request{Permits: 3}, a.l.Now())
	if err != nil || !spent.Allowed {
		t.Fatalf("acquire: %+v %v", spent, err)
	}
	settled, err := a.l.Buckets.AcquireInline(c, "k", limit, bucket.Request{Permits: 2}, a.l.Now())
	if err != nil || !settled.Allowed {
		t.Fatalf("acquire: %+v %v", settled, err)
	}
	if _, err := a.l.Buckets.Commit(c, "k", settled.Grant.String(), 2, a.l.Now()); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Send(context.Background(), a.l, to(b), dial(t), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	// Settled on a before the move: a retry on b changes nothing.
	res, err := b.l.Buckets.Commit(c, "k", settled.Grant.String(), 50, b.l.Now())
	if err != nil || res.Settled || res.Remaining != 0 || res.Debt != 0 {
		t.Fatalf("retried commit on the new owner = %+v, %v; want no change, nothing left", res, err)
	}
	// Reserved on a, committed on b: the overrun is charged there.
	res, err = b.l.Buckets.Commit(c, "k", spent.Grant.String(), 4, b.l.Now())
	if err != nil || !res.Settled || res.Debt != 1 {
		t.Fatalf("commit of a moved grant = %+v, %v; want settled with a debt of 1", res, err)
	}
	d, err := b.l.Buckets.AcquireInline(c, "k", limit, bucket.Request{Permits: 1}, b.l.Now())
	if err != nil || d.Allowed {
		t.Fatalf("the key spent under its limit of 5 is granted on its new owner: %+v %v", d, err)
	}
}
