package raftfsm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"time"

	"github.com/hashicorp/raft"
	"github.com/tokenserver/tokenserver/internal/rule"
	raftv1 "github.com/tokenserver/tokenserver/proto/tokenserver/raft/v1"
)

// SnapshotSave takes a Raft snapshot on the leader and opens it: the FSM
// state (rules, members, view) in the snapshot format of snapformat.go. The caller closes the reader.
func (n *Node) SnapshotSave(ctx context.Context) (io.ReadCloser, error) {
	if err := n.consistent(ctx); err != nil {
		return nil, err
	}
	f := n.raft.Snapshot()
	if err := f.Error(); err != nil {
		if !errors.Is(err, raft.ErrNothingNewToSnapshot) {
			return nil, fmt.Errorf("snapshot: %w", err)
		}
		// The latest snapshot already holds the current state.
		metas, lerr := n.snaps.List()
		if lerr != nil || len(metas) == 0 {
			return nil, fmt.Errorf("snapshot: nothing new, and no snapshot to open: %w", lerr)
		}
		_, rc, oerr := n.snaps.Open(metas[0].ID)
		if oerr != nil {
			return nil, fmt.Errorf("open snapshot %s: %w", metas[0].ID, oerr)
		}
		return rc, nil
	}
	_, rc, err := f.Open()
	if err != nil {
		return nil, fmt.Errorf("open snapshot: %w", err)
	}
	return rc, nil
}

// RestoreRules replaces the rule table with the rules of a snapshot made by
// SnapshotSave (of this release or the first), as one log entry;
// membership is kept. Each rule is validated here, where the restore
// enters the cluster. It returns the number of rules and the version of
// the restore.
func (n *Node) RestoreRules(ctx context.Context, snapshot io.Reader) (int, uint64, error) {
	b, err := io.ReadAll(snapshot)
	if err != nil {
		return 0, 0, fmt.Errorf("read snapshot: %w", err)
	}
	st, err := decodeSnapshot(b)
	if err != nil {
		return 0, 0, rule.Invalid("not a tokenserver snapshot: %v", err)
	}
	e := raftv1.RestoreRules{Principal: authorOf(ctx), TimeUnixNs: time.Now().UnixNano()}
	for _, r := range st.Rules.All() {
		r.Normalize()
		if err := r.Validate(); err != nil {
			return 0, 0, fmt.Errorf("snapshot: %w", err)
		}
		e.Rules = append(e.Rules, ruleToPB(r))
	}
	sort.Slice(e.Rules, func(i, j int) bool { return e.Rules[i].Name < e.Rules[j].Name })
	entry, err := encodeEntry(entryRestoreRules, &e)
	if err != nil {
		return 0, 0, err
	}
	if err := n.awaitLeader(ctx); err != nil {
		return 0, 0, err
	}
	res, err := n.apply(ctx, entry)
	if err != nil {
		return 0, 0, err
	}
	if res.err != nil {
		return 0, 0, res.err
	}
	t := n.fsm.Table()
	return t.Len(), t.Version, nil
}
