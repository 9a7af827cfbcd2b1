package raftfsm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"

	"github.com/hashicorp/raft"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// SnapshotSave takes a Raft snapshot on the leader and opens it: JSON of the
// FSM state (rules, members, view). The caller closes the reader.
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
			return nil, fmt.Errorf("snapshot: nothing new, and no snapshot to open: %v", lerr)
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
// SnapshotSave, as one log entry; membership is kept. It returns the
// number of rules and the version of the restore.
func (n *Node) RestoreRules(ctx context.Context, snapshot io.Reader) (int, uint64, error) {
	var st fsmState
	if err := json.NewDecoder(snapshot).Decode(&st); err != nil {
		return 0, 0, rule.Invalid("not a tokenserver snapshot: %v", err)
	}
	var e restoreEntry
	for name, r := range st.Rules {
		if r == nil || r.Name != name {
			return 0, 0, rule.Invalid("snapshot: malformed rule %q", name)
		}
		if err := r.Validate(); err != nil {
			return 0, 0, fmt.Errorf("snapshot: %w", err)
		}
		e.Rules = append(e.Rules, r)
	}
	sort.Slice(e.Rules, func(i, j int) bool { return e.Rules[i].Name < e.Rules[j].Name })
	entry, err := encode(entryRestoreRules, e)
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
