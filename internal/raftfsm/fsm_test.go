package raftfsm

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
)

func tbRule(name string, limit int64) *rule.Rule {
	return &rule.Rule{Name: name, Algorithm: bucket.TokenBucket, Limit: limit, Period: time.Second}
}

// applyAt applies an entry at index i and returns the FSM's answer.
func applyAt(t *testing.T, f *FSM, i uint64, typ byte, v any) applyResult {
	t.Helper()
	data, err := encode(typ, v)
	if err != nil {
		t.Fatal(err)
	}
	res, _ := f.Apply(&raft.Log{Index: i, Type: raft.LogCommand, Data: data}).(applyResult)
	return res
}

func u64(v uint64) *uint64 { return &v }

func TestFSMRules(t *testing.T) {
	f := NewFSM()
	res := applyAt(t, f, 5, entryPutRule, putRuleEntry{Rule: tbRule("api", 10), Expected: u64(0)})
	if res.err != nil || res.rule.Version != 5 || res.rule.Generation != 5 {
		t.Fatalf("put: %+v", res)
	}
	if res := applyAt(t, f, 6, entryPutRule, putRuleEntry{Rule: tbRule("api", 20), Expected: u64(4)}); !errors.Is(res.err, rule.ErrVersionMismatch) {
		t.Fatalf("stale put: %+v", res)
	}
	if f.Table().Get("api").Rule.Limit != 10 {
		t.Fatal("a refused put changed the table")
	}
	res = applyAt(t, f, 7, entryPutRule, putRuleEntry{Rule: tbRule("api", 20), Expected: u64(5)})
	if res.err != nil || res.rule.Version != 7 || res.rule.Generation != 5 {
		t.Fatalf("update: %+v", res)
	}
	bad := tbRule("api", -1)
	if res := applyAt(t, f, 8, entryPutRule, putRuleEntry{Rule: bad}); !errors.Is(res.err, rule.ErrInvalid) {
		t.Fatalf("invalid rule applied: %+v", res)
	}
	if res := applyAt(t, f, 9, entryDeleteRule, deleteRuleEntry{Name: "nope"}); !errors.Is(res.err, rule.ErrNotFound) {
		t.Fatalf("delete missing: %+v", res)
	}
	if res := applyAt(t, f, 10, entryDeleteRule, deleteRuleEntry{Name: "api"}); res.err != nil {
		t.Fatal(res.err)
	}
	if f.Table().Len() != 0 || f.AppliedIndex() != 10 || f.Table().Version != 10 {
		t.Fatalf("after delete: %d rules, applied %d, table version %d", f.Table().Len(), f.AppliedIndex(), f.Table().Version)
	}
}

func TestFSMUnknownEntry(t *testing.T) {
	f := NewFSM()
	f.Apply(&raft.Log{Index: 1, Type: raft.LogCommand, Data: []byte{0x7f | ignoreUnknown, '{', '}'}})
	if f.AppliedIndex() != 1 {
		t.Fatal("an ignorable unknown entry was not skipped")
	}
	defer func() {
		if recover() == nil {
			t.Fatal("an unknown entry type did not stop the node")
		}
	}()
	f.Apply(&raft.Log{Index: 2, Type: raft.LogCommand, Data: []byte{0x7f}})
}

func TestFSMViewAndMembers(t *testing.T) {
	f := NewFSM()
	changed := f.ViewChanged()
	applyAt(t, f, 1, entrySetMember, memberEntry{Member: memberInfo{ID: "b", GRPCAddr: "127.0.0.1:2", RaftAddr: "127.0.0.1:12"}})
	applyAt(t, f, 2, entrySetMember, memberEntry{Member: memberInfo{ID: "a", GRPCAddr: "127.0.0.1:1", RaftAddr: "127.0.0.1:11"}})
	applyAt(t, f, 3, entrySetView, viewEntry{Live: []string{"b", "a"}})
	select {
	case <-changed:
	default:
		t.Fatal("view change not signalled")
	}
	v := f.View()
	if v.Epoch != 3 || v.Len() != 2 || v.Members()[0].ID != "a" {
		t.Fatalf("view %+v", v.Members())
	}
	if !f.members()["a"].WasLive {
		t.Fatal("a member in the view is not marked as having been live")
	}
	applyAt(t, f, 4, entryRemoveMember, memberEntry{Member: memberInfo{ID: "a"}})
	if v := f.View(); v.Epoch != 4 || v.Len() != 1 {
		t.Fatalf("after removing a: epoch %d, %d members", v.Epoch, v.Len())
	}
}

func TestFSMSnapshotRestore(t *testing.T) {
	f := NewFSM()
	applyAt(t, f, 1, entryPutRule, putRuleEntry{Rule: tbRule("api", 10)})
	r := tbRule("vip", 5)
	r.Overrides = []rule.Override{{Key: "k", Limit: 50}}
	r.Fallback = rule.Fallback{Policy: rule.FallbackLocal, Limit: 2}
	applyAt(t, f, 2, entryPutRule, putRuleEntry{Rule: r})
	applyAt(t, f, 3, entrySetMember, memberEntry{Member: memberInfo{ID: "a", GRPCAddr: "g", RaftAddr: "r"}})
	applyAt(t, f, 4, entrySetView, viewEntry{Live: []string{"a"}})
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	g := NewFSM()
	if err := g.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
		t.Fatal(err)
	}
	if g.AppliedIndex() != 4 || g.Table().Len() != 2 || g.View().Epoch != 4 || g.View().Len() != 1 {
		t.Fatalf("restored: applied %d, %d rules, view %+v", g.AppliedIndex(), g.Table().Len(), g.View())
	}
	got := g.Table().Get("vip").Rule
	if got.Overrides[0].Limit != 50 || got.Fallback.Limit != 2 || got.Version != 2 {
		t.Fatalf("restored rule %+v", got)
	}
	if err := g.Restore(io.NopCloser(bytes.NewReader([]byte("{not json")))); err == nil {
		t.Fatal("a corrupt snapshot restored")
	}
}

type memSink struct{ bytes.Buffer }

func (s *memSink) ID() string    { return "mem" }
func (s *memSink) Cancel() error { return nil }
func (s *memSink) Close() error  { return nil }
