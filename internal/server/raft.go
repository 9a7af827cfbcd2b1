package server

import (
	"cmp"
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tokenserver/tokenserver/internal/raftfsm"
)

// RaftCluster adapts the Raft node of internal/raftfsm to DataPlane and
// ControlPlane: its Status becomes the server's.
type RaftCluster struct {
	*raftfsm.Node
}

var (
	_ DataPlane    = RaftCluster{}
	_ ControlPlane = RaftCluster{}
)

// Status implements ControlPlane.
func (r RaftCluster) Status() (Status, error) {
	st, err := r.Node.Status()
	if err != nil {
		return Status{}, err
	}
	out := Status{ID: st.ID, State: st.State, Term: st.Term, CommitIndex: st.CommitIndex, AppliedIndex: st.AppliedIndex,
		LastIndex: st.LastIndex, LastContact: st.LastContact, Leader: st.Leader, Epoch: st.Epoch, Draining: st.Draining,
		Members: make([]MemberStatus, len(st.Members))}
	for i, m := range st.Members {
		out.Members[i] = MemberStatus{ID: m.ID, RaftAddr: m.RaftAddr, GRPCAddr: m.GRPCAddr, Voter: m.Voter, Leader: m.Leader,
			Live: m.Live, Suffrage: m.Suffrage, Healthy: m.Healthy, HealthFor: m.HealthFor, Stabilization: m.Stabilization}
	}
	return out, nil
}

// RaftHooks are the server's ends of the Raft node's callbacks
// (raftfsm.Config.ObserveApply and OnCaughtUp). They are made before
// either node exists and handed to both as values: the Raft node calls
// them, the server Node reads what they recorded.
type RaftHooks struct {
	apply    prometheus.Histogram
	caughtUp chan struct{}
}

// NewRaftHooks returns hooks that record nothing yet.
func NewRaftHooks() *RaftHooks {
	return &RaftHooks{
		apply:    newApplyHistogram(),
		caughtUp: make(chan struct{}, 1),
	}
}

// ObserveApply records the time one entry took to commit and apply
// (raftfsm.Config.ObserveApply).
func (h *RaftHooks) ObserveApply(d time.Duration) { h.apply.Observe(d.Seconds()) }

// CaughtUp tells the node to re-read its readiness now rather than at its
// next poll (raftfsm.Config.OnCaughtUp). It never blocks.
func (h *RaftHooks) CaughtUp() {
	select {
	case h.caughtUp <- struct{}{}:
	default:
	}
}

// OpenRaft opens the Raft node of a server node configured by cfg (whose
// AdvertiseGRPC must be the address peers dial, see Listen) and returns
// what New needs over it. rc is completed with the node's peer TLS, its
// advertised address and the hooks; join lists gRPC addresses of members
// to ask to add this node, once it serves.
func OpenRaft(cfg Config, rc raftfsm.Config, join []string) (Deps, error) {
	sec := &cfg.Security
	multi := rc.BootstrapExpect > 1 || len(join) > 0 || len(rc.Peers) > 1
	if err := CheckPeers(sec, multi, rc.RaftBind); err != nil {
		return Deps{}, err
	}
	peerServer, peerClient := sec.peerTLS()
	peers := NewPeers(peerClient)
	peers.expectIDs(sec)
	hooks := NewRaftHooks()
	rc.PeerServerTLS, rc.PeerClientTLS = peerServer, peerClient
	rc.AdvertiseGRPC = cfg.AdvertiseGRPC
	rc.Health, rc.JoinVia, rc.DrainVia, rc.RemoveVia = peers.Health, peers.JoinVia, peers.DrainVia, peers.RemoveVia
	rc.ObserveApply, rc.OnCaughtUp = hooks.ObserveApply, hooks.CaughtUp
	rc.Join = len(join) > 0
	// The leader's cap travels in each rule write, so replicas agree.
	rc.MaxRules = cmp.Or(rc.MaxRules, cfg.MaxRules)
	rc.MaxRuleTableBytes = cmp.Or(rc.MaxRuleTableBytes, cfg.MaxRuleTableBytes)
	if rc.Logger == nil {
		rc.Logger = cfg.Logger
	}
	rn, err := raftfsm.Open(rc)
	if err != nil {
		peers.close()
		return Deps{}, err
	}
	rcl := RaftCluster{rn}
	d := Deps{Data: rcl, Control: rcl, Peers: peers, Hooks: hooks}
	if len(join) > 0 {
		d.Join = func(ctx context.Context) error { return rn.JoinCluster(ctx, join) }
	}
	return d, nil
}
