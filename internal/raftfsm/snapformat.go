package raftfsm

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"

	"google.golang.org/protobuf/proto"

	"github.com/tokenserver/tokenserver/internal/rule"
	raftv1 "github.com/tokenserver/tokenserver/proto/tokenserver/raft/v1"
)

// snapshotMagic starts a snapshot of this release: "TSS" and the format
// version, then a raftv1.Snapshot. The first release's snapshots are JSON
// and start with '{' (after any white space).
var snapshotMagic = [4]byte{'T', 'S', 'S', 1}

// encodeSnapshot writes s in the snapshot format, rules and members
// sorted, so that one state always makes the same bytes.
func encodeSnapshot(s *fsmState) ([]byte, error) {
	m := &raftv1.Snapshot{Index: s.Index, Live: s.Live, ViewEpoch: s.ViewEpoch, Requests: s.Requests.toPB(),
		Rules: make([]*raftv1.Rule, 0, s.Rules.Len()), Members: make([]*raftv1.Member, 0, len(s.Members))}
	for _, r := range s.Rules.All() {
		m.Rules = append(m.Rules, ruleToPB(r))
	}
	sort.Slice(m.Rules, func(i, j int) bool { return m.Rules[i].Name < m.Rules[j].Name })
	for _, mi := range s.Members {
		m.Members = append(m.Members, memberToPB(mi))
	}
	sort.Slice(m.Members, func(i, j int) bool { return m.Members[i].Id < m.Members[j].Id })
	m.EnvoyDomains, m.EnvoyIndex = envoySnapshot(s)
	for _, o := range s.Overrides.All() {
		m.Overrides = append(m.Overrides, overrideToPB(o))
	}
	m.History = s.History.toPB()
	m.EnvoyHistory = envoyHistoryToPB(s.EnvoyHistory)
	b, err := proto.MarshalOptions{Deterministic: true}.MarshalAppend(snapshotMagic[:len(snapshotMagic):len(snapshotMagic)], m)
	if err != nil {
		return nil, fmt.Errorf("encode snapshot: %w", err)
	}
	return b, nil
}

// decodeSnapshot reads a snapshot of either format: the magic and version
// of this release's, or the first release's JSON. It checks the structure
// (every rule and member filed under its own name, no duplicate) and
// nothing else: a snapshot holds what the log applied.
func decodeSnapshot(b []byte) (*fsmState, error) {
	if len(b) >= len(snapshotMagic) && bytes.Equal(b[:3], snapshotMagic[:3]) {
		if b[3] != snapshotMagic[3] {
			return nil, fmt.Errorf("snapshot format %d: this node reads format %d; upgrade it", b[3], snapshotMagic[3])
		}
		var m raftv1.Snapshot
		var err error
		if err = proto.Unmarshal(b[len(snapshotMagic):], &m); err != nil {
			return nil, fmt.Errorf("decode snapshot: %w", err)
		}
		s := newState()
		s.Index, s.Live, s.ViewEpoch = m.Index, m.Live, m.ViewEpoch
		rules := make([]*rule.Rule, len(m.Rules))
		for i, r := range m.Rules {
			if r != nil {
				rules[i] = ruleFromPB(r)
			}
		}
		if err := s.Rules.Load(rules); err != nil {
			return nil, fmt.Errorf("malformed rule table: %w", err)
		}
		for _, mm := range m.Members {
			if mm.GetId() == "" {
				return nil, errors.New("a member without an id")
			}
			if _, dup := s.Members[mm.GetId()]; dup {
				return nil, fmt.Errorf("member %q twice", mm.GetId())
			}
			s.Members[mm.GetId()] = memberFromPB(mm)
		}
		if err := s.loadEnvoySnapshot(m.EnvoyDomains, m.EnvoyIndex); err != nil {
			return nil, err
		}
		for _, o := range m.Overrides {
			if s.Rules.Get(o.GetRule()) == nil || o.GetKey() == "" {
				return nil, fmt.Errorf("override %q of rule %q, which the snapshot does not hold", o.GetKey(), o.GetRule())
			}
			s.Overrides.For(o.GetRule()).Put(overrideFromPB(o))
		}
		if s.Requests, err = requestLogFromPB(m.Requests); err != nil {
			return nil, fmt.Errorf("malformed request log: %w", err)
		}
		s.sumRuleBytes()
		h, herr := historyFromPB(m.History)
		if herr != nil {
			return nil, fmt.Errorf("malformed rule history: %w", herr)
		}
		s.History = h
		if s.EnvoyHistory, err = envoyHistoryFromPB(m.EnvoyHistory); err != nil {
			return nil, fmt.Errorf("malformed envoy domain history: %w", err)
		}
		return s, nil
	}
	if t := bytes.TrimLeft(b, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return nil, errors.New("not a tokenserver snapshot")
	}
	var v0 snapshotV0
	if err := json.Unmarshal(b, &v0); err != nil {
		return nil, fmt.Errorf("decode snapshot (v0): %w", err)
	}
	s := newState()
	s.Index, s.Live, s.ViewEpoch = v0.Index, v0.Live, v0.ViewEpoch
	rules := make([]*rule.Rule, 0, len(v0.Rules))
	for name, r := range v0.Rules {
		if r == nil || r.Name != name {
			return nil, errors.New("malformed rule table")
		}
		rules = append(rules, r.rule())
	}
	if err := s.Rules.Load(rules); err != nil {
		return nil, fmt.Errorf("malformed rule table: %w", err)
	}
	for id, m := range v0.Members {
		s.Members[id] = m.info()
	}
	s.sumRuleBytes()
	return s, nil
}
