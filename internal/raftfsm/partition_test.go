package raftfsm

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tokenserver/tokenserver/internal/rule"
)

// faultNet cuts nodes off the others' Raft traffic: dials from or to a cut
// node are refused, and its open connections are closed when it is cut.
// With the registry's down set for its gRPC address, the node is as if
// behind a partition.
type faultNet struct {
	mu    sync.Mutex
	cut   map[string]bool
	owner map[string]string // raft address -> node id
	conns map[net.Conn][2]string
}

func newFaultNet() *faultNet {
	return &faultNet{cut: map[string]bool{}, owner: map[string]string{}, conns: map[net.Conn][2]string{}}
}

func (f *faultNet) dialFor(from string) func(string, time.Duration) (net.Conn, error) {
	return func(addr string, timeout time.Duration) (net.Conn, error) {
		f.mu.Lock()
		to := f.owner[addr]
		blocked := f.cut[from] || f.cut[to]
		f.mu.Unlock()
		if blocked {
			return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
		}
		c, err := net.DialTimeout("tcp", addr, timeout)
		if err != nil {
			return nil, err
		}
		f.mu.Lock()
		f.conns[c] = [2]string{from, to}
		f.mu.Unlock()
		return c, nil
	}
}

// isolate cuts id off (on) or heals it.
func (f *faultNet) isolate(c *testCluster, id string, on bool) {
	f.mu.Lock()
	f.cut[id] = on
	var open []net.Conn
	if on {
		for conn, ends := range f.conns {
			if ends[0] == id || ends[1] == id {
				open = append(open, conn)
				delete(f.conns, conn)
			}
		}
	}
	f.mu.Unlock()
	for _, conn := range open {
		conn.Close()
	}
	c.reg.mu.Lock()
	c.reg.down["grpc-"+id] = on
	c.reg.mu.Unlock()
}

// faultyThreeNodes is threeNodes with every Raft dial through fn.
func faultyThreeNodes(t *testing.T) (*testCluster, *faultNet) {
	t.Helper()
	fn := newFaultNet()
	c := newTestCluster(t)
	start := func(id string, join bool) *Node {
		n := c.start(id, func(cfg *Config) { cfg.Dial, cfg.Join = fn.dialFor(id), join })
		fn.mu.Lock()
		fn.owner[n.RaftAddr()] = id
		fn.mu.Unlock()
		return n
	}
	a := start("a", false)
	waitFor(t, "a leads", 20*time.Second, a.IsLeader)
	for _, id := range []string{"b", "c"} {
		if err := start(id, true).JoinCluster(ctxT(t), []string{"grpc-a"}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "three ready voters", 20*time.Second, func() bool {
		for _, n := range c.nodes {
			if !n.Ready() {
				return false
			}
		}
		return a.voters() == 3
	})
	return c, fn
}

func (c *testCluster) follower() *Node {
	for _, n := range c.nodes {
		if !n.IsLeader() {
			return n
		}
	}
	return nil
}

// TestIssue20Item20_CutOffFollowerIsNotReady checks that a follower cut
// off by a partition reports not ready once the majority has dropped it
// from the view, though its own last-known view still lists it, and is
// ready again after the heal.
func TestIssue20Item20_CutOffFollowerIsNotReady(t *testing.T) {
	c, fn := faultyThreeNodes(t)
	f := c.follower()
	fn.isolate(c, f.ID(), true)
	cut := time.Now()
	waitFor(t, "the majority drops the cut-off node from the view", 20*time.Second, func() bool {
		l := c.leader()
		return l != nil && l != f && l.View().Len() == 2
	})
	waitFor(t, "the cut-off node reports not ready", f.cfg.DownAfter+5*time.Second, func() bool { return !f.Ready() })
	t.Logf("not ready %v after the cut (down-after %v)", time.Since(cut).Round(time.Millisecond), f.cfg.DownAfter)
	if !f.inView() {
		t.Fatal("the cut-off node's own view dropped it: the test does not show the contact rule")
	}
	fn.isolate(c, f.ID(), false)
	waitFor(t, "the healed node is ready again", 20*time.Second, f.Ready)
}

// TestIssue20Item20_CutOffLeaderStepsDown checks the leader lease (raft's
// check quorum): a leader cut off from its quorum steps down within about
// LeaderLeaseTimeout, reports not ready, and the majority elects another.
func TestIssue20Item20_CutOffLeaderStepsDown(t *testing.T) {
	c, fn := faultyThreeNodes(t)
	l := c.leader()
	fn.isolate(c, l.ID(), true)
	cut := time.Now()
	waitFor(t, "the cut-off leader steps down", l.cfg.HeartbeatTimeout+l.cfg.LeaderLeaseTimeout+3*time.Second, func() bool { return !l.IsLeader() })
	t.Logf("stepped down %v after the cut (lease %v)", time.Since(cut).Round(time.Millisecond), l.cfg.LeaderLeaseTimeout)
	waitFor(t, "another leader", 20*time.Second, func() bool { n := c.leader(); return n != nil && n != l })
	waitFor(t, "the old leader reports not ready", l.cfg.DownAfter+5*time.Second, func() bool { return !l.Ready() })
	fn.isolate(c, l.ID(), false)
	waitFor(t, "the healed node is ready again", 20*time.Second, l.Ready)
}

// TestIssue20Item20_LeaderLeaseIsValidated: the lease that makes a cut-off
// leader step down is required and at most the heartbeat timeout.
func TestIssue20Item20_LeaderLeaseIsValidated(t *testing.T) {
	c := newTestCluster(t)
	for _, tc := range []struct {
		name  string
		lease time.Duration
		ok    bool
	}{
		{"default", DefaultConfig().LeaderLeaseTimeout, true},
		{"zero", 0, false},
		{"above the heartbeat timeout", 2 * DefaultConfig().HeartbeatTimeout, false},
	} {
		cfg := c.config("a")
		cfg.JoinVia = c.reg.joinVia
		cfg.HeartbeatTimeout = DefaultConfig().HeartbeatTimeout
		cfg.LeaderLeaseTimeout = tc.lease
		if err := cfg.Validate(); (err == nil) != tc.ok {
			t.Errorf("%s: validate: %v", tc.name, err)
		}
	}
	if rc := DefaultConfig(); rc.raftConfig(nil).LeaderLeaseTimeout != rc.LeaderLeaseTimeout {
		t.Fatal("the lease does not reach raft")
	}
}

// TestIssue20Item23_RemoveTheLeader checks that removing the leader hands
// leadership over first and succeeds at once, that the removed node stops
// deciding (Removed, not ready), and that restarted on its old data dir it
// refuses to start.
func TestIssue20Item23_RemoveTheLeader(t *testing.T) {
	c := threeNodes(t)
	l := c.leader()
	start := time.Now()
	if err := l.RemoveMember(ctxT(t), l.ID()); err != nil {
		t.Fatalf("remove the leader: %v", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("removing the leader took %v", took)
	}
	waitFor(t, "the removed node knows", 10*time.Second, l.Removed)
	if l.Ready() {
		t.Fatal("the removed node reports ready")
	}
	var rest *Node
	for _, n := range c.nodes {
		if n != l {
			rest = n
		}
	}
	waitFor(t, "two voters and a view of two", 20*time.Second, func() bool {
		nl := c.leader()
		return nl != nil && nl != l && nl.voters() == 2 && nl.View().Len() == 2 && rest.Ready()
	})
	id := l.ID()
	c.stop(id)
	cfg := c.config(id)
	cfg.JoinVia = c.reg.joinVia
	if n, err := Open(cfg); !errors.Is(err, ErrRemoved) {
		if n != nil {
			n.Close()
		}
		t.Fatalf("restart of a removed node: %v, want ErrRemoved", err)
	}
}

// TestIssue20Item23_RemoveTheLeaderWithoutRemoveVia: without RemoveVia the
// leader hands over and names the new leader for the caller to forward.
func TestIssue20Item23_RemoveTheLeaderWithoutRemoveVia(t *testing.T) {
	c := threeNodes(t)
	l := c.leader()
	l.cfg.RemoveVia = nil
	err := l.RemoveMember(ctxT(t), l.ID())
	var le *rule.LeaderError
	if !errors.As(err, &le) || le.ID == l.ID() {
		t.Fatalf("remove the leader without RemoveVia: %v, want the new leader", err)
	}
	if err := c.nodes[le.ID].RemoveMember(ctxT(t), l.ID()); err != nil {
		t.Fatalf("the forwarded removal: %v", err)
	}
	waitFor(t, "the removed node knows", 10*time.Second, l.Removed)
}

// TestIssue20Item23_RemovedFollowerStops: a removed follower learns it
// was removed and stops reporting ready.
func TestIssue20Item23_RemovedFollowerStops(t *testing.T) {
	c := threeNodes(t)
	f := c.follower()
	if err := c.leader().RemoveMember(ctxT(t), f.ID()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the removed follower knows", 10*time.Second, f.Removed)
	if f.Ready() {
		t.Fatal("the removed follower reports ready")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := f.Drain(ctx); err != nil {
		t.Fatalf("drain of a removed node: %v", err)
	}
}

// TestIssue20Item23_RemovalSurvivesCompaction: a removed node records its
// removal in its data dir as soon as it learns of it, so that a restart
// refuses even when every configuration that listed it was compacted
// away (here: every configuration entry of the log is the latest one,
// without it, and no snapshot names it).
func TestIssue20Item23_RemovalSurvivesCompaction(t *testing.T) {
	c := threeNodes(t)
	f := c.follower()
	id := f.ID()
	if err := c.leader().RemoveMember(ctxT(t), id); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the removed follower knows", 10*time.Second, f.Removed)
	latest, ok := f.configuration()
	if !ok || f.listed(latest) {
		t.Fatalf("the removed follower's latest configuration: %v, %v", latest, ok)
	}
	c.stop(id)
	dir := c.config(id).DataDir

	// Compact: every configuration that listed the node is gone (the log's
	// configuration entries say the latest one, without it), and so are
	// the snapshots.
	s, err := openBolt(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	first, _ := s.FirstIndex()
	last, _ := s.LastIndex()
	for i := first; i <= last; i++ {
		var l raft.Log
		if err := s.GetLog(i, &l); err != nil {
			t.Fatal(err)
		}
		if l.Type == raft.LogConfiguration {
			l.Data = raft.EncodeConfiguration(raft.Configuration{Servers: latest})
			if err := s.StoreLog(&l); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !removalRecorded(s, id) {
		t.Error("no removal record in the stable store")
	}
	s.Close()
	if err := os.RemoveAll(filepath.Join(dir, "snapshots")); err != nil {
		t.Fatal(err)
	}

	cfg := c.config(id)
	cfg.JoinVia = c.reg.joinVia
	n, err := Open(cfg)
	if n != nil {
		n.Close()
	}
	if !errors.Is(err, ErrRemoved) || !strings.Contains(err.Error(), "fresh --data-dir") {
		t.Fatalf("restart of a removed node after compaction: %v, want ErrRemoved", err)
	}
}
