package raftfsm

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/tokenserver/tokenserver/internal/rule"
	raftv1 "github.com/tokenserver/tokenserver/proto/tokenserver/raft/v1"
)

// envoyGoldenEntries are the Envoy entries of testdata/golden/envoy.log.hex:
// puts, a CAS refusal, a delete, syncs of the file origin that add, keep,
// change and drop domains, and one that changes nothing.
func envoyGoldenEntries(t *testing.T) [][]byte {
	t.Helper()
	var out [][]byte
	add := func(typ byte, m any) {
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
		out = append(out, b)
	}
	d := func(name, yaml, author string) *raftv1.EnvoyDomain {
		return &raftv1.EnvoyDomain{Name: name, Yaml: yaml, Author: author, Source: name + ".yaml"}
	}
	add(entryPutEnvoyDomain, &raftv1.PutEnvoyDomain{Domain: d("api", "domain: api\n", "alice")})
	add(entryPutEnvoyDomain, &raftv1.PutEnvoyDomain{Domain: d("api", "domain: api\n# v2\n", "bob"), ExpectedVersion: u64(7)}) // refused
	add(entryPutEnvoyDomain, &raftv1.PutEnvoyDomain{Domain: d("tmp", "domain: tmp\n", "alice"), ExpectedVersion: u64(0)})
	add(entryDeleteEnvoyDomain, &raftv1.DeleteEnvoyDomain{Name: "tmp", ExpectedVersion: u64(3)})
	add(entrySyncEnvoyDomains, &raftv1.SyncEnvoyDomains{Origin: "file:", Domains: []*raftv1.EnvoyDomain{
		d("edge", "domain: edge\n", "file:edge.yaml"), d("mongo", "domain: mongo\n", "file:mongo.yaml")}})
	add(entrySyncEnvoyDomains, &raftv1.SyncEnvoyDomains{Origin: "file:", Domains: []*raftv1.EnvoyDomain{
		d("edge", "domain: edge\n", "file:edge.yaml"), d("web", "domain: web\n", "file:web.yaml")}})
	add(entrySyncEnvoyDomains, &raftv1.SyncEnvoyDomains{Origin: "file:", Domains: []*raftv1.EnvoyDomain{
		d("edge", "domain: edge\n", "file:edge.yaml"), d("web", "domain: web\n", "file:web.yaml")}})
	return out
}

type envoyDump struct {
	Index   uint64
	Domains []EnvoyDomain
}

func dumpEnvoy(t *testing.T, f *FSM) []byte {
	t.Helper()
	ds := f.EnvoyDomains()
	b, err := json.MarshalIndent(envoyDump(ds), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(b, '\n')
}

// TestEnvoyGolden: the pinned Envoy entries encode as this release encodes
// them, and replayed, or restored from a snapshot, yield the pinned state.
func TestEnvoyGolden(t *testing.T) {
	entries := envoyGoldenEntries(t)
	var hexLines strings.Builder
	for _, e := range entries {
		hexLines.WriteString(hex.EncodeToString(e) + "\n")
	}
	if *updateGolden {
		if err := os.WriteFile(goldenDir+"envoy.log.hex", []byte(hexLines.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	pinned, err := os.ReadFile(goldenDir + "envoy.log.hex")
	if err != nil {
		t.Fatal(err)
	}
	if string(pinned) != hexLines.String() {
		t.Fatalf("the Envoy entries no longer encode as pinned in envoy.log.hex: the frozen format changed")
	}
	f := NewFSM()
	var errs []error
	for i, line := range strings.Fields(string(pinned)) {
		b, err := hex.DecodeString(line)
		if err != nil {
			t.Fatal(err)
		}
		res, _ := f.Apply(&raft.Log{Index: uint64(i + 1), Type: raft.LogCommand, Data: b}).(applyResult)
		errs = append(errs, res.err)
	}
	if !errors.Is(errs[1], rule.ErrVersionMismatch) {
		t.Errorf("a put with a stale expected_version: %v, want a version mismatch", errs[1])
	}
	got := dumpEnvoy(t, f)
	if *updateGolden {
		if err := os.WriteFile(goldenDir+"envoy.expected.json", got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(goldenDir + "envoy.expected.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("replayed Envoy state:\n%s\nwant:\n%s", got, want)
	}
	// A snapshot keeps them.
	snap, err := encodeSnapshot(f.state.Load())
	if err != nil {
		t.Fatal(err)
	}
	g := NewFSM()
	if err := g.Restore(io.NopCloser(bytes.NewReader(snap))); err != nil {
		t.Fatal(err)
	}
	if got := dumpEnvoy(t, g); !bytes.Equal(got, want) {
		t.Fatalf("restored Envoy state:\n%s\nwant:\n%s", got, want)
	}
	// A snapshot of a release without Envoy domains still loads, empty.
	if ds := restore(t, goldenDir+"v1.snapshot").EnvoyDomains(); len(ds.Domains) != 0 || ds.Index != 0 {
		t.Fatalf("v1 snapshot: %+v, want no Envoy domains", ds)
	}
}

func TestEnvoySyncChanges(t *testing.T) {
	s := newState()
	ds := []EnvoyDomain{{Name: "a", YAML: "domain: a\n", Author: "file:a.yaml"}}
	if !envoySyncChanges(s, "file:", ds) {
		t.Fatal("a new domain is a change")
	}
	s.syncEnvoyDomains(5, syncEnvoyDomains{origin: "file:", domains: ds})
	if envoySyncChanges(s, "file:", ds) {
		t.Fatal("the same set again is no change")
	}
	if s.Envoy["a"].Version != 5 || s.EnvoyIndex != 5 {
		t.Fatalf("state %+v", s.Envoy)
	}
	// A domain of another origin is not dropped by a sync.
	s.putEnvoyDomain(6, putEnvoyDomain{domain: EnvoyDomain{Name: "b", YAML: "domain: b\n", Author: "alice"}})
	s.syncEnvoyDomains(7, syncEnvoyDomains{origin: "file:"})
	if _, ok := s.Envoy["b"]; !ok || len(s.Envoy) != 1 {
		t.Fatalf("after an empty file sync: %+v", s.Envoy)
	}
}
