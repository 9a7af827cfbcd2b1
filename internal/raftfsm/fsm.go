package raftfsm

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"

	"github.com/tokenserver/tokenserver/internal/cluster"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// Log entry types: the first byte of every entry. An entry whose type has
// ignoreUnknown set may be skipped by a node that does not know it; any
// other unknown type stops the node, since applying less than the others
// would let replicas diverge.
const (
	entryPutRule      byte = 1
	entryDeleteRule   byte = 2
	entrySetMember    byte = 3
	entryRemoveMember byte = 4
	entrySetView      byte = 5
	entryRestoreRules byte = 6
	entryDrainMember  byte = 7

	ignoreUnknown byte = 0x80
)

// putRuleEntry creates or replaces a rule.
type putRuleEntry struct {
	Rule     *rule.Rule `json:"rule"`
	Expected *uint64    `json:"expected,omitempty"`
	// MaxRules is the proposing leader's cap on rules (0: none).
	MaxRules int `json:"max_rules,omitempty"`
}

// deleteRuleEntry deletes a rule.
type deleteRuleEntry struct {
	Name     string  `json:"name"`
	Expected *uint64 `json:"expected,omitempty"`
}

// memberEntry records a member's addresses (setMember) or forgets it
// (removeMember: only ID is read).
type memberEntry struct {
	Member memberInfo `json:"member"`
}

// setMemberEntry, removeMemberEntry and drainMemberEntry are memberEntry
// decoded from the entry types that record a member's addresses, forget
// it, and take it out of the view before it shuts down.
type (
	setMemberEntry    memberEntry
	removeMemberEntry memberEntry
	drainMemberEntry  memberEntry
)

// restoreEntry replaces the whole rule table.
type restoreEntry struct {
	Rules []*rule.Rule `json:"rules"`
}

// viewEntry sets the routing view: the ids of the members that own keys.
type viewEntry struct {
	Live []string `json:"live"`
}

// memberInfo is what the FSM keeps about a member.
type memberInfo struct {
	ID       string `json:"id"`
	GRPCAddr string `json:"grpc_addr"`
	RaftAddr string `json:"raft_addr"`
	// WasLive is set once the member has been in the view: coming back
	// after a drop then takes the longer healthy period.
	WasLive bool `json:"was_live,omitempty"`
	// Draining is set when the member leaves the view to shut down; it
	// stays out of the view until it registers again on start.
	Draining bool `json:"draining,omitempty"`
}

// encode makes a log entry of a type byte and a JSON payload.
func encode(t byte, v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode entry %d: %w", t, err)
	}
	return append([]byte{t}, b...), nil
}

// applyResult is what FSM.Apply returns for an entry.
type applyResult struct {
	rule *rule.Rule
	err  error
}

// fsmState is the replicated state: rules, members and the view. It is
// immutable once published.
type fsmState struct {
	Index     uint64                `json:"index"`
	Rules     map[string]*rule.Rule `json:"rules"`
	Members   map[string]memberInfo `json:"members"`
	Live      []string              `json:"live"`
	ViewEpoch uint64                `json:"view_epoch"`
}

func newState() *fsmState {
	return &fsmState{Rules: map[string]*rule.Rule{}, Members: map[string]memberInfo{}}
}

// clone copies the state for one entry to change, except the rule map:
// only the FSM's goroutine (Apply, Restore, Snapshot) reads or writes it,
// so it is changed in place and a rule write costs the same with 10 or
// 10,000 rules; Snapshot copies it for Persist, which runs concurrently.
// Rules themselves are immutable once stored.
func (s *fsmState) clone() *fsmState {
	return &fsmState{Index: s.Index, Rules: s.Rules, Members: maps.Clone(s.Members),
		Live: append([]string(nil), s.Live...), ViewEpoch: s.ViewEpoch}
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
		rules := make([]*rule.Rule, 0, len(s.Rules))
		for _, r := range s.Rules {
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

// errUnknownEntry is an entry type this node does not know.
var errUnknownEntry = errors.New("unknown log entry type: this node is older than the cluster; upgrade it")

// decodeEntry decodes a command entry into its typed payload. An unknown
// type with ignoreUnknown set decodes to nil; any other unknown type is
// errUnknownEntry.
func decodeEntry(data []byte) (byte, any, error) {
	if len(data) == 0 {
		return 0, nil, errors.New("empty entry")
	}
	t, payload := data[0], data[1:]
	var v any
	switch t {
	case entryPutRule:
		var e putRuleEntry
		if err := json.Unmarshal(payload, &e); err != nil {
			return t, nil, fmt.Errorf("rule entry: %w", err)
		}
		if e.Rule == nil {
			return t, nil, errors.New("rule entry without a rule")
		}
		v = e
	case entryDeleteRule:
		var e deleteRuleEntry
		if err := json.Unmarshal(payload, &e); err != nil {
			return t, nil, fmt.Errorf("delete entry: %w", err)
		}
		v = e
	case entryRestoreRules:
		var e restoreEntry
		if err := json.Unmarshal(payload, &e); err != nil {
			return t, nil, fmt.Errorf("restore entry: %w", err)
		}
		v = e
	case entrySetMember, entryRemoveMember, entryDrainMember:
		var e memberEntry
		if err := json.Unmarshal(payload, &e); err != nil {
			return t, nil, fmt.Errorf("member entry: %w", err)
		}
		if e.Member.ID == "" {
			return t, nil, errors.New("member entry without an id")
		}
		switch t {
		case entrySetMember:
			v = setMemberEntry(e)
		case entryRemoveMember:
			v = removeMemberEntry(e)
		default:
			v = drainMemberEntry(e)
		}
	case entrySetView:
		var e viewEntry
		if err := json.Unmarshal(payload, &e); err != nil {
			return t, nil, fmt.Errorf("view entry: %w", err)
		}
		v = e
	default:
		if t&ignoreUnknown != 0 {
			return t, nil, nil
		}
		return t, nil, fmt.Errorf("type %d: %w", t, errUnknownEntry)
	}
	return t, v, nil
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
	_, e, err := decodeEntry(l.Data)
	if err != nil {
		panic(fmt.Sprintf("raftfsm: committed log entry %d cannot be applied: %v; this node stops rather than skip it", l.Index, err))
	}
	s := cur.clone()
	s.Index = l.Index
	if e == nil { // an ignorable entry of a newer version
		f.publish(s, ruleChange{})
		return nil
	}
	res, ch := s.apply(l.Index, e)
	f.publish(s, ch)
	return res
}

// apply applies a decoded entry to s (a private copy).
func (s *fsmState) apply(index uint64, entry any) (applyResult, ruleChange) {
	switch e := entry.(type) {
	case putRuleEntry:
		r := e.Rule.Clone()
		r.Normalize()
		if err := r.Validate(); err != nil {
			return applyResult{err: err}, ruleChange{}
		}
		old := s.Rules[r.Name]
		if err := rule.CheckExpected(r.Name, old, e.Expected); err != nil {
			return applyResult{err: err}, ruleChange{}
		}
		// The cap travels in the entry (the proposing leader's
		// --max-rules), so every replica decides alike whatever its flags.
		if old == nil && e.MaxRules > 0 && len(s.Rules) >= e.MaxRules {
			return applyResult{err: fmt.Errorf("rule %q would be rule %d, above the cluster's limit of %d rules (--max-rules): %w",
				r.Name, len(s.Rules)+1, e.MaxRules, rule.ErrTooManyRules)}, ruleChange{}
		}
		r.Version, r.Generation = index, index
		if old != nil && old.Algorithm == r.Algorithm {
			r.Generation = old.Generation
		}
		s.Rules[r.Name] = r
		return applyResult{rule: r.Clone()}, ruleChange{put: r}
	case deleteRuleEntry:
		old := s.Rules[e.Name]
		if old == nil {
			return applyResult{err: fmt.Errorf("delete %q: %w", e.Name, rule.ErrNotFound)}, ruleChange{}
		}
		if err := rule.CheckExpected(e.Name, old, e.Expected); err != nil {
			return applyResult{err: err}, ruleChange{}
		}
		delete(s.Rules, e.Name)
		return applyResult{}, ruleChange{deleted: e.Name}
	case restoreEntry:
		rules := make(map[string]*rule.Rule, len(e.Rules))
		for _, r := range e.Rules {
			if r == nil {
				return applyResult{err: rule.Invalid("restore entry at %d holds an empty rule", index)}, ruleChange{}
			}
			r = r.Clone()
			r.Normalize()
			if err := r.Validate(); err != nil {
				return applyResult{err: err}, ruleChange{}
			}
			r.Version, r.Generation = index, index
			rules[r.Name] = r
		}
		s.Rules = rules
		return applyResult{}, ruleChange{all: true}
	case setMemberEntry:
		m := e.Member
		if old, ok := s.Members[m.ID]; ok {
			m.WasLive = m.WasLive || old.WasLive
		}
		m.Draining = false // a member registers on start: it may enter the view again
		s.Members[m.ID] = m
		return applyResult{}, ruleChange{}
	case removeMemberEntry:
		delete(s.Members, e.Member.ID)
		s.dropLive(index, e.Member.ID)
		return applyResult{}, ruleChange{}
	case drainMemberEntry:
		m, ok := s.Members[e.Member.ID]
		if !ok {
			return applyResult{err: fmt.Errorf("drain member %q: %w", e.Member.ID, rule.ErrNotFound)}, ruleChange{}
		}
		// A member that left cleanly comes back as soon as it is ready,
		// without the hysteresis meant for flapping members.
		m.Draining, m.WasLive = true, false
		s.Members[m.ID] = m
		s.dropLive(index, m.ID)
		return applyResult{}, ruleChange{}
	case viewEntry:
		live := append([]string(nil), e.Live...)
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
// another goroutine while Apply goes on: the rule map, which Apply changes
// in place, is copied here.
func (f *FSM) Snapshot() (raft.FSMSnapshot, error) {
	s := *f.state.Load()
	s.Rules = maps.Clone(s.Rules)
	return &snapshot{s: &s}, nil
}

// Restore replaces the state with a snapshot's.
func (f *FSM) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	s := newState()
	if err := json.NewDecoder(rc).Decode(s); err != nil {
		return fmt.Errorf("restore snapshot: %w", err)
	}
	if s.Rules == nil {
		s.Rules = map[string]*rule.Rule{}
	}
	if s.Members == nil {
		s.Members = map[string]memberInfo{}
	}
	for name, r := range s.Rules {
		if r == nil || r.Name != name {
			return errors.New("restore snapshot: malformed rule table")
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.publish(s, ruleChange{all: true})
	return nil
}

type snapshot struct{ s *fsmState }

// Persist writes the state as JSON.
func (p *snapshot) Persist(sink raft.SnapshotSink) error {
	if err := json.NewEncoder(sink).Encode(p.s); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("persist snapshot: %w", err)
	}
	return sink.Close()
}

// Release is a no-op: the state is garbage collected.
func (p *snapshot) Release() {}
