package raftfsm

import (
	"bytes"
	"io"
	"os"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
)

func TestGenV0(t *testing.T) {
	if os.Getenv("GEN_V0") == "" {
		t.Skip()
	}
	api := &rule.Rule{Name: "api", Algorithm: bucket.TokenBucket, Limit: 100, Period: time.Second, Burst: 150,
		Warmup: 10 * time.Second, Penalty: 2 * time.Second, MaxKeys: 1000,
		Overrides: []rule.Override{{Key: "vip", Limit: 1000, Burst: 2000}, {Key: "small", Limit: 5}},
		Deny:      []string{"bad", "evil"}, Allow: []string{"ops"},
		Fallback: rule.Fallback{Policy: rule.FallbackLocal, Limit: 10},
		Lease:    rule.Lease{MaxBatch: 20, TTL: 500 * time.Millisecond}, UpdatedBy: "alice"}
	api2 := api.Clone()
	api2.Limit = 200
	api2.UpdatedBy = "bob"
	win := &rule.Rule{Name: "win", Algorithm: bucket.SlidingWindow, Limit: 50, Period: time.Minute, SampleCount: 6, Shadow: true, Fallback: rule.Fallback{Policy: rule.FallbackDeny}}
	slog := &rule.Rule{Name: "log", Algorithm: bucket.SlidingLog, Limit: 10, Period: time.Second, MaxKeys: 50}
	conc := &rule.Rule{Name: "conc", Algorithm: bucket.Concurrency, Limit: 3, Period: 30 * time.Second, Fallback: rule.Fallback{Policy: rule.FallbackAllow}}
	fixed := &rule.Rule{Name: "fixed", Algorithm: bucket.FixedWindow, Limit: 7, Period: time.Hour}
	leaky := &rule.Rule{Name: "leaky", Algorithm: bucket.LeakyBucket, Limit: 5, Period: time.Second, Burst: 3}
	extra := &rule.Rule{Name: "extra.v2:x-y_z", Algorithm: bucket.TokenBucket, Limit: 1, Period: 24 * time.Hour}
	apiFixed := &rule.Rule{Name: "api", Algorithm: bucket.FixedWindow, Limit: 60, Period: time.Minute, UpdatedBy: "carol"}
	win2 := win.Clone()
	win2.Limit = 51
	type ent struct {
		t   byte
		v   any
		raw []byte
	}
	seq := []ent{
		{t: entrySetMember, v: memberEntry{Member: memberInfo{ID: "n1", GRPCAddr: "10.0.0.1:7070", RaftAddr: "10.0.0.1:7071"}}},
		{t: entrySetMember, v: memberEntry{Member: memberInfo{ID: "n2", GRPCAddr: "10.0.0.2:7070", RaftAddr: "10.0.0.2:7071"}}},
		{t: entrySetMember, v: memberEntry{Member: memberInfo{ID: "n3", GRPCAddr: "10.0.0.3:7070", RaftAddr: "10.0.0.3:7071"}}},
		{t: entrySetView, v: viewEntry{Live: []string{"n2", "n1"}}},
		{t: entryPutRule, v: putRuleEntry{Rule: api, MaxRules: 10000}},                                                            // 5
		{t: entryPutRule, v: putRuleEntry{Rule: win, MaxRules: 10000}},                                                            // 6
		{t: entryPutRule, v: putRuleEntry{Rule: slog, MaxRules: 10000}},                                                           // 7
		{t: entryPutRule, v: putRuleEntry{Rule: conc, Expected: u64(0), MaxRules: 4}},                                             // 8
		{t: entryPutRule, v: putRuleEntry{Rule: api2, Expected: u64(5), MaxRules: 4}},                                             // 9: same generation
		{t: entryPutRule, v: putRuleEntry{Rule: win2, Expected: u64(3), MaxRules: 4}},                                             // 10: CAS refused
		{t: entryPutRule, v: putRuleEntry{Rule: fixed, MaxRules: 4}},                                                              // 11: cap refused
		{t: entryDeleteRule, v: deleteRuleEntry{Name: "log", Expected: u64(7)}},                                                   // 12
		{t: entryPutRule, v: putRuleEntry{Rule: leaky, MaxRules: 4}},                                                              // 13
		{t: entryPutRule, v: putRuleEntry{Rule: apiFixed}},                                                                        // 14: new generation
		{t: entryDeleteRule, v: deleteRuleEntry{Name: "nope"}},                                                                    // 15: not found
		{raw: []byte{0x90, '{', '}'}},                                                                                             // 16: ignorable unknown
		{t: entryDrainMember, v: memberEntry{Member: memberInfo{ID: "n2"}}},                                                       // 17
		{t: entrySetView, v: viewEntry{Live: []string{"n3", "n1"}}},                                                               // 18
		{t: entryRemoveMember, v: memberEntry{Member: memberInfo{ID: "n3"}}},                                                      // 19
		{t: entrySetMember, v: memberEntry{Member: memberInfo{ID: "n2", GRPCAddr: "10.0.0.22:7070", RaftAddr: "10.0.0.22:7071"}}}, // 20
		{t: entryDeleteRule, v: deleteRuleEntry{Name: "conc", Expected: u64(1)}},                                                  // 21: CAS refused
		{t: entryRestoreRules, v: restoreEntry{Rules: []*rule.Rule{win, extra}}},                                                  // 22
		{t: entryPutRule, v: putRuleEntry{Rule: fixed, MaxRules: 4}},                                                              // 23
		{t: entryPutRule, v: putRuleEntry{Rule: api, Expected: u64(0)}},                                                           // 24
		{t: entryPutRule, v: putRuleEntry{Rule: win2, Expected: u64(22)}},                                                         // 25: same generation as the restore
		{t: entryDeleteRule, v: deleteRuleEntry{Name: "extra.v2:x-y_z"}},                                                          // 26
		{t: entryPutRule, v: putRuleEntry{Rule: conc, MaxRules: 3}},                                                               // 27: cap refused (3 rules)
		{t: entrySetView, v: viewEntry{Live: []string{"n1", "n2"}}},                                                               // 28
	}
	f := NewFSM()
	var logs []*raft.Log
	var snapBytes []byte
	for i, e := range seq {
		data := e.raw
		if data == nil {
			var err error
			if data, err = encode(e.t, e.v); err != nil {
				t.Fatal(err)
			}
		}
		l := &raft.Log{Index: uint64(i + 1), Term: 2, Type: raft.LogCommand, Data: data}
		res, _ := f.Apply(l).(applyResult)
		t.Logf("%d: %v", l.Index, res.err)
		logs = append(logs, l)
	}
	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	snapBytes = sink.Bytes()
	want := dumpState(t, f)
	g := NewFSM()
	if err := g.Restore(io.NopCloser(bytes.NewReader(snapBytes))); err != nil {
		t.Fatal(err)
	}
	if got := dumpState(t, g); !bytes.Equal(got, want) {
		t.Fatalf("restored %s\nwant %s", got, want)
	}
	writeGoldenLog(t, "testdata/golden/v0.log.jsonl", logs)
	os.WriteFile("testdata/golden/v0.snapshot", snapBytes, 0o644)
	os.WriteFile("testdata/golden/expected.json", want, 0o644)
}
