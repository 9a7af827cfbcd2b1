package raftfsm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/cluster"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// registry stands in for gRPC between nodes in these tests: JoinVia and
// Health reach the node registered under a gRPC address directly.
type registry struct {
	mu    sync.Mutex
	nodes map[string]*Node
	down  map[string]bool
}

func (r *registry) get(addr string) *Node {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.down[addr] {
		return nil
	}
	return r.nodes[addr]
}

func (r *registry) joinVia(ctx context.Context, addrs []string, self cluster.Member) error {
	for _, a := range addrs {
		n := r.get(a)
		if n == nil {
			continue
		}
		err := n.AddMember(ctx, self.ID, self.RaftAddr, self.GRPCAddr)
		var le *rule.LeaderError
		if errors.As(err, &le) {
			if l := r.get(le.GRPCAddr); l != nil {
				err = l.AddMember(ctx, self.ID, self.RaftAddr, self.GRPCAddr)
			}
		}
		if err == nil {
			return nil
		}
	}
	return errors.New("no member took the join")
}

// health is the member health check the server answers: caught up and
// not draining.
func (r *registry) health(_ context.Context, addr string) bool {
	n := r.get(addr)
	return n != nil && n.CaughtUp() && !n.Draining()
}

func (r *registry) removeVia(ctx context.Context, leader, id string) error {
	n := r.get(leader)
	if n == nil {
		return errors.New("leader unreachable")
	}
	return n.RemoveMember(ctx, id)
}

func (r *registry) drainVia(ctx context.Context, leader, id string) error {
	n := r.get(leader)
	if n == nil {
		return errors.New("leader unreachable")
	}
	return n.DrainMember(ctx, id)
}

type testCluster struct {
	t     *testing.T
	reg   *registry
	nodes map[string]*Node
	dirs  map[string]string
	raft  map[string]string
	// held are Raft listeners bound by reserve, handed to the node at
	// its start: the address is known before the node starts, and no
	// one else can take the port in between.
	held map[string]net.Listener
}

func newTestCluster(t *testing.T) *testCluster {
	return &testCluster{t: t, reg: &registry{nodes: map[string]*Node{}, down: map[string]bool{}},
		nodes: map[string]*Node{}, dirs: map[string]string{}, raft: map[string]string{}, held: map[string]net.Listener{}}
}

// reserve binds a Raft listener for node id and returns its address; the
// node's next start serves on it.
func (c *testCluster) reserve(id string) string {
	c.t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { l.Close() })
	c.held[id] = l
	c.raft[id] = l.Addr().String()
	return c.raft[id]
}

func (c *testCluster) config(id string) Config {
	cfg := DefaultConfig()
	cfg.FastTimeouts()
	cfg.NodeID = id
	if c.dirs[id] == "" {
		c.dirs[id] = c.t.TempDir()
	}
	cfg.DataDir = c.dirs[id]
	cfg.RaftBind = "127.0.0.1:0"
	if a := c.raft[id]; a != "" {
		cfg.RaftBind = a
	}
	if l := c.held[id]; l != nil {
		cfg.RaftListener = l // the node owns (and closes) it from now on
		delete(c.held, id)
	}
	cfg.AdvertiseGRPC = "grpc-" + id
	cfg.DownAfter, cfg.UpAfter, cfg.LivenessInterval = time.Second, 2*time.Second, 100*time.Millisecond
	cfg.StabilizationTime = time.Second
	cfg.Health = c.reg.health
	cfg.DrainVia = c.reg.drainVia
	cfg.RemoveVia = c.reg.removeVia
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		cfg.Logger = slog.New(slog.NewTextHandler(tlog{c.t}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return cfg
}

type tlog struct{ t *testing.T }

func (w tlog) Write(p []byte) (int, error) { w.t.Log(string(p)); return len(p), nil }

// start opens node id with the config changed by mutate.
func (c *testCluster) start(id string, mutate func(*Config)) *Node {
	c.t.Helper()
	cfg := c.config(id)
	if mutate != nil {
		mutate(&cfg)
	}
	cfg.JoinVia = c.reg.joinVia
	n, err := Open(cfg)
	if err != nil {
		c.t.Fatalf("open %s: %v", id, err)
	}
	c.raft[id] = n.RaftAddr()
	c.nodes[id] = n
	c.reg.mu.Lock()
	c.reg.nodes[cfg.AdvertiseGRPC] = n
	delete(c.reg.down, cfg.AdvertiseGRPC)
	c.reg.mu.Unlock()
	c.t.Cleanup(func() { n.Close() })
	return n
}

// stop closes node id (its data stays for a restart).
func (c *testCluster) stop(id string) {
	c.reg.mu.Lock()
	c.reg.down["grpc-"+id] = true
	c.reg.mu.Unlock()
	c.nodes[id].Close()
	delete(c.nodes, id)
}

// waitFor polls cond until it holds or the generous bound passes.
func waitFor(t *testing.T, what string, bound time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, bound)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (c *testCluster) leader() *Node {
	for _, n := range c.nodes {
		if n.IsLeader() {
			return n
		}
	}
	return nil
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestSingleNodeBootstrapAndRestart(t *testing.T) {
	c := newTestCluster(t)
	n := c.start("a", nil)
	waitFor(t, "ready", 20*time.Second, n.Ready)
	if n.View().Len() != 1 {
		t.Fatalf("view %+v", n.View().Members())
	}
	r, err := n.Put(ctxT(t), tbRule("api", 10), nil)
	if err != nil {
		t.Fatal(err)
	}
	c.stop("a")
	n = c.start("a", nil)
	waitFor(t, "ready after restart", 20*time.Second, n.Ready)
	got, err := n.Get(ctxT(t), "api")
	if err != nil || got.Version != r.Version {
		t.Fatalf("after restart: %+v %v", got, err)
	}
}

func TestThreeNodesJoinReplicateFailover(t *testing.T) {
	c := newTestCluster(t)
	a := c.start("a", nil)
	waitFor(t, "a leads", 20*time.Second, a.IsLeader)
	for _, id := range []string{"b", "c"} {
		n := c.start(id, func(cfg *Config) { cfg.Join = true })
		if err := n.JoinCluster(ctxT(t), []string{"grpc-a"}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "view of 3 on every node", 20*time.Second, func() bool {
		for _, n := range c.nodes {
			if n.View().Len() != 3 || !n.Ready() {
				return false
			}
		}
		return true
	})
	// Autopilot promotes both once they have been healthy for the
	// stabilization time; until then the leader alone is a voter.
	waitFor(t, "b and c promoted to voters", 20*time.Second, func() bool { return a.voters() == 3 })
	// A write on a follower names the leader.
	_, err := c.nodes["b"].Put(ctxT(t), tbRule("api", 1), nil)
	var le *rule.LeaderError
	if !errors.As(err, &le) || le.ID != "a" || le.GRPCAddr != "grpc-a" {
		t.Fatalf("put on a follower: %v", err)
	}
	for i := 0; i < 20; i++ {
		if _, err := a.Put(ctxT(t), tbRule(fmt.Sprint("r", i), int64(i+1)), nil); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "followers catch up", 20*time.Second, func() bool {
		return c.nodes["b"].Table().Len() == 20 && c.nodes["c"].Table().Len() == 20
	})
	// Kill the leader: a new one is elected and has every rule.
	c.stop("a")
	waitFor(t, "a new leader", 20*time.Second, func() bool { return c.leader() != nil })
	l := c.leader()
	rules, err := l.List(ctxT(t))
	if err != nil || len(rules) != 20 {
		t.Fatalf("rules on the new leader: %d %v", len(rules), err)
	}
	if _, err := l.Put(ctxT(t), tbRule("after", 3), nil); err != nil {
		t.Fatal(err)
	}
	// The view drops a after DownAfter, and takes it back once it returns
	// and stays healthy for UpAfter.
	waitFor(t, "a dropped from the view", 20*time.Second, func() bool { return l.View().Len() == 2 })
	back := c.start("a", nil)
	waitFor(t, "a catches up", 20*time.Second, func() bool { return back.Table().Get("after") != nil })
	waitFor(t, "a back in the view", 20*time.Second, func() bool { return l.View().Len() == 3 })
}

func TestBootstrapExpect(t *testing.T) {
	c := newTestCluster(t)
	// Reserve raft ports first: every node must know every peer's address.
	ids := []string{"n1", "n2", "n3"}
	var peers []Peer
	for _, id := range ids {
		addr := c.reserve(id)
		peers = append(peers, Peer{ID: id, RaftAddr: addr})
	}
	for _, id := range ids {
		c.start(id, func(cfg *Config) { cfg.BootstrapExpect, cfg.Peers = 3, peers })
	}
	waitFor(t, "one leader and a view of 3", 30*time.Second, func() bool {
		l := c.leader()
		return l != nil && l.View().Len() == 3
	})
	leaders := 0
	for _, n := range c.nodes {
		if n.IsLeader() {
			leaders++
		}
	}
	if leaders != 1 {
		t.Fatalf("%d leaders", leaders)
	}
	// A fourth node with the same flags finds the cluster and joins it.
	late := "n4"
	c.reserve(late)
	n4 := c.start(late, func(cfg *Config) {
		cfg.BootstrapExpect = 4
		cfg.Peers = append(append([]Peer(nil), peers...), Peer{ID: late, RaftAddr: c.raft[late]})
	})
	waitFor(t, "n4 joins", 30*time.Second, func() bool { return n4.View().Len() == 4 })
	st, err := c.leader().Status()
	if err != nil || len(st.Members) != 4 {
		t.Fatalf("status: %+v %v", st, err)
	}
}

func TestNonVotersPastMaxVoters(t *testing.T) {
	c := newTestCluster(t)
	a := c.start("a", func(cfg *Config) { cfg.MaxVoters = 1 })
	waitFor(t, "a leads", 20*time.Second, a.IsLeader)
	b := c.start("b", func(cfg *Config) { cfg.Join = true })
	if err := b.JoinCluster(ctxT(t), []string{"grpc-a"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b in the view", 20*time.Second, func() bool { return a.View().Len() == 2 })
	st, _ := a.Status()
	for _, m := range st.Members {
		if m.ID == "b" && m.Voter {
			t.Fatal("b joined as a voter past MaxVoters")
		}
	}
	if err := a.RemoveMember(ctxT(t), "b"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b out of the view", 20*time.Second, func() bool { return a.View().Len() == 1 })
	if err := a.RemoveMember(ctxT(t), "nope"); !errors.Is(err, rule.ErrNotFound) {
		t.Fatalf("remove unknown: %v", err)
	}
}

// TestCloseTransfersLeadership: a leader that closes hands leadership to
// another voter first (what SIGTERM does), so the others do not wait for
// an election timeout.
func TestCloseTransfersLeadership(t *testing.T) {
	c := newTestCluster(t)
	var logs syncBuffer
	a := c.start("a", func(cfg *Config) {
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	})
	waitFor(t, "a leads", 20*time.Second, a.IsLeader)
	for _, id := range []string{"b", "c"} {
		n := c.start(id, func(cfg *Config) { cfg.Join = true })
		if err := n.JoinCluster(ctxT(t), []string{"grpc-a"}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "3 voters", 20*time.Second, func() bool { return a.voters() == 3 })
	c.stop("a")
	if !strings.Contains(logs.String(), "leadership transferred") {
		t.Fatalf("closing the leader did not transfer leadership; its log:\n%s", logs.String())
	}
	waitFor(t, "a new leader", 20*time.Second, func() bool { return c.leader() != nil })
}

// syncBuffer is a bytes.Buffer safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
