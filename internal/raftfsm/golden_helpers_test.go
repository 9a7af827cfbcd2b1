package raftfsm

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"testing"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/tokenserver/tokenserver/internal/rulepb"
)

// goldenEntry is one line of a golden log file: a raft log entry with its
// data in base64 (encoding/json's []byte form).
type goldenEntry struct {
	Index uint64       `json:"index"`
	Term  uint64       `json:"term"`
	Type  raft.LogType `json:"type"`
	Data  []byte       `json:"data"`
}

// readGoldenLog reads a golden log file, one entry per line.
func readGoldenLog(t testing.TB, path string) []*raft.Log {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var logs []*raft.Log
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var e goldenEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		logs = append(logs, &raft.Log{Index: e.Index, Term: e.Term, Type: e.Type, Data: e.Data})
	}
	return logs
}

// writeGoldenLog writes logs in the form readGoldenLog reads.
func writeGoldenLog(t testing.TB, path string, logs []*raft.Log) {
	t.Helper()
	var buf bytes.Buffer
	for _, l := range logs {
		b, err := json.Marshal(goldenEntry{Index: l.Index, Term: l.Term, Type: l.Type, Data: l.Data})
		if err != nil {
			t.Fatal(err)
		}
		buf.Write(b)
		buf.WriteByte('\n')
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// stateDump is the replicated state in a form that does not depend on the
// FSM's Go types: rules as tokenserver.v1.Rule JSON, members and the view.
// The table's Version is left out: after a replay it is the index of the
// last rule change, after a restore the snapshot's index.
type stateDump struct {
	AppliedIndex uint64            `json:"applied_index"`
	Rules        []json.RawMessage `json:"rules"`
	Members      []memberDump      `json:"members"`
	Live         []string          `json:"live"`
	ViewEpoch    uint64            `json:"view_epoch"`
	View         []string          `json:"view"`
}

type memberDump struct {
	ID       string `json:"id"`
	GRPCAddr string `json:"grpc_addr"`
	RaftAddr string `json:"raft_addr"`
	WasLive  bool   `json:"was_live"`
	Draining bool   `json:"draining"`
}

// dumpState returns f's state as indented JSON, stable across runs.
func dumpState(t testing.TB, f *FSM) []byte {
	t.Helper()
	d := stateDump{AppliedIndex: f.AppliedIndex(), Live: append([]string{}, f.live()...), ViewEpoch: f.View().Epoch, Rules: []json.RawMessage{}, Members: []memberDump{}, View: []string{}}
	for _, r := range f.Table().Rules() {
		b, err := protojson.Marshal(rulepb.ToProto(r))
		if err != nil {
			t.Fatal(err)
		}
		var c bytes.Buffer
		if err := json.Compact(&c, b); err != nil {
			t.Fatal(err)
		}
		d.Rules = append(d.Rules, c.Bytes())
	}
	for _, m := range f.members() {
		d.Members = append(d.Members, memberDump(m))
	}
	sort.Slice(d.Members, func(i, j int) bool { return d.Members[i].ID < d.Members[j].ID })
	for _, m := range f.View().Members() {
		d.View = append(d.View, fmt.Sprintf("%s=%s/%s", m.ID, m.GRPCAddr, m.RaftAddr))
	}
	b, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(b, '\n')
}
