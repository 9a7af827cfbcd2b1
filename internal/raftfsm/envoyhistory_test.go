package raftfsm

import (
	"bytes"
	"io"
	"reflect"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	raftv1 "github.com/tokenserver/tokenserver/proto/tokenserver/raft/v1"
)

// TestEnvoyHistory: puts, a delete and file syncs record versions with
// principal, entry time and change, newest first; a refused write records
// nothing; a sync's dry run changes no history; the history survives a
// snapshot and restore; a domain keeps HistoryVersions versions; a deleted
// domain's history is forgotten once a later write is past the retention.
func TestEnvoyHistory(t *testing.T) {
	f := NewFSM()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	at := func(d time.Duration) int64 { return t0.Add(d).UnixNano() }
	index := uint64(0)
	apply := func(typ byte, m any) applyResult {
		t.Helper()
		var b []byte
		var err error
		switch m := m.(type) {
		case *raftv1.PutEnvoyDomain:
			b, err = encodeEntry(typ, m)
		case *raftv1.DeleteEnvoyDomain:
			b, err = encodeEntry(typ, m)
		case *raftv1.SyncEnvoyDomains:
			b, err = encodeEntry(typ, m)
		}
		if err != nil {
			t.Fatal(err)
		}
		index++
		res, _ := f.Apply(&raft.Log{Index: index, Type: raft.LogCommand, Data: b}).(applyResult)
		return res
	}
	d := func(name, yaml, author string) *raftv1.EnvoyDomain {
		return &raftv1.EnvoyDomain{Name: name, Yaml: yaml, Author: author, Source: name + ".yaml"}
	}
	apply(entryPutEnvoyDomain, &raftv1.PutEnvoyDomain{Domain: d("api", "domain: api\n", "alice"), TimeUnixNs: at(0)})                                        // 1
	apply(entryPutEnvoyDomain, &raftv1.PutEnvoyDomain{Domain: d("api", "domain: api\n# v2\n", "bob"), TimeUnixNs: at(time.Minute)})                          // 2
	if res := apply(entryPutEnvoyDomain, &raftv1.PutEnvoyDomain{Domain: d("api", "x", "eve"), ExpectedVersion: u64(1), TimeUnixNs: at(0)}); res.err == nil { // 3
		t.Fatal("a stale compare-and-set was applied")
	}
	apply(entrySyncEnvoyDomains, &raftv1.SyncEnvoyDomains{Origin: "file:", Domains: []*raftv1.EnvoyDomain{d("edge", "domain: edge\n", "file:edge.yaml")}, TimeUnixNs: at(2 * time.Minute)}) // 4
	apply(entrySyncEnvoyDomains, &raftv1.SyncEnvoyDomains{Origin: "file:", TimeUnixNs: at(3 * time.Minute)})                                                                                // 5: drops edge
	apply(entryDeleteEnvoyDomain, &raftv1.DeleteEnvoyDomain{Name: "api", Principal: "carol", TimeUnixNs: at(4 * time.Minute)})                                                              // 6

	type ver struct {
		version   uint64
		principal string
		change    string
		time      time.Duration
		yaml      string // "" for a deletion
	}
	check := func(f *FSM, name string, want []ver) {
		t.Helper()
		got := f.state.Load().envoyDomainHistory(name)
		if len(got) != len(want) {
			t.Fatalf("%s: %d versions %+v, want %d", name, len(got), got, len(want))
		}
		for i, w := range want {
			g := got[i]
			yaml := ""
			if g.Domain != nil {
				yaml = g.Domain.YAML
			}
			if g.Version != w.version || g.Principal != w.principal || g.Change != w.change || !g.Time.Equal(t0.Add(w.time)) || yaml != w.yaml {
				t.Errorf("%s version %d: %+v, want %+v", name, i, g, w)
			}
		}
	}
	wantAPI := []ver{{6, "carol", ChangeDelete, 4 * time.Minute, ""}, {2, "bob", ChangePut, time.Minute, "domain: api\n# v2\n"}, {1, "alice", ChangePut, 0, "domain: api\n"}}
	wantEdge := []ver{{5, "file:", ChangeSync, 3 * time.Minute, ""}, {4, "file:edge.yaml", ChangeSync, 2 * time.Minute, "domain: edge\n"}}
	check(f, "api", wantAPI)
	check(f, "edge", wantEdge)

	// A dry run of a sync changes no history.
	envoySyncChanges(f.state.Load(), "file:", []EnvoyDomain{{Name: "edge", YAML: "domain: edge\n", Author: "file:edge.yaml"}})
	check(f, "edge", wantEdge)

	snap, err := encodeSnapshot(f.state.Load())
	if err != nil {
		t.Fatal(err)
	}
	g := NewFSM()
	if err := g.Restore(io.NopCloser(bytes.NewReader(snap))); err != nil {
		t.Fatal(err)
	}
	check(g, "api", wantAPI)
	check(g, "edge", wantEdge)
	if !reflect.DeepEqual(g.state.Load().EnvoyHistory, f.state.Load().EnvoyHistory) {
		t.Fatal("restored histories differ")
	}
	if again, err := encodeSnapshot(g.state.Load()); err != nil || !bytes.Equal(again, snap) {
		t.Fatalf("a restored snapshot encodes differently (%v)", err)
	}

	// At most HistoryVersions versions; the oldest go first.
	for range HistoryVersions + 3 {
		apply(entryPutEnvoyDomain, &raftv1.PutEnvoyDomain{Domain: d("busy", "domain: busy\n", "alice"), TimeUnixNs: at(5 * time.Minute)})
	}
	busy := f.state.Load().envoyDomainHistory("busy")
	if len(busy) != HistoryVersions || busy[0].Version != index || busy[len(busy)-1].Version != index-HistoryVersions+1 {
		t.Fatalf("busy: %d versions from %d to %d, want %d from %d", len(busy), busy[len(busy)-1].Version, busy[0].Version, HistoryVersions, index)
	}

	// Past the retention, a write forgets the deleted domains' history,
	// and keeps the live ones'.
	apply(entryPutEnvoyDomain, &raftv1.PutEnvoyDomain{Domain: d("late", "domain: late\n", "alice"), TimeUnixNs: at(4*time.Minute + DeletedHistoryRetention + time.Second)})
	if h := f.state.Load().envoyDomainHistory("api"); h != nil {
		t.Errorf("api deleted past the retention still has %d versions", len(h))
	}
	if h := f.state.Load().envoyDomainHistory("busy"); len(h) != HistoryVersions {
		t.Errorf("busy lost its history: %d versions", len(h))
	}
}

// TestEnvoyHistoryOldEntries: entries of releases before the history (no
// time, no principal on a delete) still record versions, with zero time.
func TestEnvoyHistoryOldEntries(t *testing.T) {
	f := NewFSM()
	for i, e := range envoyGoldenEntries(t) {
		f.Apply(&raft.Log{Index: uint64(i + 1), Type: raft.LogCommand, Data: e})
	}
	h := f.state.Load().envoyDomainHistory("tmp")
	if len(h) != 2 || h[0].Change != ChangeDelete || h[1].Change != ChangePut || !h[0].Time.IsZero() || h[1].Principal != "alice" {
		t.Fatalf("tmp: %+v, want its put by alice and its deletion, without time", h)
	}
}
