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

// ErrRuleTableFull means a put would bring the rule table past the
// cluster's byte cap (Config.MaxRuleTableBytes). It is a
// rule.ErrTooManyRules too (RESOURCE_EXHAUSTED).
var ErrRuleTableFull = fmt.Errorf("rule table full: %w", rule.ErrTooManyRules)

// applyResult is what FSM.Apply returns for an entry.
type applyResult struct {
	rule     *rule.Rule
	envoy    *EnvoyDomain // the Envoy domain a put stored
	changed  int          // Envoy domains a sync changed
	override *rule.RuntimeOverride
	err      error
}

// fsmState is the replicated state: rules, members and the view. It is
// immutable once published.
type fsmState struct {
	Index     uint64
	Rules     *rule.Set
	Members   map[string]memberInfo
	Live      []string
	ViewEpoch uint64
	// Envoy holds the Envoy domains by name (envoy.go); changed by
	// copy-on-write. EnvoyIndex is the index of its last change.
	Envoy      map[string]EnvoyDomain
	EnvoyIndex uint64
	// Overrides are the rules' runtime overrides, changed in place like
	// Rules (see overrides.go).
	Overrides *rule.Overrides
	// RuleBytes is the rule table's size, the sum of the rules'
	// EncodedSize (derived: recomputed on restore).
	RuleBytes int64
	// Requests are the recent rule writes' request ids and results
	// (requests.go), changed in place like Rules.
	Requests *requestLog
	History  *history // changed in place, like Rules (history.go)
	// EnvoyHistory is every Envoy domain's history, copied on write
	// (envoyhistory.go).
	EnvoyHistory map[string]envoyHistory
}

func newState() *fsmState {
	return &fsmState{Rules: rule.NewSet(), Members: map[string]memberInfo{}, Overrides: rule.NewOverrides(), Requests: newRequestLog(), History: newHistory()}
}

// ruleBytes is the size the rule-table byte cap counts.
func ruleBytes(r *rule.Rule) int64 {
	if r == nil {
		return 0
	}
	return int64(r.EncodedSize())
}

// sumRuleBytes recomputes RuleBytes from the rule set.
func (s *fsmState) sumRuleBytes() {
	s.RuleBytes = 0
	for _, r := range s.Rules.All() {
		s.RuleBytes += ruleBytes(r)
	}
}

// clone copies the state for one entry to change, except the rule set
// and the request log: only the FSM's goroutine (Apply, Restore,
// Snapshot) reads or writes them, so they are changed in place and a
// rule write costs the same with 10 or 10,000 rules; Snapshot copies them
// for Persist, which runs concurrently. Rules themselves are immutable
// once stored.
func (s *fsmState) clone() *fsmState {
	return &fsmState{Index: s.Index, Rules: s.Rules, Members: maps.Clone(s.Members),
		Live: append([]string(nil), s.Live...), ViewEpoch: s.ViewEpoch, Envoy: s.Envoy, EnvoyIndex: s.EnvoyIndex, Overrides: s.Overrides,
		RuleBytes: s.RuleBytes, Requests: s.Requests, History: s.History, EnvoyHistory: s.EnvoyHistory}
}

// ruleChange is what an entry did to the rule table: nothing, one rule put
// or deleted, or everything replaced (a restore).
type ruleChange struct {
	put     *rule.Rule
	deleted string
	all     bool
	// overrides names a rule whose runtime overrides were written (the
	// table is not rebuilt for them).
	overrides string
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
	attachOverrides(f.table.Load(), s.Overrides, ch)
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
// compare-and-set, the rule cap, the table's byte cap and the request id
// (a write whose id is remembered answers its first result again and
// changes nothing).

func (s *fsmState) putRule(index uint64, e putRule) (applyResult, ruleChange) {
	if e.requestID != "" {
		if rec, ok := s.Requests.get(e.requestID); ok {
			return rec.result(e.rule), ruleChange{}
		}
	}
	res, ch := s.doPut(index, e)
	if e.requestID != "" {
		s.Requests.add(recordOf(e.requestID, index, res))
	}
	return res, ch
}

func (s *fsmState) doPut(index uint64, e putRule) (applyResult, ruleChange) {
	old := s.Rules.Get(e.rule.Name)
	total := s.RuleBytes - ruleBytes(old) + ruleBytes(e.rule)
	if rule.CheckExpected(e.rule.Name, old, e.expected) == nil { // a stale compare-and-set says so first
		if err := tableBytesCheck(e.rule.Name, s.RuleBytes, total, e.maxTableBytes); err != nil {
			return applyResult{err: err}, ruleChange{}
		}
	}
	if err := s.Rules.Put(index, e.rule, e.expected, e.maxRules); err != nil {
		return applyResult{err: err}, ruleChange{}
	}
	s.RuleBytes = total
	s.History.put(e.rule, e.meta)
	return applyResult{rule: e.rule.Clone()}, ruleChange{put: e.rule}
}

// tableBytesCheck refuses a put that would grow the rule table from was
// to total bytes, past max (0: no cap). A put that does not grow the
// table passes, so that a table over a lowered cap can still shrink.
func tableBytesCheck(name string, was, total, limit int64) error {
	if limit > 0 && total > limit && total > was {
		return fmt.Errorf("rule %q would bring the rule table to %d bytes, above the cluster's limit of %d bytes (--max-rule-table-bytes): %w",
			name, total, limit, ErrRuleTableFull)
	}
	return nil
}

func (s *fsmState) deleteRule(index uint64, e deleteRule) (applyResult, ruleChange) {
	if e.requestID != "" {
		if rec, ok := s.Requests.get(e.requestID); ok {
			return rec.result(nil), ruleChange{}
		}
	}
	old := s.Rules.Get(e.name)
	res, ch := applyResult{}, ruleChange{deleted: e.name}
	if err := s.Rules.Delete(e.name, e.expected); err != nil {
		res, ch = applyResult{err: err}, ruleChange{}
	} else {
		s.RuleBytes -= ruleBytes(old)
		s.Overrides.DropRule(e.name)
		s.History.remove(index, e.name, e.meta)
	}
	if e.requestID != "" {
		s.Requests.add(recordOf(e.requestID, index, res))
	}
	return res, ch
}

func (s *fsmState) restoreRules(index uint64, e restoreRules) (applyResult, ruleChange) {
	before := slices.Collect(maps.Keys(s.Rules.All()))
	if err := s.Rules.Replace(index, e.rules); err != nil {
		return applyResult{err: err}, ruleChange{}
	}
	// Restored rules start afresh, runtime overrides included.
	s.Overrides = rule.NewOverrides()
	s.sumRuleBytes()
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
// another goroutine while Apply goes on: the rule set and the runtime
// overrides, which Apply changes in place, are copied here.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	s := *f.state.Load()
	s.Rules = s.Rules.Clone()
	s.Overrides = s.Overrides.Clone()
	s.Requests = s.Requests.clone()
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
