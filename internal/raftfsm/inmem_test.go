package raftfsm

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
)

func inmem(t *testing.T, maxRules int) *Node {
	t.Helper()
	n, err := NewInmem("solo", maxRules)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Error(err)
		}
	})
	return n
}

// TestInmemNode: the in-memory node leads and is ready when NewInmem
// returns, with itself in the view, and keeps rules with Raft indexes
// as versions and the cap of its configuration.
func TestInmemNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n := inmem(t, 2)
	if !n.IsLeader() || !n.Ready() || n.View().Len() != 1 {
		t.Fatalf("leader %v, ready %v, view of %d", n.IsLeader(), n.Ready(), n.View().Len())
	}
	a, err := n.Put(ctx, tbRule("a", 10), nil)
	if err != nil {
		t.Fatal(err)
	}
	if a.Version != n.fsm.AppliedIndex() || a.Generation != a.Version {
		t.Fatalf("put: version %d generation %d, applied %d", a.Version, a.Generation, n.fsm.AppliedIndex())
	}
	if _, err := n.Put(ctx, tbRule("b", 10), nil); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Put(ctx, tbRule("c", 10), nil); !errors.Is(err, rule.ErrTooManyRules) {
		t.Fatalf("third rule under Config.MaxRules 2: %v", err)
	}
	got, err := n.Get(ctx, "a")
	if err != nil || got.Limit != 10 {
		t.Fatalf("get: %+v %v", got, err)
	}
	snap, err := n.SnapshotSave(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := buf.ReadFrom(snap); err != nil {
		t.Fatal(err)
	}
	snap.Close()
	if err := n.Delete(ctx, "a", nil); err != nil {
		t.Fatal(err)
	}
	if count, _, err := n.RestoreRules(ctx, &buf); err != nil || count != 2 || n.Table().Get("a") == nil {
		t.Fatalf("restore: %d rules, %v", count, err)
	}
}

// TestEdgeValidates: a bad rule or name is refused where it enters the
// log (InvalidArgument for the server) and never reaches it; the FSM does
// not validate (TestReplayDoesNotValidate), so this is the only check.
func TestEdgeValidates(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n := inmem(t, 0)
	if _, err := n.Put(ctx, tbRule("api", 10), nil); err != nil {
		t.Fatal(err)
	}
	before := n.Table().Version
	for _, bad := range []*rule.Rule{
		tbRule("api", -1),
		{Name: "no period", Algorithm: bucket.TokenBucket, Limit: 1},
		tbRule("bad name!", 1),
		{Name: "x", Algorithm: bucket.Algorithm(99), Limit: 1, Period: time.Second},
	} {
		if _, err := n.Put(ctx, bad, nil); !errors.Is(err, rule.ErrInvalid) {
			t.Fatalf("put %+v: %v, want ErrInvalid", bad, err)
		}
	}
	if err := n.Delete(ctx, "bad name!", nil); !errors.Is(err, rule.ErrInvalid) {
		t.Fatalf("delete of a bad name: %v", err)
	}
	bad := newState()
	if err := bad.Rules.Put(1, tbRule("neg", -1), nil, 0); err != nil {
		t.Fatal(err)
	}
	snap, err := encodeSnapshot(bad)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := n.RestoreRules(ctx, bytes.NewReader(snap)); !errors.Is(err, rule.ErrInvalid) {
		t.Fatalf("restore of an invalid rule: %v", err)
	}
	if n.Table().Version != before || n.Table().Get("api").Rule.Limit != 10 {
		t.Fatalf("refused writes changed the rules: table at %d, was %d", n.Table().Version, before)
	}
}
