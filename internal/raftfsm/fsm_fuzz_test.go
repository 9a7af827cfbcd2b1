package raftfsm

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
	raftv1 "github.com/tokenserver/tokenserver/proto/tokenserver/raft/v1"
)

// FuzzDecodeEntry: the log entry decoder never panics, in either format;
// an entry it accepts applies to a fresh state without panicking, and
// every rule it stores is filed under its own name at the entry's index.
// (Apply does not validate: a rule is validated where it enters the log.)
func FuzzDecodeEntry(f *testing.F) {
	r := &rule.Rule{Name: "api", Algorithm: bucket.TokenBucket, Limit: 10, Period: time.Second,
		Overrides: []rule.Override{{Key: "k", Limit: 5}}, Deny: []string{"d"}}
	for _, e := range []struct {
		t byte
		m proto.Message
	}{
		{entryPutRule, putEntry(r, u64(0), 10)},
		{entryDeleteRule, &raftv1.DeleteRule{Name: "api", ExpectedVersion: u64(3)}},
		{entrySetMember, memberEntry(memberInfo{ID: "n1", GRPCAddr: "a:1", RaftAddr: "a:2"})},
		{entryRemoveMember, memberEntry(memberInfo{ID: "n1"})},
		{entryDrainMember, memberEntry(memberInfo{ID: "n1"})},
		{entrySetView, &raftv1.SetView{Live: []string{"n1"}}},
		{entryRestoreRules, &raftv1.RestoreRules{Rules: []*raftv1.Rule{ruleToPB(r)}}},
	} {
		b, err := encodeEntry(e.t, e.m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	// The first release's JSON entries.
	for _, s := range []string{
		"\x01" + `{"rule":{"name":"api","algorithm":1,"limit":10,"period":1000000000},"max_rules":10}`,
		"\x01" + `{"rule":{"name":"a","algorithm":1,"limit":9223372036854775807,"period":1}}`,
		"\x02" + `{"name":"api","expected":3}`,
		"\x03" + `{"member":{"id":"n1","grpc_addr":"a:1","raft_addr":"a:2"}}`,
		"\x05" + `{"live":["n1"]}`,
		"\x06" + `{"rules":[{"name":"api","algorithm":1,"limit":10,"period":1000000000},null]}`,
		"\x07" + `{"member":{"id":"n1"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Add([]byte{entryPutRuleV0, '{', '}'})
	f.Add([]byte{entryPutRule})
	f.Add([]byte{entryPutRule | ignoreUnknown})
	f.Fuzz(func(t *testing.T, data []byte) {
		_, fn, err := decodeEntry(data)
		if err != nil || fn == nil {
			return
		}
		s := newState()
		fn(s, 7)
		for name, r := range s.Rules.All() {
			if r.Name != name {
				t.Fatalf("rule %q stored under %q", r.Name, name)
			}
			if r.Version != 7 {
				t.Fatalf("rule %q at version %d, applied at 7", name, r.Version)
			}
		}
	})
}

// FuzzRestore: a snapshot restore never panics, in either format, and a
// restored state holds only rules filed under their own name.
func FuzzRestore(f *testing.F) {
	st := newState()
	st.Index = 3
	if err := st.Rules.Put(3, &rule.Rule{Name: "api", Algorithm: bucket.TokenBucket, Limit: 10, Period: time.Second}, nil, 0); err != nil {
		f.Fatal(err)
	}
	st.Members["n1"] = memberInfo{ID: "n1", GRPCAddr: "a:1", RaftAddr: "a:2"}
	st.Live = []string{"n1"}
	b, err := encodeSnapshot(st)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add(append(snapshotMagic[:3:3], 2))
	f.Add([]byte(`{"index":3,"rules":{"api":{"name":"api","algorithm":1,"limit":10,"period":1000000000,"version":3,"generation":3}},"members":{"n1":{"id":"n1","grpc_addr":"a:1","raft_addr":"a:2"}},"live":["n1"],"view_epoch":3}`))
	f.Add([]byte(`{"rules":{"x":null}}`))
	f.Add([]byte(`{"rules":{"x":{"name":"y"}}}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		fsm := NewFSM()
		if err := fsm.Restore(io.NopCloser(bytes.NewReader(data))); err != nil {
			return
		}
		for _, r := range fsm.Table().Rules() {
			if fsm.Table().Get(r.Name).Rule != r {
				t.Fatalf("table lost rule %q", r.Name)
			}
		}
		_ = fsm.View()
	})
}

// TestApplyMaxRules: the put-rule entry is refused past the rule cap it
// carries (the proposing leader's), for new rules only, whatever this
// replica's own configuration: every replica decides alike.
func TestApplyMaxRules(t *testing.T) {
	fsm := NewFSM()
	put := func(i uint64, name string) error {
		b, err := encodeEntry(entryPutRule, putEntry(&rule.Rule{Name: name, Algorithm: bucket.TokenBucket, Limit: 1, Period: time.Second}, nil, 2))
		if err != nil {
			t.Fatal(err)
		}
		res, _ := fsm.Apply(&raft.Log{Index: i, Type: raft.LogCommand, Data: b}).(applyResult)
		return res.err
	}
	for i, name := range []string{"a", "b"} {
		if err := put(uint64(i+1), name); err != nil {
			t.Fatal(err)
		}
	}
	if err := put(3, "c"); !errors.Is(err, rule.ErrTooManyRules) {
		t.Fatalf("third rule under a cap of 2: %v", err)
	}
	if err := put(4, "a"); err != nil {
		t.Fatalf("changing an existing rule at the cap: %v", err)
	}
	if n := fsm.Table().Len(); n != 2 {
		t.Fatalf("%d rules", n)
	}
}

// BenchmarkApplyPut is the leader's work for one PutRule (normalize and
// validate at the edge, encode, decode, apply, publish the table) with 10
// and 10,000 rules.
func BenchmarkApplyPut(b *testing.B) {
	for _, n := range []int{10, 10_000} {
		b.Run(fmt.Sprintf("rules=%d", n), func(b *testing.B) {
			fsm := NewFSM()
			idx := uint64(0)
			put := func(name string, limit int64) {
				idx++
				r := &rule.Rule{Name: name, Algorithm: bucket.TokenBucket, Limit: limit, Period: time.Second}
				r.Normalize()
				if err := r.Validate(); err != nil {
					b.Fatal(err)
				}
				e, err := encodeEntry(entryPutRule, putEntry(r, nil, 0))
				if err != nil {
					b.Fatal(err)
				}
				if res, _ := fsm.Apply(&raft.Log{Index: idx, Type: raft.LogCommand, Data: e}).(applyResult); res.err != nil {
					b.Fatal(res.err)
				}
			}
			for i := range n {
				put(fmt.Sprintf("rule-%05d", i), 10)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				put("rule-00005", int64(10+i%2))
			}
		})
	}
}
