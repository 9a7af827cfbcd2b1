package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/tokenserver/tokenserver/internal/cluster"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// Standalone is a cluster of one node over a rule.Store without Raft: its
// view is itself, it always leads and is ready. Tests use it with a
// rule.MemStore. It is both the DataPlane and the ControlPlane.
type Standalone struct {
	rule.Store
	id, grpcAddr string
	view         *cluster.View
	never        chan struct{}
}

var (
	_ DataPlane    = (*Standalone)(nil)
	_ ControlPlane = (*Standalone)(nil)
)

// NewStandalone returns a one-node cluster over store.
func NewStandalone(id, grpcAddr string, store rule.Store) *Standalone {
	return &Standalone{Store: store, id: id, grpcAddr: grpcAddr,
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

// Close implements ControlPlane.
func (s *Standalone) Close() error { return nil }

// SnapshotSave implements ControlPlane: the rules in the snapshot format.
func (s *Standalone) SnapshotSave(context.Context) (io.ReadCloser, error) {
	t := s.Table()
	rules := map[string]*rule.Rule{}
	for _, r := range t.Rules() {
		rules[r.Name] = r
	}
	b, err := json.Marshal(map[string]any{"index": t.Version, "rules": rules})
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

// RestoreRules implements ControlPlane: a standalone node cannot replace
// its table in one step.
func (s *Standalone) RestoreRules(context.Context, io.Reader) (int, uint64, error) {
	return 0, 0, failf(ErrNoRaft, "this node runs without Raft and cannot restore a snapshot")
}
