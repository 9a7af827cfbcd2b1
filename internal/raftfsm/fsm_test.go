package raftfsm

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
	raftv1 "github.com/tokenserver/tokenserver/proto/tokenserver/raft/v1"
)

func tbRule(name string, limit int64) *rule.Rule {
	return &rule.Rule{Name: name, Algorithm: bucket.TokenBucket, Limit: limit, Period: time.Second}
}

// applyAt applies an entry at index i and returns the FSM's answer.
func applyAt(t *testing.T, f *FSM, i uint64, typ byte, m proto.Message) applyResult {
	t.Helper()
	data, err := encodeEntry(typ, m)
	if err != nil {
		t.Fatal(err)
	}
	res, _ := f.Apply(&raft.Log{Index: i, Type: raft.LogCommand, Data: data}).(applyResult)
	return res
}

func u64(v uint64) *uint64 { return &v }

// putEntry is the put-rule entry of r.
func putEntry(r *rule.Rule, expected *uint64, maxRules int) *raftv1.PutRule {
	return &raftv1.PutRule{Rule: ruleToPB(r), ExpectedVersion: expected, MaxRules: int64(maxRules)}
}

// memberEntry is the member entry of m.
func memberEntry(m memberInfo) *raftv1.MemberChange {
	return &raftv1.MemberChange{Member: memberToPB(m)}
}

func TestFSMRules(t *testing.T) {
	f := NewFSM()
	res := applyAt(t, f, 5, entryPutRule, putEntry(tbRule("api", 10), u64(0), 0))
	if res.err != nil || res.rule.Version != 5 || res.rule.Generation != 5 {
		t.Fatalf("put: %+v", res)
	}
	if res := applyAt(t, f, 6, entryPutRule, putEntry(tbRule("api", 20), u64(4), 0)); !errors.Is(res.err, rule.ErrVersionMismatch) {
		t.Fatalf("stale put: %+v", res)
	}
	if f.Table().Get("api").Rule.Limit != 10 {
		t.Fatal("a refused put changed the table")
	}
	res = applyAt(t, f, 7, entryPutRule, putEntry(tbRule("api", 20), u64(5), 0))
	if res.err != nil || res.rule.Version != 7 || res.rule.Generation != 5 {
		t.Fatalf("update: %+v", res)
	}
	if res := applyAt(t, f, 9, entryDeleteRule, &raftv1.DeleteRule{Name: "nope"}); !errors.Is(res.err, rule.ErrNotFound) {
		t.Fatalf("delete missing: %+v", res)
	}
	if res := applyAt(t, f, 10, entryDeleteRule, &raftv1.DeleteRule{Name: "api"}); res.err != nil {
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
	applyAt(t, f, 1, entrySetMember, memberEntry(memberInfo{ID: "b", GRPCAddr: "127.0.0.1:2", RaftAddr: "127.0.0.1:12"}))
	applyAt(t, f, 2, entrySetMember, memberEntry(memberInfo{ID: "a", GRPCAddr: "127.0.0.1:1", RaftAddr: "127.0.0.1:11"}))
	applyAt(t, f, 3, entrySetView, &raftv1.SetView{Live: []string{"b", "a"}})
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
	applyAt(t, f, 4, entryRemoveMember, memberEntry(memberInfo{ID: "a"}))
	if v := f.View(); v.Epoch != 4 || v.Len() != 1 {
		t.Fatalf("after removing a: epoch %d, %d members", v.Epoch, v.Len())
	}
}

func TestFSMSnapshotRestore(t *testing.T) {
	f := NewFSM()
	applyAt(t, f, 1, entryPutRule, putEntry(tbRule("api", 10), nil, 0))
	r := tbRule("vip", 5)
	r.Overrides = []rule.Override{{Key: "k", Limit: 50}}
	r.Fallback = rule.Fallback{Policy: rule.FallbackLocal, Limit: 2}
	applyAt(t, f, 2, entryPutRule, putEntry(r, nil, 0))
	applyAt(t, f, 3, entrySetMember, memberEntry(memberInfo{ID: "a", GRPCAddr: "g", RaftAddr: "r"}))
	applyAt(t, f, 4, entrySetView, &raftv1.SetView{Live: []string{"a"}})
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
