package replica

import (
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/cluster"
	"github.com/tokenserver/tokenserver/internal/rule"
	"github.com/tokenserver/tokenserver/internal/shard"
)

// TestInstallMoved: the copies InstallMoved selects become buckets of
// the map, with their state, so that a handoff carries them on; copies
// it does not select, or that are of no use (another generation, past
// their window, a rule no longer durable), stay in the Store.
func TestInstallMoved(t *testing.T) {
	tbl := table(
		&rule.Rule{Name: "quota", Algorithm: bucket.FixedWindow, Limit: 100, Period: 24 * time.Hour, Durable: true},
		&rule.Rule{Name: "plain", Algorithm: bucket.FixedWindow, Limit: 100, Period: 24 * time.Hour},
	)
	view := cluster.NewView(1, []cluster.Member{{ID: "a"}, {ID: "b"}})
	quota := tbl.Get("quota")
	// A copy of a bucket with 60 of 100 used, taken on a node at now.
	copyOf := func(t *testing.T, ruleName, key string, gen uint64, now int64) Copy {
		src := newNode("src", tbl, view, now, true)
		acquire(t, src, quota, key, 60)
		var out shard.BucketState
		if err := src.m.Export(now, func(string, string) bool { return true }, func(s shard.BucketState) error { out = s; return nil }); err != nil {
			t.Fatal(err)
		}
		out.Rule, out.Generation = ruleName, gen
		return Copy{State: out, At: now}
	}
	const now = int64(1e15)
	for _, tc := range []struct {
		name      string
		copy      func(t *testing.T) Copy
		selected  bool
		installed bool
	}{
		{"selected", func(t *testing.T) Copy { return copyOf(t, "quota", "k1", quota.Rule.Generation, now) }, true, true},
		{"not selected", func(t *testing.T) Copy { return copyOf(t, "quota", "k1", quota.Rule.Generation, now) }, false, false},
		{"another generation", func(t *testing.T) Copy { return copyOf(t, "quota", "k1", quota.Rule.Generation+7, now) }, true, false},
		{"past its window", func(t *testing.T) Copy {
			return copyOf(t, "quota", "k1", quota.Rule.Generation, now-int64(25*time.Hour))
		}, true, false},
		{"rule not durable", func(t *testing.T) Copy { return copyOf(t, "plain", "k1", tbl.Get("plain").Rule.Generation, now) }, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode("a", tbl, view, now, true)
			c := tc.copy(t)
			if !n.r.Store.Put(c) {
				t.Fatal("copy not stored")
			}
			if !n.r.Store.Has(c.State.Rule, c.State.Key) {
				t.Fatal("Has: the stored copy is not there")
			}
			got, err := n.r.InstallMoved(func(string, string) bool { return tc.selected })
			if err != nil {
				t.Fatal(err)
			}
			if want := map[bool]int64{true: 1}[tc.installed]; got != want {
				t.Fatalf("installed %d, want %d", got, want)
			}
			if held, _ := n.m.Held(c.State.Rule, c.State.Key); held != tc.installed {
				t.Fatalf("bucket held %v, want %v", held, tc.installed)
			}
			if n.r.Store.Has(c.State.Rule, c.State.Key) == tc.installed {
				t.Fatalf("the copy is still in the Store: %v, want %v", !tc.installed, !tc.installed)
			}
			if tc.installed {
				d, err := n.m.Acquire(quota, c.State.Key, bucket.Request{Permits: 0}, now)
				if err != nil {
					t.Fatal(err)
				}
				if d.Remaining != 40 {
					t.Fatalf("installed bucket has %d left, want 40", d.Remaining)
				}
			}
		})
	}
}
