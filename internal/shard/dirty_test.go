package shard

import (
	"slices"
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
)

func TestDirtyMarks(t *testing.T) {
	_, get := store(t,
		&rule.Rule{Name: "quota", Algorithm: bucket.TokenBucket, Limit: 100, Period: time.Hour, Durable: true},
		&rule.Rule{Name: "plain", Algorithm: bucket.TokenBucket, Limit: 100, Period: time.Hour},
	)
	type step struct {
		op      string // acquire, take, requeue, markkey, evict
		rule    string
		key     string
		permits int64
		// dirty is DirtyLen after the step; taken the keys of the last
		// take, sorted.
		dirty int
		taken []string
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"a durable decision marks once", []step{
			{op: "acquire", rule: "quota", key: "a", permits: 1, dirty: 1},
			{op: "acquire", rule: "quota", key: "a", permits: 2, dirty: 1},
			{op: "acquire", rule: "quota", key: "b", permits: 0, dirty: 1}, // a peek of no bucket makes none
			{op: "acquire", rule: "quota", key: "b", permits: 1, dirty: 2},
			{op: "acquire", rule: "plain", key: "a", permits: 1, dirty: 2},
			{op: "take", dirty: 0, taken: []string{"a", "b"}},
			{op: "take", dirty: 0, taken: nil},
		}},
		{"a decision after the take marks again", []step{
			{op: "acquire", rule: "quota", key: "a", permits: 1, dirty: 1},
			{op: "take", dirty: 0, taken: []string{"a"}},
			{op: "acquire", rule: "quota", key: "a", permits: 0, dirty: 1}, // a peek or a denial changes state too
			{op: "take", dirty: 0, taken: []string{"a"}},
		}},
		{"a failed replication marks again, once", []step{
			{op: "acquire", rule: "quota", key: "a", permits: 1, dirty: 1},
			{op: "take", dirty: 0, taken: []string{"a"}},
			{op: "acquire", rule: "quota", key: "a", permits: 1, dirty: 1},
			{op: "requeue", dirty: 1},
			{op: "take", dirty: 0, taken: []string{"a"}},
		}},
		{"a change outside a decision marks by key", []step{
			{op: "markkey", rule: "quota", key: "a", dirty: 0}, // no bucket
			{op: "acquire", rule: "quota", key: "a", permits: 1, dirty: 1},
			{op: "take", dirty: 0, taken: []string{"a"}},
			{op: "markkey", rule: "quota", key: "a", dirty: 1},
			{op: "markkey", rule: "quota", key: "a", dirty: 1},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := New(Config{})
			now := int64(time.Hour)
			var taken []Dirty
			for i, s := range tt.steps {
				switch s.op {
				case "acquire":
					if _, err := m.Acquire(get(s.rule), s.key, bucket.Request{Permits: s.permits}, now); err != nil {
						t.Fatal(err)
					}
				case "take":
					taken = m.TakeDirty(nil)
					var keys []string
					for _, d := range taken {
						if d.Rule() != "quota" {
							t.Errorf("step %d: rule %q taken", i, d.Rule())
						}
						keys = append(keys, d.Key())
					}
					slices.Sort(keys)
					if !slices.Equal(keys, s.taken) {
						t.Errorf("step %d: took %v, want %v", i, keys, s.taken)
					}
				case "requeue":
					for _, d := range taken {
						m.MarkDirty(d)
					}
				case "markkey":
					m.MarkKey(s.rule, s.key)
				}
				if got := m.DirtyLen(); got != s.dirty {
					t.Errorf("step %d (%s): %d dirty, want %d", i, s.op, got, s.dirty)
				}
			}
		})
	}
}

// TestDirtyExport: a marked bucket exports its state as ExportKey does,
// as of the export; once evicted, it has nothing to export and a mark
// of it again changes nothing.
func TestDirtyExport(t *testing.T) {
	st, get := store(t, &rule.Rule{Name: "quota", Algorithm: bucket.TokenBucket, Limit: 100, Period: time.Second, Durable: true})
	c := get("quota")
	m := New(Config{})
	now := int64(time.Hour)
	if _, err := m.Acquire(c, "k", bucket.Request{Permits: 30}, now); err != nil {
		t.Fatal(err)
	}
	ds := m.TakeDirty(nil)
	if len(ds) != 1 {
		t.Fatalf("%d marked, want 1", len(ds))
	}
	if _, err := m.Acquire(c, "k", bucket.Request{Permits: 20}, now); err != nil { // after the take, before the export
		t.Fatal(err)
	}
	got, ok, err := ds[0].Export(now)
	want, _, _ := m.ExportKey("quota", "k", now)
	if err != nil || !ok || got.Key != "k" || got.Rule != "quota" || string(got.State) != string(want.State) || got.Seq != want.Seq {
		t.Fatalf("export %+v %v %v, want %+v", got, ok, err, want)
	}
	if again := m.TakeDirty(nil); len(again) != 1 || again[0] != ds[0] {
		t.Fatalf("the decision after the take marked %v, want the bucket again", again)
	}
	later := now + int64(time.Minute) // the bucket is full again: evicted
	m.Sweep(later, st.Table())
	if m.Live() != 0 {
		t.Fatalf("%d live after the sweep, want 0", m.Live())
	}
	if _, ok, err := ds[0].Export(later); ok || err != nil {
		t.Errorf("an evicted bucket exported: %v %v", ok, err)
	}
	m.MarkDirty(ds[0])
	if m.DirtyLen() != 0 {
		t.Errorf("an evicted bucket marked again")
	}
}
