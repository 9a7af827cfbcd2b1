package server

import (
	"context"

	"github.com/tokenserver/tokenserver/internal/cluster"
	"github.com/tokenserver/tokenserver/internal/raftfsm"
)

// Standalone is a server's cluster of one over a Raft node that it does not
// own (usually raftfsm.NewInmem): its view is itself, fixed; it always
// leads and is ready; closing it leaves the Raft node open, so that tests
// can stop a server and start another over the same rules. Rules,
// snapshots and restores go through the Raft node, so they have the same
// semantics as in production. It is both the DataPlane and the
// ControlPlane.
type Standalone struct {
	*raftfsm.Node
	id, grpcAddr string
	view         *cluster.View
	never        chan struct{}
}

var (
	_ DataPlane    = (*Standalone)(nil)
	_ ControlPlane = (*Standalone)(nil)
)

// NewStandalone returns a one-node cluster over the Raft node rn.
func NewStandalone(id, grpcAddr string, rn *raftfsm.Node) *Standalone {
	return &Standalone{Node: rn, id: id, grpcAddr: grpcAddr,
		view:  cluster.NewView(1, []cluster.Member{{ID: id, GRPCAddr: grpcAddr, Voter: true}}),
		never: make(chan struct{})}
}

// Deps is what New needs of a node over s.
func (s *Standalone) Deps() Deps { return Deps{Data: s, Control: s} }

// ID implements DataPlane.
func (s *Standalone) ID() string { return s.id }

// View implements DataPlane.
func (s *Standalone) View() *cluster.View { return s.view }

// ViewChanged implements DataPlane: the view never changes.
func (s *Standalone) ViewChanged() <-chan struct{} { return s.never }

// Leader implements DataPlane.
func (s *Standalone) Leader() (string, string) { return s.id, s.grpcAddr }

// Ready implements DataPlane.
func (s *Standalone) Ready() bool { return true }

// CaughtUp implements DataPlane.
func (s *Standalone) CaughtUp() bool { return true }

// Drain implements ControlPlane: a standalone node owns every key; there
// is nowhere to move them.
func (s *Standalone) Drain(context.Context) error { return nil }

// DrainMember implements ControlPlane.
func (s *Standalone) DrainMember(context.Context, string) error {
	return failf(ErrNoRaft, "this node runs without Raft and has no members")
}

// AddMember implements ControlPlane: a standalone node has no members to
// add.
func (s *Standalone) AddMember(context.Context, string, string, string) error {
	return failf(ErrNoRaft, "this node runs without Raft and cannot take members")
}

// RemoveMember implements ControlPlane.
func (s *Standalone) RemoveMember(context.Context, string) error {
	return failf(ErrNoRaft, "this node runs without Raft and has no members")
}

// Status implements ControlPlane.
func (s *Standalone) Status() (Status, error) {
	t := s.Table()
	return Status{ID: s.id, State: "Leader", CommitIndex: t.Version, AppliedIndex: t.Version, LastIndex: t.Version,
		Leader: s.id, Epoch: 1, Members: []MemberStatus{{ID: s.id, GRPCAddr: s.grpcAddr, Voter: true, Leader: true, Live: true}}}, nil
}

// Close implements ControlPlane: the Raft node stays open (its owner
// closes it).
func (s *Standalone) Close() error { return nil }
