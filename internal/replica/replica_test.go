package replica

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/cluster"
	"github.com/tokenserver/tokenserver/internal/rule"
	"github.com/tokenserver/tokenserver/internal/shard"
	peerv1 "github.com/tokenserver/tokenserver/proto/tokenserver/peer/v1"
)

func TestTrackerLag(t *testing.T) {
	type step struct {
		op      string // touch, take, ack, requeue
		key     string
		permits int64
		lag     int64 // rule "r"'s lag after the step
		dirty   int
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"touch then ack", []step{
			{op: "touch", key: "a", permits: 3, lag: 3, dirty: 1},
			{op: "touch", key: "a", permits: 2, lag: 5, dirty: 1},
			{op: "touch", key: "b", permits: 0, lag: 5, dirty: 2},
			{op: "take", lag: 5, dirty: 0},
			{op: "touch", key: "c", permits: 1, lag: 6, dirty: 1},
			{op: "ack", lag: 1, dirty: 1},
		}},
		{"requeue keeps the lag and the keys", []step{
			{op: "touch", key: "a", permits: 4, lag: 4, dirty: 1},
			{op: "take", lag: 4, dirty: 0},
			{op: "requeue", lag: 4, dirty: 1},
			{op: "take", lag: 4, dirty: 0},
			{op: "ack", lag: 0, dirty: 0},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := NewTracker()
			var tk Taken
			for i, s := range tt.steps {
				switch s.op {
				case "touch":
					tr.Touch("r", s.key, s.permits)
				case "take":
					tk = tr.Take()
				case "ack":
					tr.Ack(tk)
				case "requeue":
					tr.Requeue(tk, tk.Refs)
				}
				if got := tr.LagPermits("r"); got != s.lag {
					t.Errorf("step %d (%s): lag %d, want %d", i, s.op, got, s.lag)
				}
				if got := tr.Dirty(); got != s.dirty {
					t.Errorf("step %d (%s): dirty %d, want %d", i, s.op, got, s.dirty)
				}
			}
		})
	}
}

// node is one process's bucket map and replicator.
type node struct {
	id  string
	m   *shard.Map
	r   *Replicator
	now int64
}

func table(rules ...*rule.Rule) *rule.Table {
	for i, r := range rules {
		r.Version, r.Generation = uint64(i+1), uint64(i+1)
	}
	return rule.NewTable(uint64(len(rules)), rules, nil)
}

func newNode(id string, tbl *rule.Table, view *cluster.View, now int64, peer bool) *node {
	n := &node{id: id, m: shard.New(shard.Config{}), now: now}
	n.r = New(Local{ID: id, Buckets: n.m, Table: func() *rule.Table { return tbl }, Now: func() int64 { return n.now },
		View: func() *cluster.View { return view }, IsPeer: func(context.Context) bool { return peer }})
	return n
}

// serve serves n's ReplicaService on an in-memory listener and returns
// a dial function for it.
func serve(t *testing.T, n *node) func(string) (grpc.ClientConnInterface, error) {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	s := grpc.NewServer()
	peerv1.RegisterReplicaServiceServer(s, n.r)
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	conn, err := grpc.NewClient("passthrough:///"+n.id, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return func(string) (grpc.ClientConnInterface, error) { return conn, nil }
}

func acquire(t *testing.T, n *node, c *rule.Compiled, key string, permits int64) shard.Decision {
	t.Helper()
	if err := n.r.Install(c, key); err != nil {
		t.Fatal(err)
	}
	d, err := n.m.Acquire(c, key, bucket.Request{Permits: permits}, n.now)
	if err != nil {
		t.Fatal(err)
	}
	n.r.Touch(c, key, d.Granted)
	return d
}

// keyOwnedBy returns a key that view gives to id.
func keyOwnedBy(t *testing.T, view *cluster.View, id string) string {
	t.Helper()
	for i := 0; i < 1000; i++ {
		k := "k" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		if o, _ := view.Owner(k); o.ID == id {
			return k
		}
	}
	t.Fatal("no key")
	return ""
}

func TestReplicateThenSuccessorContinues(t *testing.T) {
	tbl := table(
		&rule.Rule{Name: "quota", Algorithm: bucket.TokenBucket, Limit: 1000, Period: time.Hour, Durable: true},
		&rule.Rule{Name: "plain", Algorithm: bucket.TokenBucket, Limit: 1000, Period: time.Hour},
	)
	view := cluster.NewView(1, []cluster.Member{{ID: "a", GRPCAddr: "a"}, {ID: "b", GRPCAddr: "b"}})
	a, b := newNode("a", tbl, view, 1e15, true), newNode("b", tbl, view, 7e12, true)
	dialB := serve(t, b)
	quota, plain := tbl.Get("quota"), tbl.Get("plain")
	key := keyOwnedBy(t, view, "a")
	acquire(t, a, quota, key, 600)
	acquire(t, a, plain, key, 600)
	if got := a.r.Tracker.LagPermits("quota"); got != 600 {
		t.Fatalf("lag before replication %d, want 600", got)
	}
	if got := a.r.Tracker.LagPermits("plain"); got != 0 || a.r.Tracker.Dirty() != 1 {
		t.Fatalf("a rule that is not durable is tracked: lag %d, dirty %d", got, a.r.Tracker.Dirty())
	}
	if err := a.r.Tick(context.Background(), dialB); err != nil {
		t.Fatal(err)
	}
	if got := a.r.Tracker.LagPermits("quota"); got != 0 {
		t.Errorf("lag after an acknowledged replication %d, want 0", got)
	}
	if b.r.Store.Len() != 1 {
		t.Fatalf("b keeps %d copies, want 1", b.r.Store.Len())
	}
	// Admitted after the last replication: what a crash of a may admit
	// again.
	acquire(t, a, quota, key, 50)
	// a dies; b decides for the key (10 minutes later on its clock).
	b.now += int64(10 * time.Minute)
	d := acquire(t, b, quota, key, 0)
	refill := int64(10 * time.Minute * 1000 / time.Hour)
	if want := 400 + refill; d.Remaining != want {
		t.Errorf("successor continues with %d left, want %d (the copy plus refill)", d.Remaining, want)
	}
	if b.r.Installed.Load() != 1 || b.r.Store.Len() != 0 {
		t.Errorf("installed %d, copies left %d", b.r.Installed.Load(), b.r.Store.Len())
	}
	if d := acquire(t, b, plain, key, 0); d.Remaining != 1000 {
		t.Errorf("a rule that is not durable starts fresh: remaining %d, want 1000", d.Remaining)
	}
	// The installed bucket goes on to b's own next owner.
	if b.r.Tracker.Dirty() != 1 {
		t.Errorf("installed bucket not marked for replication")
	}
}

func TestReplicateRefusesNonPeers(t *testing.T) {
	tbl := table(&rule.Rule{Name: "quota", Algorithm: bucket.FixedWindow, Limit: 100, Period: time.Hour, Durable: true})
	view := cluster.NewView(1, []cluster.Member{{ID: "a", GRPCAddr: "a"}, {ID: "b", GRPCAddr: "b"}})
	a, b := newNode("a", tbl, view, 1e15, true), newNode("b", tbl, view, 1e15, false)
	dialB := serve(t, b)
	key := keyOwnedBy(t, view, "a")
	acquire(t, a, tbl.Get("quota"), key, 7)
	err := a.r.Tick(context.Background(), dialB)
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("tick to a node that does not take us for a peer: %v, want PermissionDenied", err)
	}
	if b.r.Store.Len() != 0 {
		t.Error("a refused batch was stored")
	}
	if a.r.Tracker.LagPermits("quota") != 7 || a.r.Tracker.Dirty() != 1 {
		t.Errorf("unacknowledged buckets leave the lag (%d) or the dirty set (%d)", a.r.Tracker.LagPermits("quota"), a.r.Tracker.Dirty())
	}
}

func TestCheckpointRestore(t *testing.T) {
	mk := func() *rule.Table {
		return table(
			&rule.Rule{Name: "day", Algorithm: bucket.FixedWindow, Limit: 100, Period: 24 * time.Hour, Durable: true},
			&rule.Rule{Name: "hour", Algorithm: bucket.TokenBucket, Limit: 100, Period: time.Hour, Durable: true},
			&rule.Rule{Name: "plain", Algorithm: bucket.TokenBucket, Limit: 100, Period: 24 * time.Hour},
		)
	}
	tbl := mk()
	view := cluster.NewView(1, []cluster.Member{{ID: "a", GRPCAddr: "a"}, {ID: "b", GRPCAddr: "b"}})
	a, b := newNode("a", tbl, view, 2e15, true), newNode("b", tbl, view, 4e15, true)
	dialB := serve(t, b)
	ka, kb := keyOwnedBy(t, view, "a"), keyOwnedBy(t, view, "b")
	// b owns kb and keeps a copy of a's ka.
	acquire(t, a, tbl.Get("day"), ka, 30)
	if err := a.r.Tick(context.Background(), dialB); err != nil {
		t.Fatal(err)
	}
	acquire(t, b, tbl.Get("day"), kb, 60)
	acquire(t, b, tbl.Get("hour"), kb, 70)
	acquire(t, b, tbl.Get("plain"), kb, 80)
	dir := t.TempDir()
	wall := time.Unix(1_700_000_000, 0)
	n, bytes, err := b.r.Checkpoint(dir, wall)
	if err != nil {
		t.Fatal(err)
	}
	if n != 3 || bytes == 0 {
		t.Fatalf("checkpoint of %d buckets (%d bytes), want 3 (two own, one copy; not the plain rule)", n, bytes)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*.tmp-*")); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
	tests := []struct {
		name  string
		later time.Duration
		table func() *rule.Table
		want  map[string]int64 // rule/key → remaining after restore
	}{
		{"a minute later", time.Minute, func() *rule.Table { return tbl }, map[string]int64{"day/" + kb: 40, "hour/" + kb: 30 + 1, "day/" + ka: 70, "plain/" + kb: 100}},
		{"after the hour rule's window", 2 * time.Hour, func() *rule.Table { return tbl }, map[string]int64{"day/" + kb: 40, "hour/" + kb: 100, "day/" + ka: 70}},
		{"rules of another generation", time.Minute, mk2(mk), map[string]int64{"day/" + kb: 100, "hour/" + kb: 100}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb := tt.table()
			c := newNode("b", tb, view, 9e14, true) // a new process: another clock
			if _, err := c.r.Restore(dir, c.now, wall.Add(tt.later)); err != nil {
				t.Fatal(err)
			}
			for rk, want := range tt.want {
				name, key, _ := cut(rk)
				if d := acquire(t, c, tb.Get(name), key, 0); d.Remaining != want {
					t.Errorf("%s: remaining %d, want %d", rk, d.Remaining, want)
				}
			}
		})
	}
	t.Run("no checkpoint", func(t *testing.T) {
		c := newNode("b", tbl, view, 9e14, true)
		if n, err := c.r.Restore(t.TempDir(), c.now, wall); n != 0 || err != nil {
			t.Errorf("restore from an empty dir: %d, %v", n, err)
		}
	})
	t.Run("corrupt checkpoint", func(t *testing.T) {
		d := t.TempDir()
		if err := os.WriteFile(filepath.Join(d, CheckpointFile), []byte{0xff, 0xff, 0xff}, 0o600); err != nil {
			t.Fatal(err)
		}
		c := newNode("b", tbl, view, 9e14, true)
		if _, err := c.r.Restore(d, c.now, wall); err == nil {
			t.Error("a corrupt checkpoint restored without an error")
		}
	})
}

// mk2 returns a table maker whose rules have other generations than mk's.
func mk2(mk func() *rule.Table) func() *rule.Table {
	return func() *rule.Table {
		var rules []*rule.Rule
		for _, r := range mk().Rules() {
			r2 := *r
			r2.Version, r2.Generation = r.Version+10, r.Generation+10
			rules = append(rules, &r2)
		}
		return rule.NewTable(20, rules, nil)
	}
}

func cut(rk string) (string, string, bool) {
	for i := range rk {
		if rk[i] == '/' {
			return rk[:i], rk[i+1:], true
		}
	}
	return rk, "", false
}

func TestResyncSendsToANewNextOwner(t *testing.T) {
	tbl := table(
		&rule.Rule{Name: "quota", Algorithm: bucket.TokenBucket, Limit: 100, Period: time.Hour, Durable: true},
		&rule.Rule{Name: "plain", Algorithm: bucket.TokenBucket, Limit: 100, Period: time.Hour},
	)
	two := cluster.NewView(1, []cluster.Member{{ID: "a"}, {ID: "b"}})
	three := cluster.NewView(2, []cluster.Member{{ID: "a"}, {ID: "b"}, {ID: "c"}})
	a := newNode("a", tbl, three, 1e15, true)
	// Keys of a whose next owner is c once c joins, and one whose next
	// owner stays b.
	var toC, toB string
	for i := 0; toC == "" || toB == ""; i++ {
		k := fmt.Sprint("k", i)
		if o, _ := three.Owner(k); o.ID != "a" {
			continue
		}
		if s, _ := a.r.successor(three, k); s.ID == "c" && toC == "" {
			toC = k
		} else if s.ID == "b" && toB == "" {
			toB = k
		}
	}
	for _, k := range []string{toC, toB} {
		acquire(t, a, tbl.Get("quota"), k, 1)
		acquire(t, a, tbl.Get("plain"), k, 1)
	}
	a.r.Tracker.Ack(a.r.Tracker.Take()) // replicated while the view had two members
	n, err := a.r.Resync(two, three)
	if err != nil {
		t.Fatal(err)
	}
	tk := a.r.Tracker.Take()
	if n != 1 || len(tk.Refs) != 1 || tk.Refs[0] != (Ref{"quota", toC}) {
		t.Errorf("resync marked %d: %v, want only quota/%s", n, tk.Refs, toC)
	}
}
