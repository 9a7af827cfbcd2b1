package raftfsm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/rule"
	raftv1 "github.com/tokenserver/tokenserver/proto/tokenserver/raft/v1"
)

// change is one expected history version: its change, principal and limit
// (0 for a deletion).
type change struct {
	change, principal string
	limit             int64
}

func checkHistory(t *testing.T, got []RuleVersion, want []change) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d versions, want %d: %+v", len(got), len(want), got)
	}
	for i, w := range want {
		g := got[i]
		limit := int64(0)
		if g.Rule != nil {
			limit = g.Rule.Limit
		}
		if g.Change != w.change || g.Principal != w.principal || limit != w.limit || g.Time.IsZero() {
			t.Errorf("version %d: %s by %q limit %d at %v, want %s by %q limit %d at a time", i, g.Change, g.Principal, limit, g.Time, w.change, w.principal, w.limit)
		}
	}
}

// TestRuleHistory: puts, a deletion, a rollback and a re-creation are
// recorded newest first with principal, time and change, through a real
// one-node Raft; the history survives a snapshot and restore.
func TestRuleHistory(t *testing.T) {
	n := inmem(t, 0)
	ctx := context.Background()
	put := func(limit int64, by string) *rule.Rule {
		r := tbRule("api", limit)
		r.UpdatedBy = by
		got, err := n.Put(ctx, r, nil)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	v1 := put(10, "alice")
	put(20, "bob")
	if err := n.Delete(WithAuthor(ctx, "carol"), "api", nil); err != nil {
		t.Fatal(err)
	}
	rb, err := n.Rollback(ctx, "api", v1.Version, nil, "dave")
	if err != nil {
		t.Fatal(err)
	}
	if rb.Limit != 10 || rb.UpdatedBy != "dave" {
		t.Errorf("rollback wrote limit %d by %q, want 10 by dave", rb.Limit, rb.UpdatedBy)
	}
	want := []change{{ChangeRollback, "dave", 10}, {ChangeDelete, "carol", 0}, {ChangePut, "bob", 20}, {ChangePut, "alice", 10}}
	got := n.RuleHistory("api")
	checkHistory(t, got, want)
	if got[0].RollbackTo != v1.Version {
		t.Errorf("rollback_to %d, want %d", got[0].RollbackTo, v1.Version)
	}

	// Errors: an unknown version, a deletion, a stale CAS.
	if _, err := n.Rollback(ctx, "api", 999, nil, "x"); !errors.Is(err, rule.ErrNotFound) {
		t.Errorf("rollback to an unknown version: %v, want not found", err)
	}
	if _, err := n.Rollback(ctx, "api", got[1].Version, nil, "x"); !errors.Is(err, rule.ErrInvalid) {
		t.Errorf("rollback to a deletion: %v, want invalid", err)
	}
	stale := uint64(1)
	if _, err := n.Rollback(ctx, "api", v1.Version, &stale, "x"); !errors.Is(err, rule.ErrVersionMismatch) {
		t.Errorf("rollback with a stale version: %v, want a version mismatch", err)
	}

	// Snapshot and restore into a new FSM keep it.
	b := persist(t, n.fsm)
	f := NewFSM()
	if err := f.Restore(io.NopCloser(bytes.NewReader(b))); err != nil {
		t.Fatal(err)
	}
	checkHistory(t, f.state.Load().History.versions("api"), want)
	if !bytes.Equal(persist(t, f), b) {
		t.Error("a restored state persists to other bytes")
	}
}

// TestHistoryBoundsAndRetention: a rule keeps HistoryVersions versions; a
// deleted rule's history goes at the first write past the retention, in
// entry time, on every replica alike.
func TestHistoryBoundsAndRetention(t *testing.T) {
	f := NewFSM()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	i := uint64(0)
	putAt := func(name string, limit int64, at int64) {
		i++
		applyAt(t, f, i, entryPutRule, &raftv1.PutRule{Rule: ruleToPB(tbRule(name, limit)), TimeUnixNs: at})
	}
	for l := range int64(HistoryVersions + 5) {
		putAt("busy", l+1, t0)
	}
	vs := f.state.Load().History.versions("busy")
	if len(vs) != HistoryVersions || vs[0].Rule.Limit != HistoryVersions+5 || vs[len(vs)-1].Rule.Limit != 6 {
		t.Fatalf("%d versions from limit %d to %d, want %d from %d to 6", len(vs), vs[0].Rule.Limit, vs[len(vs)-1].Rule.Limit, HistoryVersions, HistoryVersions+5)
	}
	putAt("gone", 1, t0)
	i++
	applyAt(t, f, i, entryDeleteRule, &raftv1.DeleteRule{Name: "gone", Principal: "p", TimeUnixNs: t0})
	for _, tc := range []struct {
		at   time.Duration
		kept bool
	}{{time.Hour, true}, {DeletedHistoryRetention, true}, {DeletedHistoryRetention + time.Second, false}} {
		t.Run(fmt.Sprint(tc.at), func(t *testing.T) {
			putAt("other", 1, t0+int64(tc.at))
			if got := len(f.state.Load().History.versions("gone")) > 0; got != tc.kept {
				t.Errorf("history of the deleted rule kept %v, want %v", got, tc.kept)
			}
		})
	}
}
