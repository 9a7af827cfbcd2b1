package rule

import (
	"fmt"
	"maps"
)

// Set is the one implementation of what a rule write does to the rule
// set: put with compare-and-set and the rule cap, delete, replace all, and
// the versions and generations that follow. A version is the index of the
// write that made it (the Raft index in internal/raftfsm); a rule's
// generation is the version at which it was created, kept while later puts
// keep its algorithm, so that buckets survive a change of limits but not a
// change of algorithm.
//
// Set does not validate: a write is validated once, where it enters the
// cluster, and a Set applies what it is given, so that a replayed log
// yields the same set whatever the validation of the release that replays
// it. It checks only what it needs to stay well formed: a rule and a name.
//
// Set is a plain value with no lock: its owner serializes writes (the FSM
// applies entries one at a time). Rules put into a Set belong to it and
// must not be modified afterwards.
type Set struct {
	rules map[string]*Rule
}

// NewSet returns an empty Set.
func NewSet() *Set { return &Set{rules: map[string]*Rule{}} }

// Len is the number of rules.
func (s *Set) Len() int { return len(s.rules) }

// Get returns the rule of that name, or nil. Do not modify it.
func (s *Set) Get(name string) *Rule { return s.rules[name] }

// All returns the rules by name, in the Set's own map: do not modify it.
func (s *Set) All() map[string]*Rule { return s.rules }

// Clone returns a Set with the same rules (which are shared: they are
// immutable once stored).
func (s *Set) Clone() *Set { return &Set{rules: maps.Clone(s.rules)} }

// Put stores r (which becomes the Set's) as the write at index: with
// expected non-nil a compare-and-set on the stored version (0: the rule
// must not exist), ErrVersionMismatch otherwise; a new rule past maxRules
// rules (0: no cap) is ErrTooManyRules. r gets Version index, and
// Generation index unless it replaces a rule of the same algorithm, whose
// generation it keeps. A refused put changes nothing.
func (s *Set) Put(index uint64, r *Rule, expected *uint64, maxRules int) error {
	if r == nil || r.Name == "" {
		return Invalid("put at %d holds no rule or a rule without a name", index)
	}
	old := s.rules[r.Name]
	if err := CheckExpected(r.Name, old, expected); err != nil {
		return err
	}
	if old == nil && maxRules > 0 && len(s.rules) >= maxRules {
		return fmt.Errorf("rule %q would be rule %d, above the cluster's limit of %d rules (--max-rules): %w",
			r.Name, len(s.rules)+1, maxRules, ErrTooManyRules)
	}
	r.Version, r.Generation = index, index
	if old != nil && old.Algorithm == r.Algorithm {
		r.Generation = old.Generation
	}
	s.rules[r.Name] = r
	return nil
}

// Delete removes the rule named name: ErrNotFound when there is none, and
// the compare-and-set of Put.
func (s *Set) Delete(name string, expected *uint64) error {
	old := s.rules[name]
	if old == nil {
		return fmt.Errorf("delete %q: %w", name, ErrNotFound)
	}
	if err := CheckExpected(name, old, expected); err != nil {
		return err
	}
	delete(s.rules, name)
	return nil
}

// Replace makes rules (which become the Set's) the whole set as the write
// at index: each rule gets Version and Generation index (a restore starts
// every rule's buckets afresh). A nil or unnamed rule refuses the whole
// replace and changes nothing; of two rules of one name the later wins.
func (s *Set) Replace(index uint64, rules []*Rule) error {
	next := make(map[string]*Rule, len(rules))
	for _, r := range rules {
		if r == nil || r.Name == "" {
			return Invalid("restore at %d holds an empty rule", index)
		}
		r.Version, r.Generation = index, index
		next[r.Name] = r
	}
	s.rules = next
	return nil
}

// Load makes rules, with the versions and generations they carry, the
// whole set: the state of a snapshot. A nil rule, or two of one name, is an
// error and changes nothing.
func (s *Set) Load(rules []*Rule) error {
	next := make(map[string]*Rule, len(rules))
	for _, r := range rules {
		if r == nil || r.Name == "" {
			return Invalid("a rule without a name")
		}
		if _, dup := next[r.Name]; dup {
			return Invalid("rule %q twice", r.Name)
		}
		next[r.Name] = r
	}
	s.rules = next
	return nil
}

// CheckExpected is the compare-and-set of Put and Delete: nil when expected
// is nil or is old's version (0 for no rule), else ErrVersionMismatch.
func CheckExpected(name string, old *Rule, expected *uint64) error {
	if expected == nil {
		return nil
	}
	var have uint64
	if old != nil {
		have = old.Version
	}
	if have != *expected {
		return fmt.Errorf("rule %q is at version %d, not the expected %d: %w", name, have, *expected, ErrVersionMismatch)
	}
	return nil
}
