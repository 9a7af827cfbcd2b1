package raftfsm

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
	raftv1 "github.com/tokenserver/tokenserver/proto/tokenserver/raft/v1"
)

// updateGolden rewrites the v1 fixtures from the v0 log (-update-golden).
// The v0 fixtures were made by the first release's code and never change.
var updateGolden = flag.Bool("update-golden", false, "rewrite testdata/golden/v1.* from v0.log.jsonl")

// updateGoldenV2 rewrites v2.snapshot, the v1 log's state with its rule
// history (-update-golden-v2).
var updateGoldenV2 = flag.Bool("update-golden-v2", false, "rewrite testdata/golden/v2.snapshot from v1.log.jsonl")

const goldenDir = "testdata/golden/"

// replay applies logs to a new FSM and returns it.
func replay(t *testing.T, logs []*raft.Log) *FSM {
	t.Helper()
	f := NewFSM()
	for _, l := range logs {
		f.Apply(l)
	}
	return f
}

// restore restores the snapshot in path into a new FSM.
func restore(t *testing.T, path string) *FSM {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f := NewFSM()
	if err := f.Restore(io.NopCloser(bytes.NewReader(b))); err != nil {
		t.Fatalf("restore %s: %v", path, err)
	}
	return f
}

// TestGolden: the pinned logs and snapshots of each format, and a log
// that an upgrade leaves (v0 entries, then v1), yield the pinned state.
// Puts, CAS refusals, the cap carried in the entry, deletes, a restore,
// members, drains, views and an ignorable unknown entry are in them.
func TestGolden(t *testing.T) {
	if *updateGolden {
		writeV1Fixtures(t)
	}
	want, err := os.ReadFile(goldenDir + "expected.json")
	if err != nil {
		t.Fatal(err)
	}
	v0 := readGoldenLog(t, goldenDir+"v0.log.jsonl")
	v1 := readGoldenLog(t, goldenDir+"v1.log.jsonl")
	if len(v0) != len(v1) {
		t.Fatalf("v0 log has %d entries, v1 %d", len(v0), len(v1))
	}
	upgrade := append(append([]*raft.Log(nil), v0[:len(v0)/2]...), v1[len(v1)/2:]...)
	for _, tc := range []struct {
		name string
		fsm  func() *FSM
	}{
		{"v0 log", func() *FSM { return replay(t, v0) }},
		{"v1 log", func() *FSM { return replay(t, v1) }},
		{"v0 then v1 log", func() *FSM { return replay(t, upgrade) }},
		{"v0 snapshot", func() *FSM { return restore(t, goldenDir+"v0.snapshot") }},
		{"v1 snapshot", func() *FSM { return restore(t, goldenDir+"v1.snapshot") }},
		{"v2 snapshot", func() *FSM { return restore(t, goldenDir+"v2.snapshot") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := dumpState(t, tc.fsm()); !bytes.Equal(got, want) {
				t.Fatalf("state:\n%s\nwant (expected.json):\n%s", got, want)
			}
		})
	}
	t.Run("v2 snapshot bytes", func(t *testing.T) {
		// The format is deterministic: the state of the v1 log persists
		// to the pinned bytes. v1.snapshot, pinned before snapshots held
		// rule history, still restores (above); v2.snapshot adds it.
		if *updateGoldenV2 {
			if err := os.WriteFile(goldenDir+"v2.snapshot", persist(t, replay(t, v1)), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		pinned, err := os.ReadFile(goldenDir + "v2.snapshot")
		if err != nil {
			t.Fatal(err)
		}
		if got := persist(t, replay(t, v1)); !bytes.Equal(got, pinned) {
			t.Fatal("the v1 log's state does not persist to the pinned v2 snapshot")
		}
	})
}

// persist returns the bytes of f's snapshot.
func persist(t *testing.T, f *FSM) []byte {
	t.Helper()
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	return sink.Bytes()
}

// writeV1Fixtures converts the v0 log entry by entry into v1 entries and
// writes it, with the snapshot of its state.
func writeV1Fixtures(t *testing.T) {
	t.Helper()
	v0 := readGoldenLog(t, goldenDir+"v0.log.jsonl")
	var v1 []*raft.Log
	for _, l := range v0 {
		typ, payload := l.Data[0], l.Data[1:]
		var m proto.Message
		var err error
		switch typ {
		case entryPutRuleV0:
			var e putRule
			if e, err = decodePutRuleV0(payload); err == nil {
				m = putEntry(e.rule, e.expected, e.maxRules)
			}
		case entryDeleteRuleV0:
			var e deleteRule
			if e, err = decodeDeleteRuleV0(payload); err == nil {
				m = &raftv1.DeleteRule{Name: e.name, ExpectedVersion: e.expected}
			}
		case entrySetMemberV0, entryRemoveMemberV0, entryDrainMemberV0:
			var mi memberInfo
			if mi, err = decodeMemberV0(payload); err == nil {
				m = memberEntry(mi)
			}
		case entrySetViewV0:
			var e setView
			if e, err = decodeSetViewV0(payload); err == nil {
				m = &raftv1.SetView{Live: e.live}
			}
		case entryRestoreRulesV0:
			var e restoreRules
			if e, err = decodeRestoreRulesV0(payload); err == nil {
				rm := &raftv1.RestoreRules{}
				for _, r := range e.rules {
					rm.Rules = append(rm.Rules, ruleToPB(r))
				}
				m = rm
			}
		default: // an ignorable entry of a newer release stays as it is
			v1 = append(v1, l)
			continue
		}
		if err != nil {
			t.Fatalf("entry %d: %v", l.Index, err)
		}
		data, err := encodeEntry(typ|0x10, m)
		if err != nil {
			t.Fatal(err)
		}
		v1 = append(v1, &raft.Log{Index: l.Index, Term: l.Term, Type: l.Type, Data: data})
	}
	writeGoldenLog(t, goldenDir+"v1.log.jsonl", v1)
	if err := os.WriteFile(goldenDir+"v1.snapshot", persist(t, replay(t, v1)), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestReplayDoesNotValidate: a committed entry holding a rule that this
// release's Validate refuses is applied all the same, in either format,
// so that tightening Validate cannot change what a replayed log yields
// (replicas of different releases would diverge otherwise).
func TestReplayDoesNotValidate(t *testing.T) {
	bad := []*rule.Rule{
		{Name: "negative", Algorithm: bucket.TokenBucket, Limit: -1, Period: time.Second},
		{Name: "no period", Algorithm: bucket.FixedWindow, Limit: 5},
		{Name: "huge", Algorithm: bucket.SlidingLog, Limit: 1 << 40, Period: time.Second},
	}
	for _, r := range bad {
		if err := r.Validate(); !errors.Is(err, rule.ErrInvalid) {
			t.Fatalf("Validate accepts %q (%v): the test needs rules it refuses", r.Name, err)
		}
	}
	v0Entry := func(r *rule.Rule) []byte {
		return []byte("\x01" + `{"rule":{"name":"` + r.Name + `","algorithm":` + strconv.Itoa(int(r.Algorithm)) +
			`,"limit":` + strconv.FormatInt(r.Limit, 10) + `,"period":` + strconv.FormatInt(int64(r.Period), 10) + `}}`)
	}
	v1Entry := func(r *rule.Rule) []byte {
		b, err := encodeEntry(entryPutRule, putEntry(r, nil, 0))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, format := range []struct {
		name  string
		entry func(*rule.Rule) []byte
	}{{"v0", v0Entry}, {"v1", v1Entry}} {
		t.Run(format.name, func(t *testing.T) {
			f := NewFSM()
			for i, r := range bad {
				res, _ := f.Apply(&raft.Log{Index: uint64(i + 1), Type: raft.LogCommand, Data: format.entry(r)}).(applyResult)
				if res.err != nil {
					t.Fatalf("%q: %v", r.Name, res.err)
				}
			}
			for i, r := range bad {
				got := f.Table().Get(r.Name)
				if got == nil || got.Rule.Limit != r.Limit || got.Rule.Period != r.Period || got.Rule.Version != uint64(i+1) {
					t.Fatalf("%q not applied as committed: %+v", r.Name, got)
				}
			}
		})
	}
}
