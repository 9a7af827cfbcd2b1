package raftfsm

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
	raftv1 "github.com/tokenserver/tokenserver/proto/tokenserver/raft/v1"
)

// overrideFSM returns an FSM holding rule "api" and n overrides of it,
// and the next free index.
func overrideFSM(t testing.TB, n int) (*FSM, uint64) {
	t.Helper()
	f := NewFSM()
	put, err := encodeEntry(entryPutRule, putEntry(&rule.Rule{Name: "api", Algorithm: bucket.TokenBucket, Limit: 10, Period: time.Second}, nil, 0))
	if err != nil {
		t.Fatal(err)
	}
	f.Apply(&raft.Log{Index: 1, Type: raft.LogCommand, Data: put})
	idx := uint64(2)
	for i := range n {
		f.Apply(&raft.Log{Index: idx, Type: raft.LogCommand, Data: overrideEntry(t, fmt.Sprintf("tenant-%d", i), 5)})
		idx++
	}
	return f, idx
}

func overrideEntry(t testing.TB, key string, limit int64) []byte {
	b, err := encodeEntry(entryPutOverride, &raftv1.PutOverride{Override: &raftv1.RuntimeOverride{Rule: "api", Key: key, Limit: limit}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestOverrideWriteCost: the p50 of applying one override write with
// 100,000 overrides stays within 1.5x of the p50 with 10.
func TestOverrideWriteCost(t *testing.T) {
	if testing.Short() {
		t.Skip("builds 100,000 overrides")
	}
	p50 := func(n int) time.Duration {
		f, idx := overrideFSM(t, n)
		var lat []time.Duration
		for i := range 2000 {
			e := overrideEntry(t, fmt.Sprintf("new-%d", i), 7)
			start := time.Now()
			f.Apply(&raft.Log{Index: idx, Type: raft.LogCommand, Data: e})
			lat = append(lat, time.Since(start))
			idx++
		}
		slices.Sort(lat)
		return lat[len(lat)/2]
	}
	small, large := p50(10), p50(100_000)
	t.Logf("p50 of one override write: %v with 10 overrides, %v with 100,000", small, large)
	if float64(large) > 1.5*float64(small) {
		t.Errorf("p50 with 100,000 overrides %v is above 1.5x the p50 with 10 (%v)", large, small)
	}
}

// TestOverridesSurviveSnapshot: runtime overrides persist in a snapshot
// and come back on restore; a deleted rule loses its overrides.
func TestOverridesSurviveSnapshot(t *testing.T) {
	f, idx := overrideFSM(t, 3)
	f.Apply(&raft.Log{Index: idx, Type: raft.LogCommand, Data: overrideEntry(t, "premium-*", 8)})
	g := NewFSM()
	if err := g.Restore(io.NopCloser(bytes.NewReader(persistBytes(t, f)))); err != nil {
		t.Fatal(err)
	}
	c := g.Table().Get("api")
	if got := c.ConfigFor("premium-1").Limit; got != 8 {
		t.Fatalf("restored prefix override: limit %d, want 8", got)
	}
	if got := len(c.Runtime().All()); got != 4 {
		t.Fatalf("restored %d overrides, want 4", got)
	}
	del, _ := encodeEntry(entryDeleteRule, &raftv1.DeleteRule{Name: "api"})
	g.Apply(&raft.Log{Index: idx + 1, Type: raft.LogCommand, Data: del})
	put, _ := encodeEntry(entryPutRule, putEntry(&rule.Rule{Name: "api", Algorithm: bucket.TokenBucket, Limit: 10, Period: time.Second}, nil, 0))
	g.Apply(&raft.Log{Index: idx + 2, Type: raft.LogCommand, Data: put})
	if got := g.Table().Get("api").ConfigFor("premium-1").Limit; got != 10 {
		t.Fatalf("recreated rule keeps an old override: limit %d", got)
	}
}

func persistBytes(t *testing.T, f *FSM) []byte {
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
