package raftfsm

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// FuzzDecodeEntry: the log entry decoder never panics; an entry it accepts
// applies to a fresh state without panicking, and a rule it stores
// validates.
func FuzzDecodeEntry(f *testing.F) {
	r := &rule.Rule{Name: "api", Algorithm: bucket.TokenBucket, Limit: 10, Period: time.Second}
	for _, e := range []struct {
		t byte
		v any
	}{
		{entryPutRule, putRuleEntry{Rule: r}},
		{entryDeleteRule, deleteRuleEntry{Name: "api"}},
		{entrySetMember, memberEntry{Member: memberInfo{ID: "n1", GRPCAddr: "a:1", RaftAddr: "a:2"}}},
		{entrySetView, viewEntry{Live: []string{"n1"}}},
		{entryRestoreRules, restoreEntry{Rules: []*rule.Rule{r}}},
	} {
		b, err := encode(e.t, e.v)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{entryPutRule, '{', '}'})
	f.Add([]byte{entryPutRule | ignoreUnknown})
	f.Add([]byte(`\x01{"rule":{"name":"a","algorithm":1,"limit":9223372036854775807,"period":1}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		_, e, err := decodeEntry(data)
		if err != nil || e == nil {
			return
		}
		s := newState()
		s.apply(7, e)
		for name, r := range s.Rules {
			if r.Name != name {
				t.Fatalf("rule %q stored under %q", r.Name, name)
			}
			if err := r.Validate(); err != nil {
				t.Fatalf("applied an invalid rule: %v", err)
			}
		}
	})
}

// FuzzRestore: a snapshot restore never panics, and a restored state holds
// only rules filed under their own name.
func FuzzRestore(f *testing.F) {
	st := newState()
	st.Rules["api"] = &rule.Rule{Name: "api", Algorithm: bucket.TokenBucket, Limit: 10, Period: time.Second, Version: 3, Generation: 3}
	st.Members["n1"] = memberInfo{ID: "n1", GRPCAddr: "a:1", RaftAddr: "a:2"}
	st.Live = []string{"n1"}
	b, _ := json.Marshal(st)
	f.Add(b)
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
// replica's own --max-rules: every replica decides alike.
func TestApplyMaxRules(t *testing.T) {
	defer rule.SetMaxRules(0)
	rule.SetMaxRules(1000) // this replica's flag does not matter
	fsm := NewFSM()
	put := func(i uint64, name string) error {
		b, err := encode(entryPutRule, putRuleEntry{Rule: &rule.Rule{Name: name, Algorithm: bucket.TokenBucket, Limit: 1, Period: time.Second}, MaxRules: 2})
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

// BenchmarkApplyPut is the FSM side of one PutRule (decode, validate,
// apply, publish the table) with 10 and 10,000 rules.
func BenchmarkApplyPut(b *testing.B) {
	for _, n := range []int{10, 10_000} {
		b.Run(fmt.Sprintf("rules=%d", n), func(b *testing.B) {
			fsm := NewFSM()
			idx := uint64(0)
			put := func(name string, limit int64) {
				idx++
				e, err := encode(entryPutRule, putRuleEntry{Rule: &rule.Rule{Name: name, Algorithm: bucket.TokenBucket, Limit: limit, Period: time.Second}})
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
