package raftfsm

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tokenserver/tokenserver/internal/rule"
)

// Removal: a member removed from the Raft configuration stops deciding at
// once. It reports not ready, Removed reports true (the server refuses
// data-plane calls on it), and it idles: raft does not let a node outside
// the configuration start an election. It records its removal in the data
// dir's stable store (removedKey) as soon as it learns of it, so that,
// restarted on its old data dir, it refuses to start (ErrRemoved) even
// after the configurations that listed it were compacted into a snapshot
// that no longer does; without the record (a removal learned only while
// stopped), the latest configuration in the snapshot and the log decides
// (removedAtStart).

// ErrRemoved means this node was removed from the cluster: its data dir
// belongs to a membership it no longer has.
var ErrRemoved = errors.New("this node was removed; start with a fresh --data-dir and --join")

// What checkRemoved has seen of this node in the configuration.
const (
	memberUnknown  uint32 = iota // never listed yet (joining)
	memberListed                 // listed at the last check
	memberUnlisted               // listed before, not at the last check
)

// removedMessage is logged once when the node finds it was removed.
const removedMessage = "this node was removed from the cluster: it no longer serves or decides; start it with a fresh --data-dir and --join to add it again"

// Removed reports whether this node has learned that it was removed from
// the Raft configuration. It stays true.
func (n *Node) Removed() bool { return n.removed.Load() }

// configuration returns the latest Raft configuration's servers (ok
// false while raft cannot say).
func (n *Node) configuration() ([]raft.Server, bool) {
	cf := n.raft.GetConfiguration()
	if cf.Error() != nil {
		return nil, false
	}
	return cf.Configuration().Servers, true
}

func (n *Node) listed(servers []raft.Server) bool {
	return slices.ContainsFunc(servers, func(s raft.Server) bool { return string(s.ID) == n.cfg.NodeID })
}

// checkRemoved latches removed once a configuration that does not list
// this node follows one that did, on two checks in a row. A node catching
// up after its join meets older configurations without it first: those
// do not count. (raft's latest configuration only moves forward, except
// when a follower's uncommitted entries are truncated.)
func (n *Node) checkRemoved() {
	if n.removed.Load() || !n.state.Load() {
		return
	}
	servers, ok := n.configuration()
	switch {
	case !ok:
	case n.listed(servers):
		n.member.Store(memberListed)
	case len(servers) == 0 || n.member.Load() == memberUnknown:
	case n.member.CompareAndSwap(memberListed, memberUnlisted):
		// once more on the next check
	default:
		if n.removed.CompareAndSwap(false, true) {
			n.log.Error(removedMessage, "node", n.cfg.NodeID)
			n.recordRemoved()
			next := make(chan struct{}) // wake waiters on the leader signal
			close(*n.leaderSig.Swap(&next))
		}
	}
}

// removedKey is the stable-store key under which a node records that it
// was removed (its value: the node id).
var removedKey = []byte("tokenserver_removed")

// recordRemoved writes the removal record into the data dir's stable
// store; a node in memory has nothing to record.
func (n *Node) recordRemoved() {
	if n.bolt == nil {
		return
	}
	if err := n.bolt.Set(removedKey, []byte(n.cfg.NodeID)); err != nil {
		n.log.Warn("could not record the removal in the data dir; a restart on it finds the removal from the Raft configuration alone", "err", err)
	}
}

// removalRecorded reports whether the stable store holds this node's
// removal record.
func removalRecorded(s raft.StableStore, id string) bool {
	v, err := s.Get(removedKey)
	return err == nil && string(v) == id
}

// removedAtStart reports whether the stores say this node was removed:
// the latest configuration does not list it, and an earlier one in the
// log or the snapshot did.
func (n *Node) removedAtStart() bool {
	servers, ok := n.configuration()
	if !ok || len(servers) == 0 || n.listed(servers) {
		return false
	}
	if snaps, err := n.snaps.List(); err == nil && len(snaps) > 0 && n.listed(snaps[0].Configuration.Servers) {
		return true
	}
	first, err1 := n.logs.FirstIndex()
	last, err2 := n.logs.LastIndex()
	if err1 != nil || err2 != nil {
		return false
	}
	var l raft.Log
	for i := last; i >= first && i > 0; i-- {
		if err := n.logs.GetLog(i, &l); err != nil || l.Type != raft.LogConfiguration {
			continue
		}
		if n.listed(raft.DecodeConfiguration(l.Data).Servers) {
			return true
		}
	}
	return false
}

// removeSelf removes the leading node itself: it hands leadership to
// another voter first, and the new leader removes it (by RemoveVia; or the
// caller, given the *rule.LeaderError, forwards the removal). A leader
// that removed itself left the cluster leaderless until the others
// elected one, and the call failed though the removal went through.
func (n *Node) removeSelf(ctx context.Context) error {
	if err := n.raft.LeadershipTransfer().Error(); err != nil {
		return fmt.Errorf("remove %s: hand over leadership first: %w: %w", n.cfg.NodeID, err, rule.ErrNoLeader)
	}
	n.log.Info("leadership handed over so that the new leader removes this node")
	var le *rule.LeaderError
	err := n.awaitLeader(ctx)
	for errors.As(err, &le) && le.ID == n.cfg.NodeID { // raft still names this node
		select {
		case <-ctx.Done():
			return fmt.Errorf("remove %s: no new leader within the deadline: %w", n.cfg.NodeID, rule.ErrNoLeader)
		case <-n.leaderChanged():
		case <-time.After(20 * time.Millisecond):
		}
		err = n.awaitLeader(ctx)
	}
	switch {
	case err == nil:
		return fmt.Errorf("remove %s: leadership came back to it; retry: %w", n.cfg.NodeID, rule.ErrNoLeader)
	case !errors.As(err, &le):
		return err
	case n.cfg.RemoveVia == nil:
		return err
	}
	if err := n.cfg.RemoveVia(ctx, le.GRPCAddr, n.cfg.NodeID); err != nil {
		return fmt.Errorf("remove %s through the new leader %s: %w", n.cfg.NodeID, le.ID, err)
	}
	return nil
}
