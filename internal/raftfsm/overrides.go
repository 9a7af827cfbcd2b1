package raftfsm

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"google.golang.org/protobuf/proto"

	"github.com/tokenserver/tokenserver/internal/rule"
	raftv1 "github.com/tokenserver/tokenserver/proto/tokenserver/raft/v1"
)

// Runtime overrides: each write is its own entry (one override put, or
// the deletion of some keys of one rule), applied to the rule's
// rule.Runtime in place, so that a write costs the same with 100,000
// overrides as with 10. The rule table is not rebuilt: compiled rules
// read their Runtime through Compiled.Attach.
const (
	entryPutOverride     byte = 0x30 // raftv1.PutOverride
	entryDeleteOverrides byte = 0x31 // raftv1.DeleteOverrides
)

type (
	putOverride     struct{ o rule.RuntimeOverride }
	deleteOverrides struct {
		rule          string
		keys          []string
		expiredBefore int64
	}
)

func decodePutOverride(p []byte) (putOverride, error) {
	var m raftv1.PutOverride
	if err := proto.Unmarshal(p, &m); err != nil {
		return putOverride{}, err
	}
	if m.Override.GetRule() == "" || m.Override.GetKey() == "" {
		return putOverride{}, errors.New("no rule or key")
	}
	return putOverride{o: overrideFromPB(m.Override)}, nil
}

func decodeDeleteOverrides(p []byte) (deleteOverrides, error) {
	var m raftv1.DeleteOverrides
	if err := proto.Unmarshal(p, &m); err != nil {
		return deleteOverrides{}, err
	}
	return deleteOverrides{rule: m.Rule, keys: m.Keys, expiredBefore: m.ExpiredBeforeUnixNs}, nil
}

func overrideFromPB(m *raftv1.RuntimeOverride) rule.RuntimeOverride {
	return rule.RuntimeOverride{Rule: m.GetRule(), Key: m.GetKey(), Limit: m.GetLimit(), Burst: m.GetBurst(),
		ExpiresUnixNs: m.GetExpiresUnixNs(), Version: m.GetVersion(), UpdatedBy: m.GetUpdatedBy()}
}

func overrideToPB(o rule.RuntimeOverride) *raftv1.RuntimeOverride {
	return &raftv1.RuntimeOverride{Rule: o.Rule, Key: o.Key, Limit: o.Limit, Burst: o.Burst,
		ExpiresUnixNs: o.ExpiresUnixNs, Version: o.Version, UpdatedBy: o.UpdatedBy}
}

// putOverride stores an override of an existing rule (ErrNotFound
// otherwise) at version index.
func (s *fsmState) putOverride(index uint64, e putOverride) (applyResult, ruleChange) {
	if s.Rules.Get(e.o.Rule) == nil {
		return applyResult{err: fmt.Errorf("override %q: rule %q: %w", e.o.Key, e.o.Rule, rule.ErrNotFound)}, ruleChange{}
	}
	e.o.Version = index
	s.Overrides.For(e.o.Rule).Put(e.o)
	o := e.o
	return applyResult{override: &o}, ruleChange{overrides: e.o.Rule}
}

// deleteOverrides deletes the keys named and the overrides expired by
// expiredBefore; naming a key that has no override is ErrNotFound when it
// is the only key and no expiry is asked.
func (s *fsmState) deleteOverrides(_ uint64, e deleteOverrides) (applyResult, ruleChange) {
	rt := s.Overrides.Get(e.rule)
	keys := e.keys
	if e.expiredBefore > 0 {
		keys = append(append([]string(nil), keys...), rt.Expired(e.expiredBefore)...)
	}
	n := 0
	for _, k := range keys {
		if rt != nil && rt.Delete(k) {
			n++
		}
	}
	if n == 0 && len(e.keys) == 1 && e.expiredBefore == 0 {
		return applyResult{err: fmt.Errorf("override %q of rule %q: %w", e.keys[0], e.rule, rule.ErrNotFound)}, ruleChange{}
	}
	return applyResult{}, ruleChange{}
}

// PutOverride validates o against its rule and stores it, on the leader
// (elsewhere a *rule.LeaderError). It returns the stored override with
// its version.
func (n *Node) PutOverride(ctx context.Context, o rule.RuntimeOverride) (rule.RuntimeOverride, error) {
	if err := rule.ValidName(o.Rule); err != nil {
		return rule.RuntimeOverride{}, err
	}
	// Judge the rule on the leader: a follower's table may not hold a
	// rule the leader has just acknowledged.
	if err := n.awaitLeader(ctx); err != nil {
		return rule.RuntimeOverride{}, err
	}
	c := n.Table().Get(o.Rule)
	if c == nil {
		return rule.RuntimeOverride{}, fmt.Errorf("rule %q: %w", o.Rule, rule.ErrNotFound)
	}
	if err := o.ValidateFor(c.Rule); err != nil {
		return rule.RuntimeOverride{}, err
	}
	entry, err := encodeEntry(entryPutOverride, &raftv1.PutOverride{Override: overrideToPB(o)})
	if err != nil {
		return rule.RuntimeOverride{}, err
	}
	res, err := n.apply(ctx, entry)
	if err != nil {
		return rule.RuntimeOverride{}, err
	}
	if res.err != nil {
		return rule.RuntimeOverride{}, res.err
	}
	return *res.override, nil
}

// DeleteOverride deletes the override of key (as written) of a rule, on
// the leader; ErrNotFound when there is none.
func (n *Node) DeleteOverride(ctx context.Context, name, key string) error {
	if err := rule.ValidName(name); err != nil {
		return err
	}
	if err := rule.ValidatePattern(key); err != nil {
		return err
	}
	entry, err := encodeEntry(entryDeleteOverrides, &raftv1.DeleteOverrides{Rule: name, Keys: []string{key}})
	if err != nil {
		return err
	}
	res, err := n.apply(ctx, entry)
	if err != nil {
		return err
	}
	return res.err
}

// ListOverrides returns the overrides of a rule, sorted by key, from this
// node's copy (ErrNotFound without the rule).
func (n *Node) ListOverrides(name string) ([]rule.RuntimeOverride, error) {
	c := n.Table().Get(name)
	if c == nil {
		return nil, fmt.Errorf("rule %q: %w", name, rule.ErrNotFound)
	}
	return c.Runtime().All(), nil
}

// ExpireOverrides is the leader's cleanup: for each rule holding
// overrides expired at nowUnixNs, one entry deletes them. It returns how
// many rules it cleaned; on a follower it does nothing.
func (n *Node) ExpireOverrides(ctx context.Context, nowUnixNs int64) (int, error) {
	if !n.IsLeader() {
		return 0, nil
	}
	var names []string
	n.fsm.state.Load().Overrides.Each(func(name string, rt *rule.Runtime) {
		if len(rt.Expired(nowUnixNs)) > 0 {
			names = append(names, name)
		}
	})
	sort.Strings(names)
	done := 0
	for _, name := range names {
		entry, err := encodeEntry(entryDeleteOverrides, &raftv1.DeleteOverrides{Rule: name, ExpiredBeforeUnixNs: nowUnixNs})
		if err != nil {
			return done, err
		}
		if _, err := n.apply(ctx, entry); err != nil {
			return done, err
		}
		done++
	}
	return done, nil
}

// attachOverrides gives the compiled rules of t their runtime overrides
// after ch: every rule after a rebuild, else the rule put and the rule
// whose overrides were written.
func attachOverrides(t *rule.Table, o *rule.Overrides, ch ruleChange) {
	if ch.all {
		for _, r := range t.Rules() {
			t.Get(r.Name).Attach(o.Get(r.Name))
		}
		return
	}
	for _, name := range []string{ch.overrides, ruleName(ch.put)} {
		if c := t.Get(name); name != "" && c != nil {
			c.Attach(o.Get(name))
		}
	}
}

func ruleName(r *rule.Rule) string {
	if r == nil {
		return ""
	}
	return r.Name
}
