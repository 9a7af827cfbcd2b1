package raftfsm

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"

	"github.com/tokenserver/tokenserver/internal/cluster"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// memberInfo is what the FSM keeps about a member.
type memberInfo struct {
	ID       string
	GRPCAddr string
	RaftAddr string
	// WasLive is set once the member has been in the view: coming back
	// after a drop then takes the longer healthy period.
	WasLive bool
	// Draining is set when the member leaves the view to shut down; it
	// stays out of the view until it registers again on start.
	Draining bool
}

// applyResult is what FSM.Apply returns for an entry.
type applyResult struct {
	rule *rule.Rule
	err  error
}

// fsmState is the replicated state: rules, members and the view. It is
// immutable once published.
type fsmState struct {
	Index     uint64
	Rules     *rule.Set
	Members   map[string]memberInfo
	Live      []string
	ViewEpoch uint64
	History   *history // changed in place, like Rules (history.go)
}

func newState() *fsmState {
	return &fsmState{Rules: rule.NewSet(), Members: map[string]memberInfo{}, History: newHistory()}
}

// clone copies the state for one entry to change, except the rule set:
// only the FSM's goroutine (Apply, Restore, Snapshot) reads or writes it,
// so it is changed in place and a rule write costs the same with 10 or
// 10,000 rules; Snapshot copies it for Persist, which runs concurrently.
// Rules themselves are immutable once stored.
func (s *fsmState) clone() *fsmState {
	return &fsmState{Index: s.Index, Rules: s.Rules, Members: maps.Clone(s.Members),
		Live: append([]string(nil), s.Live...), ViewEpoch: s.ViewEpoch, History: s.History}
}

// ruleChange is what an entry did to the rule table: nothing, one rule put
// or deleted, or everything replaced (a restore).
type ruleChange struct {
	put     *rule.Rule
	deleted string
	all     bool
}

func (c ruleChange) any() bool { return c.put != nil || c.deleted != "" || c.all }

// view builds the routing view: live members with their addresses.
func (s *fsmState) view() *cluster.View {
	ms := make([]cluster.Member, 0, len(s.Live))
	for _, id := range s.Live {
		if m, ok := s.Members[id]; ok {
			ms = append(ms, cluster.Member{ID: m.ID, GRPCAddr: m.GRPCAddr, RaftAddr: m.RaftAddr})
		}
	}
	return cluster.NewView(s.ViewEpoch, ms)
}

// FSM is the Raft state machine. raft calls Apply, Snapshot and Restore from
// one goroutine; readers use Table and View, which never block.
type FSM struct {
	mu      sync.Mutex // serializes Apply and Restore with publishing
	state   atomic.Pointer[fsmState]
	table   atomic.Pointer[rule.Table]
	view    atomic.Pointer[cluster.View]
	viewSig atomic.Pointer[chan struct{}]
}

var _ raft.FSM = (*FSM)(nil)

// NewFSM returns an FSM with no rules, no members and an empty view.
func NewFSM() *FSM {
	f := &FSM{}
	f.table.Store(rule.NewTable(0, nil, nil))
	ch := make(chan struct{})
	f.viewSig.Store(&ch)
	f.publish(newState(), ruleChange{all: true})
	return f
}

// Table is the rule table as of the last applied entry.
func (f *FSM) Table() *rule.Table { return f.table.Load() }

// View is the routing view as of the last applied entry.
func (f *FSM) View() *cluster.View { return f.view.Load() }

// ViewChanged is closed when the view (or a member's address) next changes.
func (f *FSM) ViewChanged() <-chan struct{} { return *f.viewSig.Load() }

// AppliedIndex is the index of the last applied entry.
func (f *FSM) AppliedIndex() uint64 { return f.state.Load().Index }

// members returns the member records.
func (f *FSM) members() map[string]memberInfo { return f.state.Load().Members }

// live returns the ids in the view.
func (f *FSM) live() []string { return f.state.Load().Live }

// publish swaps in s and updates the rule table by ch: one rule put or
// deleted updates the table (the cost of a write does not grow with the
// number of rules); a restore or a first publish rebuilds it.
func (f *FSM) publish(s *fsmState, ch ruleChange) {
	old := f.state.Load()
	f.state.Store(s)
	if ch.all || old == nil {
		rules := make([]*rule.Rule, 0, s.Rules.Len())
		for _, r := range s.Rules.All() {
			rules = append(rules, r)
		}
		prev := f.table.Load()
		f.table.Store(rule.NewTable(s.Index, rules, prev))
		prev.Supersede()
	} else if ch.any() {
		prev := f.table.Load()
		f.table.Store(prev.With(s.Index, ch.put, ch.deleted))
		prev.Supersede()
	}
	v := s.view()
	if old := f.view.Load(); old == nil || old.Epoch != v.Epoch || !old.Equal(v) {
		f.view.Store(v)
		ch := make(chan struct{})
		oldSig := f.viewSig.Swap(&ch)
		close(*oldSig)
	}
}

// Apply applies one committed entry. It must be deterministic: every
// replica applies the same entries in the same order to the same result.
// An entry that does not decode stops the node (a panic raft does not
// catch), like an unknown entry type: skipping it would let this replica
// diverge from the others silently.
func (f *FSM) Apply(l *raft.Log) any {
	f.mu.Lock()
	defer f.mu.Unlock()
	cur := f.state.Load()
	if l.Type != raft.LogCommand {
		return nil
	}
	_, fn, err := decodeEntry(l.Data)
	if err != nil {
		panic(fmt.Sprintf("raftfsm: committed log entry %d cannot be applied: %v; this node stops rather than skip it", l.Index, err))
	}
	s := cur.clone()
	s.Index = l.Index
	if fn == nil { // an ignorable entry of a newer version
		f.publish(s, ruleChange{})
		return nil
	}
	res, ch := fn(s, l.Index)
	f.publish(s, ch)
	return res
}

// The handlers: each applies one kind of decoded entry to s, a private
// copy of the state, and says what it did to the rule table. They apply
// only: validation happened where the write entered the cluster, so a
// replay yields what the first apply did, whatever this release's
// validation. They keep the checks the entry itself carries: the
// compare-and-set and the rule cap.

func (s *fsmState) putRule(index uint64, e putRule) (applyResult, ruleChange) {
	if err := s.Rules.Put(index, e.rule, e.expected, e.maxRules); err != nil {
		return applyResult{err: err}, ruleChange{}
	}
	s.History.put(e.rule, e.meta)
	return applyResult{rule: e.rule.Clone()}, ruleChange{put: e.rule}
}

func (s *fsmState) deleteRule(index uint64, e deleteRule) (applyResult, ruleChange) {
	if err := s.Rules.Delete(e.name, e.expected); err != nil {
		return applyResult{err: err}, ruleChange{}
	}
	s.History.remove(index, e.name, e.meta)
	return applyResult{}, ruleChange{deleted: e.name}
}

func (s *fsmState) restoreRules(index uint64, e restoreRules) (applyResult, ruleChange) {
	before := slices.Collect(maps.Keys(s.Rules.All()))
	if err := s.Rules.Replace(index, e.rules); err != nil {
		return applyResult{err: err}, ruleChange{}
	}
	s.History.restore(index, before, s.Rules, e.meta)
	return applyResult{}, ruleChange{all: true}
}

func (s *fsmState) setMember(_ uint64, e setMember) (applyResult, ruleChange) {
	m := e.member
	if old, ok := s.Members[m.ID]; ok {
		m.WasLive = m.WasLive || old.WasLive
	}
	m.Draining = false // a member registers on start: it may enter the view again
	s.Members[m.ID] = m
	return applyResult{}, ruleChange{}
}

func (s *fsmState) removeMember(index uint64, e removeMember) (applyResult, ruleChange) {
	delete(s.Members, e.id)
	s.dropLive(index, e.id)
	return applyResult{}, ruleChange{}
}

func (s *fsmState) drainMember(index uint64, e drainMember) (applyResult, ruleChange) {
	m, ok := s.Members[e.id]
	if !ok {
		return applyResult{err: fmt.Errorf("drain member %q: %w", e.id, rule.ErrNotFound)}, ruleChange{}
	}
	// A member that left cleanly comes back as soon as it is ready,
	// without the hysteresis meant for flapping members.
	m.Draining, m.WasLive = true, false
	s.Members[m.ID] = m
	s.dropLive(index, m.ID)
	return applyResult{}, ruleChange{}
}

func (s *fsmState) setView(index uint64, e setView) (applyResult, ruleChange) {
	live := append([]string(nil), e.live...)
	sort.Strings(live)
	s.Live = live
	s.ViewEpoch = index
	for _, id := range live {
		if m, ok := s.Members[id]; ok && !m.WasLive {
			m.WasLive = true
			s.Members[id] = m
		}
	}
	return applyResult{}, ruleChange{}
}

// dropLive takes id out of the view, a new epoch at index.
func (s *fsmState) dropLive(index uint64, id string) {
	if i := indexOf(s.Live, id); i >= 0 {
		s.Live = append(s.Live[:i:i], s.Live[i+1:]...)
		s.ViewEpoch = index
	}
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// Snapshot returns the current state to persist. raft calls Persist on
// another goroutine while Apply goes on: the rule set, which Apply changes
// in place, is copied here.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	s := *f.state.Load()
	s.Rules = s.Rules.Clone()
	s.History = s.History.clone()
	return &snapshot{s: &s}, nil
}

// Restore replaces the state with a snapshot's, of this release's format
// or the first release's (see decodeSnapshot).
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return fmt.Errorf("restore snapshot: %w", err)
	}
	s, err := decodeSnapshot(b)
	if err != nil {
		return fmt.Errorf("restore snapshot: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.publish(s, ruleChange{all: true})
	return nil
}

type snapshot struct{ s *fsmState }

// Persist writes the state in the snapshot format (see encodeSnapshot).
func (p *snapshot) Persist(sink raft.SnapshotSink) error {
	b, err := encodeSnapshot(p.s)
	if err == nil {
		_, err = sink.Write(b)
	}
	if err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("persist snapshot: %w", err)
	}
	return sink.Close()
}

// Release is a no-op: the state is garbage collected.
func (p *snapshot) Release() {}
