package shard

import (
	"errors"
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// TestCommitOfMovedGrant is the regression test of a commit refused on a
// key's new owner: a reservation made before a handoff is settled after
// it, on the new owner, exactly once, whether the old owner settled it
// first or not (the record of settled grants travels with the bucket).
func TestCommitOfMovedGrant(t *testing.T) {
	type step struct {
		where   string // "old" or "new": the map that settles
		op      string // "commit", "refill"
		used    int64
		remain  int64
		debt    int64
		settled bool
	}
	rules := []*rule.Rule{
		{Name: "tb", Algorithm: bucket.TokenBucket, Limit: 10, Period: 10 * time.Second},
		{Name: "fw", Algorithm: bucket.FixedWindow, Limit: 10, Period: 10 * time.Second},
		{Name: "sw", Algorithm: bucket.SlidingWindow, Limit: 10, Period: 10 * time.Second, SampleCount: 10},
	}
	cases := []struct {
		name  string
		steps []step // the move happens before the first "new" step
	}{
		{"less after move", []step{
			{where: "new", op: "commit", used: 1, remain: 9, settled: true},
			{where: "new", op: "commit", used: 1, remain: 9}, // retried
		}},
		{"overrun after move", []step{
			{where: "new", op: "commit", used: 14, remain: 0, debt: 4, settled: true},
			{where: "new", op: "commit", used: 14, remain: 0, debt: 4},
		}},
		{"committed before move", []step{
			{where: "old", op: "commit", used: 1, remain: 9, settled: true},
			{where: "new", op: "commit", used: 14, remain: 9},
		}},
		{"refilled before move", []step{
			{where: "old", op: "refill", remain: 10},
			{where: "new", op: "commit", used: 14, remain: 10},
		}},
	}
	s, get := store(t, rules...)
	for _, r := range rules {
		for _, tc := range cases {
			t.Run(r.Name+"/"+tc.name, func(t *testing.T) {
				c := get(r.Name)
				old, nu := New(Config{}), New(Config{})
				oldNow, newNow := int64(1e15), int64(3e12) // two processes' clocks
				d := acquire(t, old, c, "k", 4, oldNow)
				id := d.Grant.String()
				moved := false
				for i, st := range tc.steps {
					m, now := old, oldNow
					if st.where == "new" {
						if !moved {
							move(t, old, nu, s.Table(), oldNow, newNow)
							moved = true
						}
						m, now = nu, newNow
					}
					switch st.op {
					case "refill":
						if _, rem, err := m.Refill(c, "k", id, -1, now); err != nil || rem != st.remain {
							t.Fatalf("step %d: refill = remaining %d, %v; want %d", i, rem, err, st.remain)
						}
					case "commit":
						res, err := m.Commit(c, "k", id, st.used, now)
						if err != nil {
							t.Fatalf("step %d: commit on the %s owner: %v", i, st.where, err)
						}
						if res.Remaining != st.remain || res.Debt != st.debt || res.Settled != st.settled {
							t.Fatalf("step %d: commit %d on the %s owner = remaining %d debt %d settled %v, want %d %d %v",
								i, st.used, st.where, res.Remaining, res.Debt, res.Settled, st.remain, st.debt, st.settled)
						}
					}
				}
			})
		}
	}
}

// TestRenewAndReleaseOfMovedLease: a concurrency lease taken before a
// handoff is renewed and released on the new owner, once.
func TestRenewAndReleaseOfMovedLease(t *testing.T) {
	s, get := store(t, &rule.Rule{Name: "cc", Algorithm: bucket.Concurrency, Limit: 2, Period: 10 * time.Second})
	c := get("cc")
	old, nu := New(Config{}), New(Config{})
	oldNow, newNow := int64(1e15), int64(3e12)
	id := acquire(t, old, c, "k", 1, oldNow).Grant.String()
	acquire(t, old, c, "k", 1, oldNow)
	move(t, old, nu, s.Table(), oldNow, newNow)
	newNow += 8 * sec
	if ok, err := nu.Renew(c, "k", id, newNow); err != nil || !ok {
		t.Fatalf("renew of a moved lease = %v, %v; want true", ok, err)
	}
	newNow += 8 * sec // past the first lease's end, within the renewed one
	if d := acquire(t, nu, c, "k", 1, newNow); !d.Allowed {
		t.Fatalf("the unrenewed lease should have expired: %+v", d)
	}
	if got, _, err := nu.Refill(c, "k", id, -1, newNow); err != nil || got != 1 {
		t.Fatalf("release of the moved lease = %d, %v; want 1", got, err)
	}
	if got, _, _ := nu.Refill(c, "k", id, -1, newNow); got != 0 {
		t.Fatalf("second release gave back %d", got)
	}
}

// TestInlineLimitSurvivesMove is the regression test of a bucket that
// lost its request's limit on a handoff: it was exported and installed
// under the rule's configuration (here 100 per 10 s, where the request
// asked 5 per 10 s), so that it refilled at the rule's rate and held the
// rule's capacity. A key spent under its request's limit stays spent on
// its new owner, for settlements too; a state without the limit (from an
// older sender) is judged by the rule's configuration as before.
func TestInlineLimitSurvivesMove(t *testing.T) {
	policy := rule.InlinePolicy{MaxLimit: 100, MaxPeriod: 10 * time.Second}
	rules := []*rule.Rule{
		{Name: "tb", Algorithm: bucket.TokenBucket, Limit: 100, Period: 10 * time.Second, Inline: policy},
		{Name: "fw", Algorithm: bucket.FixedWindow, Limit: 100, Period: 10 * time.Second, Inline: policy},
		{Name: "sw", Algorithm: bucket.SlidingWindow, Limit: 100, Period: 10 * time.Second, SampleCount: 10, Inline: policy},
	}
	// What a state without the limit leaves under the rule's 100: the
	// token bucket's tokens (half of one), the windows' count of 5.
	oldSender := map[string]int64{"tb": 0, "fw": 95, "sw": 95}
	s, get := store(t, rules...)
	for _, r := range rules {
		t.Run(r.Name, func(t *testing.T) {
			c := get(r.Name)
			old, nu := New(Config{}), New(Config{})
			oldNow, newNow := int64(1e15), int64(3e12)
			d := acquireInline(t, old, c, "k", 5, 5, oldNow)
			if !d.Allowed || d.Remaining != 0 {
				t.Fatalf("spending the request's limit: %+v", d)
			}
			// The handoff a second later (a tenth of a token back under
			// the request's limit, ten under the rule's).
			oldNow += sec
			newNow += sec
			move(t, old, nu, s.Table(), oldNow, newNow)
			// A settlement before any acquire on the new owner: judged
			// by the request's limit, not the rule's.
			res, err := nu.Commit(c, "k", d.Grant.String(), 5, newNow)
			if err != nil || !res.Settled || res.Remaining != 0 {
				t.Fatalf("commit of the 5 reserved after the move = %+v, %v; want nothing left under the request's limit", res, err)
			}
			if d := acquireInline(t, nu, c, "k", 5, 1, newNow); d.Allowed {
				t.Fatalf("after the move, the key spent under its limit of 5 is granted again: %+v", d)
			}
			st, ok, err := nu.ExportKey(c.Rule.Name, "k", newNow)
			if err != nil || !ok || st.Inline == nil || st.Inline.Limit != 5 {
				t.Fatalf("the new owner exports %+v (%v, %v); want it to carry the limit of 5", st.Inline, ok, err)
			}
			st.Inline = nil // an older sender
			plain := New(Config{})
			if ok, err := plain.Import(s.Table(), st, newNow); !ok || err != nil {
				t.Fatalf("import without a limit: %v %v", ok, err)
			}
			if got := acquire(t, plain, c, "k", 0, newNow).Remaining; got != oldSender[r.Name] {
				t.Fatalf("a state without a limit keeps its count under the rule's: remaining %d, want %d", got, oldSender[r.Name])
			}
		})
	}
}

// TestSettlementsOnAHandedOverBucket is the regression test of a grant
// settled twice across a move: a commit, refill or renew that reached the
// old owner after it froze the bucket (HandOver) settled the stale copy,
// which the new owner never learnt of, so the overrun was lost and a
// retry on the new owner settled the grant again. The frozen bucket now
// refuses them with ErrMoved and changes nothing; the new owner settles
// them once.
func TestSettlementsOnAHandedOverBucket(t *testing.T) {
	s, get := store(t,
		&rule.Rule{Name: "tb", Algorithm: bucket.TokenBucket, Limit: 10, Period: 10 * time.Second},
		&rule.Rule{Name: "cc", Algorithm: bucket.Concurrency, Limit: 2, Period: 10 * time.Second},
	)
	tbc, ccc := get("tb"), get("cc")
	old, nu := New(Config{}), New(Config{})
	oldNow, newNow := int64(1e15), int64(3e12)
	committed := acquire(t, old, tbc, "k", 4, oldNow).Grant.String()
	refilled := acquire(t, old, tbc, "k", 2, oldNow).Grant.String()
	lease := acquire(t, old, ccc, "k", 1, oldNow).Grant.String()
	var states []BucketState
	if err := old.HandOver(oldNow, func(string, string) bool { return true }, func(st BucketState) error {
		states = append(states, st)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := old.Commit(tbc, "k", committed, 9, oldNow); !errors.Is(err, ErrMoved) {
		t.Fatalf("commit on the frozen bucket: %v, want ErrMoved", err)
	}
	if _, _, err := old.Refill(tbc, "k", refilled, -1, oldNow); !errors.Is(err, ErrMoved) {
		t.Fatalf("refill on the frozen bucket: %v, want ErrMoved", err)
	}
	if _, err := old.Renew(ccc, "k", lease, oldNow); !errors.Is(err, ErrMoved) {
		t.Fatalf("renew on the frozen bucket: %v, want ErrMoved", err)
	}
	is := old.Issuers()
	for i := range is {
		is[i].Offset += newNow - oldNow
	}
	nu.AddIssuers(is)
	for _, st := range states {
		if ok, err := nu.Import(s.Table(), st, newNow); !ok || err != nil {
			t.Fatalf("import: %v %v", ok, err)
		}
	}
	res, err := nu.Commit(tbc, "k", committed, 9, newNow)
	if err != nil || !res.Settled || res.Remaining != 0 || res.Debt != 1 {
		t.Fatalf("commit on the new owner = %+v, %v; want settled once, 4 + 2 reserved, 9 used: debt 1", res, err)
	}
	if got, _, err := nu.Refill(tbc, "k", refilled, -1, newNow); err != nil || got != 2 {
		t.Fatalf("refill on the new owner = %d, %v; want 2", got, err)
	}
	if ok, err := nu.Renew(ccc, "k", lease, newNow); err != nil || !ok {
		t.Fatalf("renew on the new owner = %v, %v; want true", ok, err)
	}
	// Grants the new owner made, sent to the old one (a stale view): the
	// old owner cannot open them, and sends them on (ErrMoved) rather
	// than answer that it knows no such grant.
	tbGrant := acquire(t, nu, tbc, "k", 1, newNow)
	ccGrant := acquire(t, nu, ccc, "k", 1, newNow)
	if !tbGrant.Allowed || !ccGrant.Allowed {
		t.Fatalf("acquires on the new owner: %+v %+v", tbGrant, ccGrant)
	}
	if _, err := old.Commit(tbc, "k", tbGrant.Grant.String(), 1, oldNow); !errors.Is(err, ErrMoved) {
		t.Fatalf("commit of the new owner's grant on the old owner: %v, want ErrMoved", err)
	}
	if _, _, err := old.Refill(ccc, "k", ccGrant.Grant.String(), -1, oldNow); !errors.Is(err, ErrMoved) {
		t.Fatalf("release of the new owner's lease on the old owner: %v, want ErrMoved", err)
	}
	if _, err := old.Renew(ccc, "k", ccGrant.Grant.String(), oldNow); !errors.Is(err, ErrMoved) {
		t.Fatalf("renew of the new owner's lease on the old owner: %v, want ErrMoved", err)
	}
}
