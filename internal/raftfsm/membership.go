package raftfsm

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tokenserver/tokenserver/internal/rule"
	raftv1 "github.com/tokenserver/tokenserver/proto/tokenserver/raft/v1"
)

// Membership: joins (checked, always as a non-voter), removals that keep a
// quorum, draining before shutdown, and the status of every member.

// ErrRefused marks a membership change refused because it is unsafe or
// does not match the cluster (a join whose address does not answer as the
// node id, a removal that would lose quorum): FailedPrecondition.
var ErrRefused = errors.New("refused")

// refusedError is an ErrRefused with its own message.
type refusedError struct{ msg string }

func (e *refusedError) Error() string        { return e.msg }
func (e *refusedError) Is(target error) bool { return target == ErrRefused }

func refused(format string, args ...any) error {
	return &refusedError{msg: fmt.Sprintf(format, args...)}
}

// AddMember adds a node (on the leader; elsewhere a *rule.LeaderError). The
// node at raftAddr must answer the Raft port's probe as id with grpcAddr.
// A new node enters as a non-voter; autopilot promotes it once it has been
// healthy for the stabilization time. A member already in with the same
// Raft address only has its addresses recorded again (its registration on
// start). An id already in with another address replaces the old member
// only when that one has been unreachable for the stabilization time.
func (n *Node) AddMember(ctx context.Context, id, raftAddr, grpcAddr string) error {
	if id == "" || raftAddr == "" || grpcAddr == "" {
		return rule.Invalid("join needs an id, a raft address and a grpc address")
	}
	if err := n.awaitLeader(ctx); err != nil {
		return err
	}
	info, err := n.probePeer(raftAddr, 3*time.Second)
	switch {
	case err != nil:
		return refused("join %s: no tokenserver answers at raft address %s: %v", id, raftAddr, err)
	case info.ID != id:
		return refused("join %s: raft address %s answers as node %q", id, raftAddr, info.ID)
	case info.GRPCAddr != grpcAddr:
		return refused("join %s: the node at %s advertises gRPC address %s, not %s", id, raftAddr, info.GRPCAddr, grpcAddr)
	}
	cf := n.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return fmt.Errorf("read configuration: %w", err)
	}
	present := false
	for _, s := range cf.Configuration().Servers {
		switch {
		case string(s.ID) == id && string(s.Address) == raftAddr:
			present = true
		case string(s.ID) == id:
			if err := n.replaceable(id, string(s.Address)); err != nil {
				return err
			}
			if err := n.raft.RemoveServer(s.ID, 0, 10*time.Second).Error(); err != nil {
				return fmt.Errorf("replace %s: %w", id, err)
			}
			n.log.Warn("member replaced: its old address was unreachable", "member", id, "old_raft_addr", string(s.Address), "raft_addr", raftAddr)
		case string(s.Address) == raftAddr:
			return refused("join %s: raft address %s belongs to member %s", id, raftAddr, s.ID)
		}
	}
	if !present {
		if err := n.raft.AddNonvoter(raft.ServerID(id), raft.ServerAddress(raftAddr), 0, 10*time.Second).Error(); err != nil {
			return fmt.Errorf("add %s: %w", id, err)
		}
		n.log.Info("member added as a non-voter; autopilot promotes it once stable", "member", id, "raft_addr", raftAddr, "grpc_addr", grpcAddr,
			"stabilization", n.cfg.StabilizationTime.String())
	}
	if err := n.applyMember(ctx, entrySetMember, memberInfo{ID: id, GRPCAddr: grpcAddr, RaftAddr: raftAddr}); err != nil {
		return err
	}
	n.kickLiveness() // a member back from a restart enters the view now
	return nil
}

// replaceable reports why member id, at oldAddr, may not be replaced: it
// answers there, or the leader has not seen it unreachable for the
// stabilization time.
func (n *Node) replaceable(id, oldAddr string) error {
	if info, err := n.probePeer(oldAddr, time.Second); err == nil && info.ID == id {
		return refused("join %s: the member with that id still answers at %s; remove it first", id, oldAddr)
	}
	h, seen := n.health.get(id)
	if !seen || h.OK || time.Since(h.Since) < n.cfg.StabilizationTime {
		return refused("join %s: the member with that id (at %s) has not been unreachable for %s; retry later or remove it first", id, oldAddr, n.cfg.StabilizationTime)
	}
	return nil
}

func (n *Node) applyMember(ctx context.Context, t byte, m memberInfo) error {
	entry, err := encodeEntry(t, &raftv1.MemberChange{Member: memberToPB(m)})
	if err != nil {
		return err
	}
	res, err := n.apply(ctx, entry)
	if err != nil {
		return err
	}
	return res.err
}

// RemoveMember takes a node out of the cluster (on the leader). Removing the
// last voter, or a voter whose removal would leave fewer reachable voters
// than a quorum of those left, is refused.
func (n *Node) RemoveMember(ctx context.Context, id string) error {
	if err := n.awaitLeader(ctx); err != nil {
		return err
	}
	cf := n.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return fmt.Errorf("read configuration: %w", err)
	}
	var target *raft.Server
	var rest []raft.Server
	for _, s := range cf.Configuration().Servers {
		if string(s.ID) == id {
			target = &s
		} else if s.Suffrage == raft.Voter {
			rest = append(rest, s)
		}
	}
	if _, ok := n.fsm.members()[id]; target == nil && !ok {
		return fmt.Errorf("member %q: %w", id, rule.ErrNotFound)
	}
	if target != nil && target.Suffrage == raft.Voter {
		if len(rest) == 0 {
			return refused("remove %s: it is the last voter", id)
		}
		alive := 0
		members := n.fsm.members()
		for _, s := range rest {
			if n.checkHealth(string(s.ID), members[string(s.ID)].GRPCAddr, false, time.Now()) {
				alive++
			}
		}
		if alive < quorum(len(rest)) {
			return refused("remove %s: only %d of the %d voters left answer, fewer than a quorum of %d", id, alive, len(rest), quorum(len(rest)))
		}
	}
	if target != nil && id == n.cfg.NodeID {
		return n.removeSelf(ctx)
	}
	if err := n.removeMember(ctx, id); err != nil {
		return err
	}
	n.log.Info("member removed", "member", id)
	return nil
}

// removeMember removes id from the Raft configuration and the FSM.
func (n *Node) removeMember(ctx context.Context, id string) error {
	cf := n.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return fmt.Errorf("read configuration: %w", err)
	}
	if slices.ContainsFunc(cf.Configuration().Servers, func(s raft.Server) bool { return string(s.ID) == id }) {
		if err := n.raft.RemoveServer(raft.ServerID(id), 0, 10*time.Second).Error(); err != nil {
			return fmt.Errorf("remove %s: %w", id, err)
		}
	}
	return n.applyMember(ctx, entryRemoveMember, memberInfo{ID: id})
}

// DrainMember takes member id out of the routing view until it registers
// again on its next start (on the leader; elsewhere a *rule.LeaderError).
func (n *Node) DrainMember(ctx context.Context, id string) error {
	if err := n.awaitLeader(ctx); err != nil {
		return err
	}
	if err := n.applyMember(ctx, entryDrainMember, memberInfo{ID: id}); err != nil {
		return err
	}
	n.log.Info("member drained: out of the routing view", "member", id)
	return nil
}

// Drain takes this node out of the routing view before it shuts down, so
// that its keys move to their next owners while it still answers (and
// forwards): through the leader, by DrainVia when another node leads. It
// returns once this node has applied the view without itself, or ctx ends.
// The node reports not ready from the start of Drain on. A removed node
// has nothing to leave: Drain returns at once.
func (n *Node) Drain(ctx context.Context) error {
	n.draining.Store(true)
	if n.removed.Load() {
		return nil // no longer a member: there is no view to leave
	}
	if live := n.fsm.live(); len(live) == 1 && live[0] == n.cfg.NodeID {
		// The only owner: there is nowhere to move the keys, and an empty
		// view would only turn the last calls into errors.
		return nil
	}
	for n.inView() {
		err := n.DrainMember(ctx, n.cfg.NodeID)
		var le *rule.LeaderError
		if errors.As(err, &le) && n.cfg.DrainVia != nil {
			err = n.cfg.DrainVia(ctx, le.GRPCAddr, n.cfg.NodeID)
		}
		if err == nil {
			break
		}
		n.log.Warn("leaving the routing view: retrying", "err", err)
		select {
		case <-ctx.Done():
			return fmt.Errorf("leave the routing view: %w", err)
		case <-time.After(100 * time.Millisecond):
		}
	}
	for n.inView() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("leave the routing view: %w", ctx.Err())
		case <-n.fsm.ViewChanged():
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// Draining reports whether Drain was called.
func (n *Node) Draining() bool { return n.draining.Load() }

// MemberStatus is one member as the local node sees it.
type MemberStatus struct {
	ID       string
	RaftAddr string
	GRPCAddr string
	Voter    bool
	Leader   bool
	Live     bool
	// Suffrage is voter, nonvoter or staging (a non-voter autopilot will
	// promote once it is stable).
	Suffrage string
	// Healthy and HealthFor are the leader's last health check of the
	// member and how long it has held; known on the leader only.
	Healthy   bool
	HealthFor time.Duration
	// Stabilization is autopilot's state in words.
	Stabilization string
}

// Status is the local node's view of the cluster.
type Status struct {
	ID           string
	State        string
	Term         uint64
	CommitIndex  uint64
	AppliedIndex uint64
	LastIndex    uint64
	LastContact  time.Time
	Leader       string
	Epoch        uint64
	Draining     bool
	Members      []MemberStatus
}

// Status returns the local node's view of the cluster. AppliedIndex counts
// every entry type (raft's applied index once the FSM has caught up with
// it), so it equals CommitIndex on a node that is not behind.
func (n *Node) Status() (Status, error) {
	cf := n.raft.GetConfiguration()
	if err := cf.Error(); err != nil {
		return Status{}, fmt.Errorf("read configuration: %w", err)
	}
	leaderID, _ := n.leader()
	applied := n.fsm.AppliedIndex()
	if ai := n.raft.AppliedIndex(); n.appliedThrough(ai) {
		applied = ai
	}
	st := Status{
		ID:           n.cfg.NodeID,
		State:        n.raft.State().String(),
		Term:         n.raft.CurrentTerm(),
		CommitIndex:  n.raft.CommitIndex(),
		AppliedIndex: applied,
		LastIndex:    n.raft.LastIndex(),
		LastContact:  n.raft.LastContact(),
		Leader:       leaderID,
		Epoch:        n.fsm.View().Epoch,
		Draining:     n.draining.Load(),
	}
	members, live := n.fsm.members(), n.fsm.live()
	servers := cf.Configuration().Servers
	voters := 0
	for _, s := range servers {
		if s.Suffrage == raft.Voter {
			voters++
		}
	}
	p, now := n.policy(), time.Now()
	for _, s := range servers {
		id := string(s.ID)
		ms := MemberStatus{
			ID: id, RaftAddr: string(s.Address), GRPCAddr: members[id].GRPCAddr,
			Voter: s.Suffrage == raft.Voter, Leader: id == leaderID, Live: slices.Contains(live, id),
			Suffrage: "nonvoter",
		}
		if ms.Voter {
			ms.Suffrage = "voter"
		}
		if h, ok := n.health.get(id); ok && n.IsLeader() {
			ms.Healthy, ms.HealthFor = h.OK, now.Sub(h.Since)
			ms.Suffrage, ms.Stabilization = p.describe(apMember{ID: id, Voter: ms.Voter, Healthy: h.OK, For: ms.HealthFor}, voters)
		}
		st.Members = append(st.Members, ms)
	}
	sort.Slice(st.Members, func(i, j int) bool { return st.Members[i].ID < st.Members[j].ID })
	return st, nil
}
