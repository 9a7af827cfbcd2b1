package raftfsm

// Bootstrapping: the no-flag single node, --bootstrap-expect and --join,
// and registering this node's addresses in the FSM.

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/hashicorp/raft"
)

func (n *Node) bootstrap(peers []Peer) error {
	var conf raft.Configuration
	sorted := append([]Peer(nil), peers...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].ID < sorted[j].ID })
	for _, p := range sorted {
		conf.Servers = append(conf.Servers, raft.Server{ID: raft.ServerID(p.ID), Address: raft.ServerAddress(p.RaftAddr), Suffrage: raft.Voter})
	}
	if err := n.raft.BootstrapCluster(conf).Error(); err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
		return fmt.Errorf("bootstrap: %w", err)
	}
	n.state.Store(true)
	n.log.Info("bootstrapped a new cluster", "node", n.cfg.NodeID, "servers", len(conf.Servers))
	return nil
}

// probeInfo answers a probe on the Raft port. The stream layer listens
// before raft exists (raft needs the transport), so until then it answers
// from what Open knew: the node's identity and whether it found state.
func (n *Node) probeInfo() probeInfo {
	p := probeInfo{ID: n.cfg.NodeID, GRPCAddr: n.cfg.AdvertiseGRPC, HasState: n.state.Load()}
	if !n.raftUp.Load() {
		return p
	}
	p.HasState = p.HasState || n.raft.LastIndex() > 0
	p.Leader, _ = n.leader()
	p.Term, p.CommitIndex = n.raft.CurrentTerm(), n.raft.CommitIndex()
	return p
}

// bootstrapExpect waits until every peer answers; if none has state it
// bootstraps with the sorted peer list (every peer does the same), and if
// one has, it joins that cluster instead.
func (n *Node) bootstrapExpect() {
	defer n.wg.Done()
	for attempt := 0; ; attempt++ {
		if n.state.Load() || n.raft.LastIndex() > 0 {
			n.state.Store(true)
			return
		}
		reached, withState := 0, []string{}
		for _, p := range n.cfg.Peers {
			if p.ID == n.cfg.NodeID {
				reached++
				continue
			}
			info, err := n.probePeer(p.RaftAddr, 2*time.Second)
			if err != nil {
				if attempt%10 == 0 {
					n.log.Info("waiting for bootstrap peer", "peer", p.ID, "raft_addr", p.RaftAddr, "err", err)
				}
				continue
			}
			reached++
			if info.HasState {
				withState = append(withState, info.GRPCAddr)
			}
		}
		switch {
		case len(withState) > 0:
			n.log.Info("found an existing cluster: joining it", "via", withState)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err := n.cfg.JoinVia(ctx, withState, n.self())
			cancel()
			if err == nil {
				n.state.Store(true)
				return
			}
			n.log.Warn("join failed; retrying", "err", err)
		case reached == n.cfg.BootstrapExpect:
			if err := n.bootstrap(n.cfg.Peers); err != nil {
				n.log.Error("bootstrap failed; retrying", "err", err)
			} else {
				return
			}
		}
		select {
		case <-n.done:
			return
		case <-time.After(time.Second):
		}
	}
}

// JoinCluster asks the members at addrs (gRPC) to add this node, retrying
// until it is in or ctx ends. A node with Raft state does nothing.
func (n *Node) JoinCluster(ctx context.Context, addrs []string) error {
	if n.state.Load() {
		return nil
	}
	for backoff := 100 * time.Millisecond; ; backoff = min(2*backoff, 5*time.Second) {
		err := n.cfg.JoinVia(ctx, addrs, n.self())
		if err == nil {
			n.state.Store(true)
			n.log.Info("joined the cluster", "via", addrs)
			return nil
		}
		n.log.Warn("join failed; retrying", "via", addrs, "err", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("join %v: %w", addrs, err)
		case <-n.done:
			return errors.New("join: node closed")
		case <-time.After(backoff):
		}
	}
}

// register makes sure the FSM has this node's addresses, so that the
// others can route to it: directly when leading, else through the leader.
func (n *Node) register() {
	defer n.wg.Done()
	for {
		// Judge the FSM's record only once caught up: halfway through the
		// replay it can show this member registered and not yet drained by
		// its last shutdown. A member drained by its last shutdown registers
		// again: that lets it back into the view.
		caughtUp := n.CaughtUp()
		if m, ok := n.fsm.members()[n.cfg.NodeID]; caughtUp && ok && m.GRPCAddr == n.cfg.AdvertiseGRPC && m.RaftAddr == n.RaftAddr() && !m.Draining {
			return
		}
		if n.draining.Load() {
			return
		}
		if n.state.Load() && (caughtUp || n.fsm.members()[n.cfg.NodeID].ID == "") {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			var err error
			if n.IsLeader() {
				err = n.AddMember(ctx, n.cfg.NodeID, n.RaftAddr(), n.cfg.AdvertiseGRPC)
			} else if _, addr := n.leader(); addr != "" {
				err = n.cfg.JoinVia(ctx, []string{addr}, n.self())
			}
			cancel()
			if err != nil {
				n.log.Debug("register addresses: retrying", "err", err)
			}
		}
		caughtUpCh := n.caughtUpCh
		if caughtUp {
			caughtUpCh = nil
		}
		select {
		case <-n.done:
			return
		case <-n.leaderChanged():
		case <-n.fsm.ViewChanged():
		case <-caughtUpCh:
		case <-time.After(500 * time.Millisecond):
		}
	}
}
