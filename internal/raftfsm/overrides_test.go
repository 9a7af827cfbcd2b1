package raftfsm

import (
	"bytes"
	"fmt"
	"io"
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

// TestOverrideWriteCost: one override write does the same work with
// 100,000 overrides as with 10, judged by allocations (deterministic; the
// time is a figure, BenchmarkOverrideWrite): nothing proportional to the
// overrides already stored is copied.
func TestOverrideWriteCost(t *testing.T) {
	if testing.Short() {
		t.Skip("builds 100,000 overrides")
	}
	allocs := func(n int) float64 {
		f, idx := overrideFSM(t, n)
		i := 0
		return testing.AllocsPerRun(200, func() {
			e := overrideEntry(t, fmt.Sprintf("new-%d", i), 7)
			f.Apply(&raft.Log{Index: idx, Type: raft.LogCommand, Data: e})
			idx++
			i++
		})
	}
	small, large := allocs(10), allocs(100_000)
	t.Logf("allocations per override write: %.1f with 10 overrides, %.1f with 100,000", small, large)
	if large > small+2 {
		t.Errorf("a write with 100,000 overrides allocates %.1f times, with 10 %.1f: a write copies what is stored", large, small)
	}
}

// BenchmarkOverrideWrite is the time of one override write with 10 and
// with 100,000 overrides stored (the figure: p50 within 1.5x).
func BenchmarkOverrideWrite(b *testing.B) {
	for _, n := range []int{10, 100_000} {
		b.Run(fmt.Sprintf("overrides=%d", n), func(b *testing.B) {
			f, idx := overrideFSM(b, n)
			entries := make([][]byte, b.N)
			for i := range entries {
				entries[i] = overrideEntry(b, fmt.Sprintf("new-%d", i), 7)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				f.Apply(&raft.Log{Index: idx, Type: raft.LogCommand, Data: entries[i]})
				idx++
			}
		})
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
