// Package testcluster runs N real tokenserver nodes (gRPC, HTTP off, Raft)
// in one test process on 127.0.0.1:0, with helpers to find leaders and key
// owners, stop and restart nodes.
package testcluster

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tokenserver/tokenserver/internal/cluster"
	"github.com/tokenserver/tokenserver/internal/raftfsm"
	"github.com/tokenserver/tokenserver/internal/server"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// Node is one running (or stopped) node.
type Node struct {
	ID       string
	DataDir  string
	GRPCAddr string
	RaftAddr string
	*server.Node

	raft   *raftfsm.Node
	conn   *grpc.ClientConn
	cancel context.CancelFunc
	done   chan error
}

// Token returns a TokenService client connected to this node.
func (n *Node) Token() pb.TokenServiceClient { return pb.NewTokenServiceClient(n.conn) }

// Admin returns an AdminService client connected to this node.
func (n *Node) Admin() pb.AdminServiceClient { return pb.NewAdminServiceClient(n.conn) }

// Cluster returns the node's Raft node (rules, view, membership).
func (n *Node) Cluster() *raftfsm.Node { return n.raft }

// Running reports whether the node serves.
func (n *Node) Running() bool { return n.Node != nil }

// Cluster is a set of nodes.
type Cluster struct {
	t     testing.TB
	Nodes []*Node
	// Mutate, when set, changes each node's options before it starts.
	Mutate func(*server.Options)
	// PKI, when set, runs every node with TLS, mutual TLS between peers and
	// token auth (PKI.Security), and the nodes' clients (Token, Admin) dial
	// over TLS with the admin token.
	PKI *PKI
	// ReloadInterval is how often secure nodes re-read their files (0: the
	// default of 5 s).
	ReloadInterval time.Duration
}

// New starts n nodes: the first bootstraps, the others join through it.
// Everything stops in t.Cleanup.
func New(t testing.TB, n int) *Cluster { return NewWith(t, n, nil) }

// NewWith is New with mutate applied to every node's options.
func NewWith(t testing.TB, n int, mutate func(*server.Options)) *Cluster {
	return newCluster(&Cluster{t: t, Mutate: mutate}, n)
}

// NewSecure is New with TLS on every port, mutual TLS between the nodes
// and token auth: certificates and tokens in c.PKI.
func NewSecure(t testing.TB, n int, mutate func(*server.Options)) *Cluster {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = nodeID(i)
	}
	return newCluster(&Cluster{t: t, Mutate: mutate, PKI: NewPKI(t, ids...), ReloadInterval: 100 * time.Millisecond}, n)
}

func nodeID(i int) string { return fmt.Sprintf("node-%d", i) }

func newCluster(c *Cluster, n int) *Cluster {
	t := c.t
	t.Cleanup(c.StopAll)
	for i := 0; i < n; i++ {
		node := &Node{ID: nodeID(i), DataDir: t.TempDir(), GRPCAddr: "127.0.0.1:0", RaftAddr: "127.0.0.1:0"}
		c.Nodes = append(c.Nodes, node)
		var join []string
		if i > 0 {
			join = []string{c.Nodes[0].GRPCAddr}
		}
		c.start(node, join)
		if i == 0 {
			c.WaitFor("the first node leads", func() bool { return c.Leader() != nil })
		}
	}
	c.WaitFor(fmt.Sprintf("a view of %d on every node", n), func() bool { return c.ViewsAgree(n) })
	// Joined nodes enter as non-voters; wait for autopilot to promote them
	// so that the cluster tolerates failures as a voter set of n would.
	c.WaitFor(fmt.Sprintf("%d voters", n), func() bool { return c.Voters() >= min(n, raftfsm.DefaultConfig().MaxVoters) })
	return c
}

// WaitForRule waits until every running node has the rule named name in
// its local table.
func (c *Cluster) WaitForRule(name string) {
	c.t.Helper()
	c.WaitFor("rule "+name+" on every node", func() bool {
		for _, n := range c.Nodes {
			if n.Running() && n.Cluster().Table().Get(name) == nil {
				return false
			}
		}
		return true
	})
}

// Voters counts the voters in the leader's configuration (0 without a
// leader).
func (c *Cluster) Voters() int {
	l := c.Leader()
	if l == nil {
		return 0
	}
	st, err := l.Cluster().Status()
	if err != nil {
		return 0
	}
	v := 0
	for _, m := range st.Members {
		if m.Voter {
			v++
		}
	}
	return v
}

func (c *Cluster) start(n *Node, join []string) {
	c.t.Helper()
	scfg := server.DefaultConfig()
	scfg.GRPCAddr, scfg.HTTPAddr = n.GRPCAddr, ""
	scfg.ShutdownGrace = 2 * time.Second
	scfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		scfg.Logger = slog.New(slog.NewTextHandler(tlog{c.t, n.ID}, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	rcfg := raftfsm.DefaultConfig()
	rcfg.FastTimeouts()
	rcfg.NodeID, rcfg.DataDir, rcfg.RaftBind = n.ID, n.DataDir, n.RaftAddr
	rcfg.DownAfter, rcfg.UpAfter, rcfg.LivenessInterval = time.Second, 2*time.Second, 100*time.Millisecond
	rcfg.StabilizationTime = 500 * time.Millisecond
	if c.PKI != nil {
		scfg.Security = c.PKI.Security(c.t, n.ID, c.ReloadInterval)
	}
	opts := server.Options{Server: scfg, Raft: rcfg, Join: join}
	if c.Mutate != nil {
		c.Mutate(&opts)
	}
	// server.Start's steps, keeping the Raft node for the helpers.
	lis, err := server.Listen(opts.Server)
	if err != nil {
		c.t.Fatalf("start %s: %v", n.ID, err)
	}
	if opts.Server.AdvertiseGRPC == "" {
		opts.Server.AdvertiseGRPC = lis.GRPC.Addr().String()
	}
	deps, err := server.OpenRaft(opts.Server, opts.Raft, opts.Join)
	if err != nil {
		lis.Close()
		c.t.Fatalf("start %s: %v", n.ID, err)
	}
	sn, err := server.New(opts.Server, deps)
	if err != nil {
		deps.Control.Close()
		lis.Close()
		c.t.Fatalf("start %s: %v", n.ID, err)
	}
	n.Node, n.raft = sn, deps.Data.(server.RaftCluster).Node
	n.GRPCAddr = lis.GRPC.Addr().String()
	n.RaftAddr = n.raft.RaftAddr()
	dial := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if c.PKI != nil {
		dial = c.PKI.DialOptions("admin")
	}
	conn, err := grpc.NewClient(n.GRPCAddr, dial...)
	if err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n.conn, n.cancel, n.done = conn, cancel, make(chan error, 1)
	go func() { n.done <- sn.Serve(ctx, lis) }()
}

// Stop stops node i gracefully (a leader hands over); its data stays.
func (c *Cluster) Stop(i int) {
	n := c.Nodes[i]
	if !n.Running() {
		return
	}
	n.cancel()
	if err := <-n.done; err != nil {
		c.t.Errorf("%s: serve: %v", n.ID, err)
	}
	n.conn.Close()
	n.Node, n.raft = nil, nil
}

// Restart starts stopped node i again on the same addresses and data.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	c.start(c.Nodes[i], nil)
}

// StopAll stops every running node.
func (c *Cluster) StopAll() {
	for i := range c.Nodes {
		c.Stop(i)
	}
}

// Leader returns the running node that leads, or nil.
func (c *Cluster) Leader() *Node {
	for _, n := range c.Nodes {
		if n.Running() {
			if n.Cluster().IsLeader() {
				return n
			}
		}
	}
	return nil
}

// Follower returns a running node that does not lead, or nil.
func (c *Cluster) Follower() *Node {
	l := c.Leader()
	for _, n := range c.Nodes {
		if n.Running() && n != l {
			return n
		}
	}
	return nil
}

// Node returns the node with that id.
func (c *Cluster) Node(id string) *Node {
	for _, n := range c.Nodes {
		if n.ID == id {
			return n
		}
	}
	return nil
}

// View is the routing view of the first running node.
func (c *Cluster) View() *cluster.View {
	for _, n := range c.Nodes {
		if n.Running() {
			return n.Cluster().View()
		}
	}
	return nil
}

// OwnerOf returns the node that owns key in the current view.
func (c *Cluster) OwnerOf(key string) *Node {
	m, ok := c.View().Owner(key)
	if !ok {
		return nil
	}
	return c.Node(m.ID)
}

// KeyOwnedBy returns a key that node id owns, with the given prefix.
func (c *Cluster) KeyOwnedBy(id, prefix string) string {
	v := c.View()
	for i := 0; ; i++ {
		k := fmt.Sprintf("%s-%d", prefix, i)
		if m, _ := v.Owner(k); m.ID == id {
			return k
		}
	}
}

// ViewsAgree reports whether every running node has the same view of n
// members and is ready.
func (c *Cluster) ViewsAgree(n int) bool {
	var epoch uint64
	for _, node := range c.Nodes {
		if !node.Running() {
			continue
		}
		v := node.Cluster().View()
		if v.Len() != n || !node.Cluster().Ready() {
			return false
		}
		if epoch != 0 && v.Epoch != epoch {
			return false
		}
		epoch = v.Epoch
	}
	return true
}

// WaitFor polls cond every 20 ms until it holds, failing the test after a
// generous 30 s (the suite runs under -race on busy machines).
func (c *Cluster) WaitFor(what string, cond func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			c.t.Fatalf("%s: not within 30s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

type tlog struct {
	t  testing.TB
	id string
}

func (w tlog) Write(p []byte) (int, error) { w.t.Log(w.id + ": " + string(p)); return len(p), nil }
