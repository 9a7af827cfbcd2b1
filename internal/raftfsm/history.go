package raftfsm

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/tokenserver/tokenserver/internal/rule"
	raftv1 "github.com/tokenserver/tokenserver/proto/tokenserver/raft/v1"
)

// Rule history: the FSM keeps the last HistoryVersions versions of every
// rule, each with its principal, the proposing leader's wall time (carried
// in the entry: apply reads no clock) and the change. A deleted rule keeps
// its history for DeletedHistoryRetention, measured in entry time: the
// apply of any rule write whose time is past a deletion's time plus the
// retention forgets that history, so every replica prunes at the same
// entry. History is part of the snapshot (Snapshot.history); a snapshot
// without it loads with empty histories.

// HistoryVersions is how many versions of each rule the FSM keeps.
const HistoryVersions = 20

// DeletedHistoryRetention is how long a deleted rule's history is kept.
const DeletedHistoryRetention = 7 * 24 * time.Hour

// The changes a history records.
const (
	ChangePut      = "PUT"
	ChangeDelete   = "DELETE"
	ChangeRollback = "ROLLBACK"
	ChangeRestore  = "RESTORE"
)

// RuleVersion is one version in a rule's history.
type RuleVersion struct {
	// Rule is the rule as written; nil for a deletion.
	Rule *rule.Rule
	// Version is the Raft index of the change.
	Version uint64
	// Principal wrote it ("" when auth is off).
	Principal string
	// Time is the proposing leader's wall clock.
	Time time.Time
	// Change is ChangePut, ChangeDelete, ChangeRollback or ChangeRestore.
	Change string
	// RollbackTo is, for a rollback, the version it copies.
	RollbackTo uint64
}

// writeMeta is what a rule write carries for the history.
type writeMeta struct {
	principal  string
	timeNs     int64
	change     string
	rollbackTo uint64
}

// ruleHistory is one rule's versions, oldest first.
type ruleHistory struct {
	versions  []RuleVersion
	deletedNs int64 // set while deleted
}

// history is every rule's history. The FSM goroutine writes it (under
// mu); readers (RuleHistory) take the read lock. Versions are immutable.
type history struct {
	mu      sync.RWMutex
	byName  map[string]*ruleHistory
	deleted map[string]int64 // names whose rule is deleted → deletion time
}

func newHistory() *history {
	return &history{byName: map[string]*ruleHistory{}, deleted: map[string]int64{}}
}

// clone copies h for a snapshot.
func (h *history) clone() *history {
	h.mu.RLock()
	defer h.mu.RUnlock()
	c := newHistory()
	for name, rh := range h.byName {
		c.byName[name] = &ruleHistory{versions: append([]RuleVersion(nil), rh.versions...), deletedNs: rh.deletedNs}
	}
	for name, t := range h.deleted {
		c.deleted[name] = t
	}
	return c
}

// record appends one version of name and prunes what the entry's time
// retires.
func (h *history) record(name string, v RuleVersion, m writeMeta) {
	v.Principal, v.Change, v.RollbackTo = m.principal, m.change, m.rollbackTo
	if m.timeNs != 0 {
		v.Time = time.Unix(0, m.timeNs).UTC()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	rh := h.byName[name]
	if rh == nil {
		rh = &ruleHistory{}
		h.byName[name] = rh
	}
	if len(rh.versions) >= HistoryVersions {
		rh.versions = append(rh.versions[:0:0], rh.versions[len(rh.versions)-HistoryVersions+1:]...)
	}
	rh.versions = append(rh.versions, v)
	if v.Rule == nil {
		rh.deletedNs = m.timeNs
		h.deleted[name] = m.timeNs
	} else {
		rh.deletedNs = 0
		delete(h.deleted, name)
	}
	if m.timeNs != 0 {
		for d, t := range h.deleted {
			if d != name && m.timeNs-t > int64(DeletedHistoryRetention) {
				delete(h.deleted, d)
				delete(h.byName, d)
			}
		}
	}
}

// put records a rule write.
func (h *history) put(r *rule.Rule, m writeMeta) {
	if m.change == "" {
		m.change = ChangePut
	}
	h.record(r.Name, RuleVersion{Rule: r.Clone(), Version: r.Version}, m)
}

// remove records a deletion at index.
func (h *history) remove(index uint64, name string, m writeMeta) {
	m.change = ChangeDelete
	h.record(name, RuleVersion{Version: index}, m)
}

// restore records a restore: every restored rule gets a version, every
// rule it dropped a deletion, both marked RESTORE.
func (h *history) restore(index uint64, before []string, after *rule.Set, m writeMeta) {
	m.change = ChangeRestore
	for _, name := range before {
		if after.Get(name) == nil {
			h.record(name, RuleVersion{Version: index}, m)
		}
	}
	for _, r := range after.All() {
		h.record(r.Name, RuleVersion{Rule: r.Clone(), Version: r.Version}, m)
	}
}

// versions returns name's versions, newest first.
func (h *history) versions(name string) []RuleVersion {
	h.mu.RLock()
	defer h.mu.RUnlock()
	rh := h.byName[name]
	if rh == nil {
		return nil
	}
	out := make([]RuleVersion, len(rh.versions))
	for i, v := range rh.versions {
		out[len(out)-1-i] = v
	}
	return out
}

// toPB writes h for a snapshot, sorted by name.
func (h *history) toPB() []*raftv1.RuleHistory {
	h.mu.RLock()
	defer h.mu.RUnlock()
	out := make([]*raftv1.RuleHistory, 0, len(h.byName))
	for name, rh := range h.byName {
		m := &raftv1.RuleHistory{Name: name, DeletedUnixNs: rh.deletedNs, Versions: make([]*raftv1.RuleVersion, len(rh.versions))}
		for i, v := range rh.versions {
			pv := &raftv1.RuleVersion{Version: v.Version, Principal: v.Principal, Change: v.Change, RollbackTo: v.RollbackTo}
			if !v.Time.IsZero() {
				pv.TimeUnixNs = v.Time.UnixNano()
			}
			if v.Rule != nil {
				pv.Rule = ruleToPB(v.Rule)
			}
			m.Versions[i] = pv
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// historyFromPB reads a snapshot's histories.
func historyFromPB(ms []*raftv1.RuleHistory) (*history, error) {
	h := newHistory()
	for _, m := range ms {
		if _, dup := h.byName[m.GetName()]; dup {
			return nil, fmt.Errorf("history of rule %q twice", m.GetName())
		}
		rh := &ruleHistory{deletedNs: m.GetDeletedUnixNs(), versions: make([]RuleVersion, 0, len(m.GetVersions()))}
		for _, pv := range m.GetVersions() {
			v := RuleVersion{Version: pv.GetVersion(), Principal: pv.GetPrincipal(), Change: pv.GetChange(), RollbackTo: pv.GetRollbackTo()}
			if pv.GetTimeUnixNs() != 0 {
				v.Time = time.Unix(0, pv.GetTimeUnixNs()).UTC()
			}
			if pv.Rule != nil {
				v.Rule = ruleFromPB(pv.Rule)
			}
			rh.versions = append(rh.versions, v)
		}
		h.byName[m.GetName()] = rh
		if rh.deletedNs != 0 || (len(rh.versions) > 0 && rh.versions[len(rh.versions)-1].Rule == nil) {
			h.deleted[m.GetName()] = rh.deletedNs
		}
	}
	return h, nil
}

// RuleHistory returns the stored versions of name on this replica, newest
// first (nil when it has none). It reads local state: it may lag the
// leader by the entries not yet applied here.
func (n *Node) RuleHistory(name string) []RuleVersion {
	return n.fsm.state.Load().History.versions(name)
}

// Rollback writes, on the leader, a new version of name equal to its
// version toVersion, recorded as a ROLLBACK by principal. expected is a
// compare-and-set on the current version, as Put's. Elsewhere it returns a
// *rule.LeaderError.
func (n *Node) Rollback(ctx context.Context, name string, toVersion uint64, expected *uint64, principal string) (*rule.Rule, error) {
	if err := rule.ValidName(name); err != nil {
		return nil, err
	}
	if err := n.awaitLeader(ctx); err != nil {
		return nil, err
	}
	var target *rule.Rule
	for _, v := range n.RuleHistory(name) {
		if v.Version == toVersion {
			target = v.Rule
			if target == nil {
				return nil, rule.Invalid("version %d of rule %q is its deletion; roll back to a version that holds the rule", toVersion, name)
			}
			break
		}
	}
	if target == nil {
		return nil, fmt.Errorf("version %d of rule %q is not in its history: %w", toVersion, name, rule.ErrNotFound)
	}
	r := target.Clone()
	r.UpdatedBy = principal
	r.Normalize()
	if err := r.Validate(); err != nil {
		return nil, err
	}
	entry, err := encodeEntry(entryPutRule, &raftv1.PutRule{Rule: ruleToPB(r), ExpectedVersion: expected, MaxRules: int64(n.cfg.maxRules()),
		MaxTableBytes: n.cfg.maxTableBytes(), TimeUnixNs: time.Now().UnixNano(), Change: ChangeRollback, RollbackTo: toVersion})
	if err != nil {
		return nil, err
	}
	res, err := n.apply(ctx, entry)
	if err != nil {
		return nil, err
	}
	return res.rule, res.err
}

// authorKey carries a write's principal through a context to Delete and
// RestoreRules, whose signatures (rule.Store's) have no place for it.
type authorKey struct{}

// WithAuthor returns ctx carrying principal as the author of the rule
// writes made with it (deletions and restores; a put names its author in
// Rule.UpdatedBy).
func WithAuthor(ctx context.Context, principal string) context.Context {
	return context.WithValue(ctx, authorKey{}, principal)
}

// authorOf is the principal WithAuthor put in ctx.
func authorOf(ctx context.Context) string {
	s, _ := ctx.Value(authorKey{}).(string)
	return s
}
