package raftfsm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// onLeader runs f on the current leader, again while it fails for want
// of a leader: with the tests' 150 ms leader lease, a loaded machine can
// cost a leader its lease and start an election in the middle of a test.
func onLeader(t *testing.T, c *testCluster, f func(l *Node) error) error {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		var err error
		if l := c.leader(); l == nil {
			err = rule.ErrNoLeader
		} else {
			err = f(l)
		}
		var le *rule.LeaderError
		if err == nil || !(errors.Is(err, rule.ErrNoLeader) || errors.As(err, &le)) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func rawLog(i uint64, data []byte) *raft.Log {
	return &raft.Log{Index: i, Type: raft.LogCommand, Data: data}
}

// TestProbeBeforeRaftExists is the regression test of the start-up panic:
// the Raft listener answered a peer's bootstrap probe before the node's
// raft existed, and probeInfo dereferenced nil.
func TestProbeBeforeRaftExists(t *testing.T) {
	n := &Node{cfg: Config{NodeID: "a", AdvertiseGRPC: "grpc-a"}}
	n.state.Store(true)
	if p := n.probeInfo(); p.ID != "a" || !p.HasState || p.Leader != "" {
		t.Fatalf("probe before raft: %+v", p)
	}
}

// TestSimultaneousStarts starts three --bootstrap-expect nodes at the same
// instant, several times: every try elects one leader with a view of 3 and
// nobody panics (under -race, a panic fails the whole package).
func TestSimultaneousStarts(t *testing.T) {
	tries := 5
	if testing.Short() {
		tries = 2
	}
	for try := 0; try < tries; try++ {
		t.Run(fmt.Sprint("try", try), func(t *testing.T) {
			c := newTestCluster(t)
			ids := []string{"n1", "n2", "n3"}
			var peers []Peer
			for _, id := range ids {
				c.reserve(id)
				peers = append(peers, Peer{ID: id, RaftAddr: c.raft[id]})
			}
			cfgs := map[string]Config{}
			for _, id := range ids {
				cfg := c.config(id)
				cfg.BootstrapExpect, cfg.Peers, cfg.JoinVia = 3, peers, c.reg.joinVia
				cfgs[id] = cfg
			}
			var wg sync.WaitGroup
			var mu sync.Mutex
			start := make(chan struct{})
			for _, id := range ids {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					n, err := Open(cfgs[id])
					if err != nil {
						t.Errorf("open %s: %v", id, err)
						return
					}
					mu.Lock()
					c.nodes[id] = n
					c.reg.mu.Lock()
					c.reg.nodes["grpc-"+id] = n
					c.reg.mu.Unlock()
					mu.Unlock()
					t.Cleanup(func() { n.Close() })
				}()
			}
			close(start)
			wg.Wait()
			waitFor(t, "one leader, every node ready", 30*time.Second, func() bool {
				leaders := 0
				for _, n := range c.nodes {
					if !n.Ready() || n.View().Len() != 3 {
						return false
					}
					if n.IsLeader() {
						leaders++
					}
				}
				return leaders == 1
			})
		})
	}
}

// TestRestartedFollowerReady is the regression test of the follower that
// never became ready after a restart with nothing new to apply: readiness
// compared the FSM's applied index (commands only) with the commit index
// (no-op, configuration and barrier entries too).
func TestRestartedFollowerReady(t *testing.T) {
	c := threeNodes(t)
	if err := onLeader(t, c, func(l *Node) error { _, err := l.Put(ctxT(t), tbRule("api", 5), nil); return err }); err != nil {
		t.Fatal(err)
	}
	// Reads must not write Barriers any more: a hundred reads leave the
	// log as it was (unless an election wrote its no-op meanwhile).
	l := c.leader()
	before, term := l.raft.LastIndex(), l.raft.CurrentTerm()
	for i := 0; i < 100; i++ {
		if err := onLeader(t, c, func(l *Node) error { _, err := l.Get(ctxT(t), "api"); return err }); err != nil {
			t.Fatal(err)
		}
	}
	if after := l.raft.LastIndex(); after != before && l.raft.CurrentTerm() == term {
		t.Fatalf("100 consistent reads wrote %d log entries", after-before)
	}
	var took []time.Duration
	for i := 0; i < 3; i++ {
		c.stop("b")
		start := time.Now()
		b := c.start("b", nil)
		waitFor(t, "the restarted follower is ready", 20*time.Second, b.Ready)
		took = append(took, time.Since(start))
		st, err := b.Status()
		if err != nil || st.AppliedIndex != st.CommitIndex {
			t.Fatalf("status of a caught-up follower shows apply lag: %+v %v", st, err)
		}
	}
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	t.Logf("FIGURE follower restart to ready: p50 %v, max %v (of %d)", took[len(took)/2], took[len(took)-1], len(took))
}

// threeNodes starts a, then b and c joining it, and waits for three ready
// voters.
func threeNodes(t *testing.T) *testCluster {
	t.Helper()
	c := newTestCluster(t)
	a := c.start("a", nil)
	waitFor(t, "a leads", 20*time.Second, a.IsLeader)
	for _, id := range []string{"b", "c"} {
		n := c.start(id, func(cfg *Config) { cfg.Join = true })
		if err := n.JoinCluster(ctxT(t), []string{"grpc-a"}); err != nil {
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
	return c
}

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// TestJoinOfADeadAddressIsRefused is the regression test of the join that
// destroyed a single-node cluster: a voter at a dead address made quorum 2
// of 2, for good.
func TestJoinOfADeadAddressIsRefused(t *testing.T) {
	c := newTestCluster(t)
	a := c.start("a", nil)
	waitFor(t, "ready", 20*time.Second, a.Ready)
	err := a.AddMember(ctxT(t), "ghost", closedAddr(t), "127.0.0.1:1")
	if !errors.Is(err, ErrRefused) {
		t.Fatalf("join of a dead address: %v", err)
	}
	// An address that answers as another node is refused too.
	err = a.AddMember(ctxT(t), "ghost", a.RaftAddr(), "grpc-a")
	if !errors.Is(err, ErrRefused) {
		t.Fatalf("join of an address that answers as a: %v", err)
	}
	if a.voters() != 1 {
		t.Fatalf("%d voters after refused joins", a.voters())
	}
	if err := onLeader(t, c, func(l *Node) error { _, err := l.Put(ctxT(t), tbRule("still-writable", 1), nil); return err }); err != nil {
		t.Fatalf("the cluster lost its quorum: %v", err)
	}
}

// TestJoinNeverReplacesALiveMember is the regression test of the re-join
// with the same id and another address, which removed a live voter first.
func TestJoinNeverReplacesALiveMember(t *testing.T) {
	c := threeNodes(t)
	// A second process calling itself b, at another address.
	imposter := c.start("b2", func(cfg *Config) { cfg.NodeID, cfg.Join, cfg.AdvertiseGRPC = "b", true, "grpc-b-imposter" })
	err := c.nodes["a"].AddMember(ctxT(t), "b", imposter.RaftAddr(), "grpc-b-imposter")
	if !errors.Is(err, ErrRefused) {
		t.Fatalf("a join replaced live member b: %v", err)
	}
	st, _ := c.nodes["a"].Status()
	for _, m := range st.Members {
		if m.ID == "b" && m.RaftAddr != c.nodes["b"].RaftAddr() {
			t.Fatalf("b's address changed to %s", m.RaftAddr)
		}
	}
	if c.nodes["a"].voters() != 3 {
		t.Fatalf("%d voters", c.nodes["a"].voters())
	}
}

// TestJoinReplacesAMemberDeadForTheStabilizationTime: the same id at a new
// address is taken once the old member has been unreachable long enough.
func TestJoinReplacesAMemberDeadForTheStabilizationTime(t *testing.T) {
	c := threeNodes(t)
	c.stop("c")
	a := c.nodes["a"]
	waitFor(t, "the leader sees c unreachable for the stabilization time", 20*time.Second, func() bool {
		h, ok := a.health.get("c")
		return ok && !h.OK && time.Since(h.Since) > a.cfg.StabilizationTime
	})
	delete(c.raft, "c")
	c.dirs["c"] = t.TempDir()
	n := c.start("c", func(cfg *Config) { cfg.Join = true })
	if err := n.JoinCluster(ctxT(t), []string{"grpc-a"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the new c is promoted and in the view", 20*time.Second, func() bool {
		return a.voters() == 3 && a.View().Len() == 3 && n.Ready()
	})
}

// TestRemoveMemberKeepsQuorum: removing the last voter, or a voter without
// which fewer than a quorum of the voters left answer, is refused.
func TestRemoveMemberKeepsQuorum(t *testing.T) {
	c := threeNodes(t)
	c.stop("c")
	remove := func(id string) error {
		return onLeader(t, c, func(l *Node) error { return l.RemoveMember(ctxT(t), id) })
	}
	other := func() string { // the live voter that does not lead
		if c.leader() == c.nodes["a"] {
			return "b"
		}
		return "a"
	}
	// Without one of a and b, the voters left are the other and the dead
	// c: 1 of 2 answer.
	if err := remove(other()); !errors.Is(err, ErrRefused) {
		t.Fatalf("remove a live voter with c dead: %v", err)
	}
	// Removing the dead c leaves a and b, both alive.
	if err := remove("c"); err != nil {
		t.Fatalf("remove the dead c: %v", err)
	}
	gone := other()
	if err := remove(gone); err != nil {
		t.Fatalf("remove %s from a, b: %v", gone, err)
	}
	last := c.leader()
	if err := remove(last.ID()); !errors.Is(err, ErrRefused) {
		t.Fatalf("remove the last voter: %v", err)
	}
	if _, err := last.Put(ctxT(t), tbRule("after", 1), nil); err != nil {
		t.Fatal(err)
	}
}

// TestDrainLeavesTheViewAndComesBack: a draining node leaves the routing
// view on every node before it stops, and after a restart it is back as
// soon as it is ready (no flapping hysteresis for a clean leave).
func TestDrainLeavesTheViewAndComesBack(t *testing.T) {
	c := threeNodes(t)
	b := c.nodes["b"]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := b.Drain(ctx); err != nil {
		t.Fatal(err)
	}
	if b.Ready() {
		t.Fatal("a draining node says ready")
	}
	waitFor(t, "every node's view drops b", 10*time.Second, func() bool {
		for _, n := range c.nodes {
			if n.View().Len() != 2 {
				return false
			}
		}
		return true
	})
	c.stop("b")
	start := time.Now()
	b = c.start("b", nil)
	waitFor(t, "b back in every view", 20*time.Second, func() bool {
		for _, n := range c.nodes {
			if n.View().Len() != 3 {
				return false
			}
		}
		return b.Ready()
	})
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("b took %v to come back after a clean drain", took)
	}
	// A leader drains too: the view drops it, then it hands over.
	l := c.leader()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	if err := l.Drain(ctx2); err != nil {
		t.Fatal(err)
	}
	if l.inView() {
		t.Fatal("a drained leader is still in its view")
	}
}

// TestDrainOfTheOnlyOwner: a single node does not empty its view when it
// stops (its keys have nowhere to go), and it is back after a restart.
func TestDrainOfTheOnlyOwner(t *testing.T) {
	c := newTestCluster(t)
	a := c.start("a", nil)
	waitFor(t, "ready", 20*time.Second, a.Ready)
	if err := a.Drain(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if a.View().Len() != 1 || a.Ready() {
		t.Fatalf("after drain: view %d, ready %v", a.View().Len(), a.Ready())
	}
	c.stop("a")
	a = c.start("a", nil)
	waitFor(t, "ready after restart", 20*time.Second, a.Ready)
}

// TestRecoverFromLostQuorum: a 3-node cluster loses two nodes for good; the
// survivor is recovered offline, serves writes with every rule, and new
// nodes join it.
func TestRecoverFromLostQuorum(t *testing.T) {
	c := threeNodes(t)
	for i := 0; i < 5; i++ {
		if err := onLeader(t, c, func(l *Node) error { _, err := l.Put(ctxT(t), tbRule(fmt.Sprint("r", i), 5), nil); return err }); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "b has every rule", 10*time.Second, func() bool { return c.nodes["b"].Table().Len() == 5 })
	// Keep b: stop the others, whichever leads.
	c.stop("a")
	c.stop("c")
	// b alone cannot elect itself: quorum is lost.
	b := c.nodes["b"]
	time.Sleep(time.Second) // an election timeout or three; nothing to wait for
	if b.IsLeader() {
		t.Fatal("b leads without a quorum")
	}
	c.stop("b")
	if err := Recover(c.dirs["b"], "b", []Peer{{ID: "b", RaftAddr: c.raft["b"]}}, nil); err != nil {
		t.Fatal(err)
	}
	b = c.start("b", nil)
	waitFor(t, "b leads after recovery", 20*time.Second, b.IsLeader)
	if b.Table().Len() != 5 {
		t.Fatalf("%d rules after recovery", b.Table().Len())
	}
	if _, err := b.Put(ctxT(t), tbRule("after-recovery", 1), nil); err != nil {
		t.Fatal(err)
	}
	d := c.start("d", func(cfg *Config) { cfg.Join = true })
	if err := d.JoinCluster(ctxT(t), []string{"grpc-b"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "d joins, is promoted and has every rule", 20*time.Second, func() bool {
		return b.voters() == 2 && d.Ready() && d.Table().Len() == 6
	})
	if err := Recover(c.dirs["b"], "b", []Peer{{ID: "x", RaftAddr: "127.0.0.1:1"}}, nil); err == nil {
		t.Fatal("recover accepted peers without the node itself")
	}
}
