package raftfsm

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tokenserver/tokenserver/internal/rule"
)

// Readiness.
//
// A node is caught up once it has applied every log entry up to the
// commit index it learned after start: as leader, the commit index once an
// entry of its own term has committed (before that a new leader's commit
// index can lag what the old one committed); as follower, the leader's
// commit index, asked over the Raft port's probe. Every entry type counts:
// raft hands the FSM only command entries, so appliedThrough checks raft's
// own applied index and that no command entry up to the index is still
// waiting for the FSM. A node is ready when it is caught up and in the
// routing view, and not draining.

// readiness latches caughtUp.
func (n *Node) readiness() {
	defer n.wg.Done()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if target := n.target.Load(); target == 0 {
			if ci := n.learnCommitIndex(); ci > 0 {
				n.target.Store(ci)
			}
		} else if n.appliedThrough(target) {
			n.caughtUp.Store(true)
			if n.cfg.OnCaughtUp != nil {
				n.cfg.OnCaughtUp()
			}
			close(n.caughtUpCh)
			n.kickLiveness() // leading, it can commit its view now
			n.log.Info("caught up with the raft log", "index", target, "since_start", time.Since(n.started).Round(time.Millisecond).String())
			return
		}
		select {
		case <-n.done:
			return
		case <-t.C:
		}
	}
}

// learnCommitIndex returns the cluster's commit index as this node can
// learn it now, 0 while it cannot.
func (n *Node) learnCommitIndex() uint64 {
	if !n.state.Load() {
		return 0
	}
	if n.IsLeader() {
		if n.termIsCommitted() {
			return n.raft.CommitIndex()
		}
		return 0
	}
	addr, id := n.raft.LeaderWithID()
	if id == "" || addr == "" {
		return 0
	}
	info, err := n.probePeer(string(addr), time.Second)
	if err != nil || info.ID != string(id) || info.CommitIndex == 0 {
		return 0
	}
	return info.CommitIndex
}

// termIsCommitted reports whether this node leads and an entry of its
// current term has committed (raft's no-op of a new term does it).
func (n *Node) termIsCommitted() bool {
	term := n.raft.CurrentTerm()
	if n.termCommitted.Load() == term {
		return n.IsLeader()
	}
	ci := n.raft.CommitIndex()
	if ci == 0 || !n.IsLeader() {
		return false
	}
	var l raft.Log
	if err := n.logs.GetLog(ci, &l); err != nil || l.Term != term {
		return false
	}
	n.termCommitted.Store(term)
	return true
}

// appliedThrough reports whether the FSM has applied every entry up to idx.
func (n *Node) appliedThrough(idx uint64) bool {
	if n.through.Load() >= idx {
		return true
	}
	if n.raft.AppliedIndex() < idx {
		return false
	}
	// raft has handed every entry up to idx to the FSM goroutine; the FSM
	// has applied them once it has applied the last command among them.
	from := n.fsm.AppliedIndex() + 1
	if first, err := n.logs.FirstIndex(); err == nil && first > from {
		from = first // older entries came with the snapshot
	}
	var l raft.Log
	for i := idx; i >= from && i > 0; i-- {
		if err := n.logs.GetLog(i, &l); err != nil {
			break // compacted meanwhile: covered by a snapshot
		}
		if l.Type == raft.LogCommand {
			return false
		}
	}
	for {
		cur := n.through.Load()
		if cur >= idx || n.through.CompareAndSwap(cur, idx) {
			return true
		}
	}
}

// waitApplied waits until the FSM has applied every entry up to idx.
func (n *Node) waitApplied(ctx context.Context, idx uint64) error {
	for !n.appliedThrough(idx) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("applying the log up to %d: %w", idx, ctx.Err())
		case <-n.done:
			return fmt.Errorf("node is shutting down: %w", rule.ErrNoLeader)
		case <-time.After(2 * time.Millisecond):
		}
	}
	return nil
}

// CaughtUp reports whether the node has applied the log up to the commit
// index it learned after start. It stays true once set.
func (n *Node) CaughtUp() bool { return n.caughtUp.Load() }

// Ready reports whether the node is caught up, in the routing view, not
// draining, not removed, and in contact with a leader within DownAfter:
// it can answer for the keys it owns and its view is the cluster's. An
// election shorter than DownAfter does not make a ready node unready.
func (n *Node) Ready() bool {
	return n.caughtUp.Load() && !n.draining.Load() && !n.removed.Load() && n.inView() && n.leaderContact(time.Now())
}

// leaderContact reports whether this node leads or heard from a leader
// within DownAfter of now.
func (n *Node) leaderContact(now time.Time) bool {
	if n.cfg.DownAfter <= 0 || n.IsLeader() {
		return true
	}
	last := n.raft.LastContact()
	if led := time.Unix(0, n.ledUntil.Load()); n.ledUntil.Load() != 0 && led.After(last) {
		last = led
	}
	return !last.IsZero() && now.Sub(last) <= n.cfg.DownAfter
}

// inView reports whether the routing view lists this node.
func (n *Node) inView() bool { return slices.Contains(n.fsm.live(), n.cfg.NodeID) }

// consistent makes sure a read on this node sees every acknowledged write,
// as etcd's ReadIndex does: the node must lead with an entry of its term
// committed; the commit index then is the read index; VerifyLeader
// confirms no other leader was elected meanwhile (a heartbeat round, no
// log entry); the read waits until the FSM has applied the read index.
func (n *Node) consistent(ctx context.Context) error {
	for {
		if err := n.awaitLeader(ctx); err != nil {
			return err
		}
		if n.termIsCommitted() {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the new leader's first entry did not commit within the deadline: %w", rule.ErrNoLeader)
		case <-n.done:
			return fmt.Errorf("node is shutting down: %w", rule.ErrNoLeader)
		case <-time.After(2 * time.Millisecond):
		}
	}
	readIndex := n.raft.CommitIndex()
	if err := n.raft.VerifyLeader().Error(); err != nil {
		return fmt.Errorf("verify leader: %w: %w", err, rule.ErrNoLeader)
	}
	return n.waitApplied(ctx, readIndex)
}
