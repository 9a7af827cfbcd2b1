package raftfsm

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tokenserver/tokenserver/internal/cluster"
)

// InmemConfig is the configuration of an in-memory node with that id: one
// voter that bootstraps itself over raft's in-memory stores and transport,
// with timeouts short enough that it leads within milliseconds. It is for
// tests of other packages: the rules go through the same FSM, entries and
// rule.Set as in production. Its gRPC address is id unless set.
func InmemConfig(id string) Config {
	c := DefaultConfig()
	c.NodeID, c.AdvertiseGRPC, c.InMemory = id, id, true
	c.RaftBind = ""
	c.HeartbeatTimeout, c.ElectionTimeout = 20*time.Millisecond, 20*time.Millisecond
	c.LeaderLeaseTimeout, c.CommitTimeout = 20*time.Millisecond, time.Millisecond
	c.LivenessInterval = 50 * time.Millisecond
	c.DeadMemberAfter = 0
	return c
}

// NewInmem opens an in-memory node (InmemConfig) with that id and rule cap
// (0: rule.DefaultMaxRules), and returns once it leads and is ready: rule
// writes then succeed at once.
func NewInmem(id string, maxRules int) (*Node, error) {
	cfg := InmemConfig(id)
	cfg.MaxRules = maxRules
	n, err := Open(cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.WaitReady(ctx); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

// WaitReady waits until the node is ready (see Ready) or ctx ends.
func (n *Node) WaitReady(ctx context.Context) error {
	for !n.Ready() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("node %s not ready: %w", n.cfg.NodeID, ctx.Err())
		case <-n.fsm.ViewChanged():
		case <-n.leaderChanged():
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}

// openInmem is Open for cfg.InMemory: no files, no listener, bootstrapped
// as a cluster of one.
func openInmem(cfg Config) (*Node, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Health == nil {
		cfg.Health = func(context.Context, string) bool { return true }
	}
	if cfg.JoinVia == nil {
		cfg.JoinVia = func(context.Context, []string, cluster.Member) error {
			return fmt.Errorf("an in-memory node joins no cluster")
		}
	}
	n := &Node{cfg: cfg, log: log, fsm: NewFSM(), hbFailing: map[string]time.Time{}, done: make(chan struct{}), started: time.Now(), kick: make(chan struct{}, 1), caughtUpCh: make(chan struct{})}
	ch := make(chan struct{})
	n.leaderSig.Store(&ch)
	store := raft.NewInmemStore()
	n.logs = store
	n.snaps = raft.NewInmemSnapshotStore()
	_, trans := raft.NewInmemTransport(raft.ServerAddress("inmem-" + cfg.NodeID))
	n.trans = trans
	var err error
	if n.raft, err = newRaft(cfg.raftConfig(newHCLogger(log, "raft")), n.fsm, store, store, n.snaps, trans); err != nil {
		return nil, fmt.Errorf("start in-memory raft: %w", err)
	}
	n.raftUp.Store(true)
	n.observe()
	if err := n.bootstrap([]Peer{{ID: cfg.NodeID, RaftAddr: n.RaftAddr()}}); err != nil {
		n.Close()
		return nil, err
	}
	n.wg.Add(3)
	go n.register()
	go n.liveness()
	go n.readiness()
	return n, nil
}
