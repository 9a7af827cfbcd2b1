package rule

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// Store keeps the rule table. Writes are linearizable; Table is the local
// copy the data plane reads without a lock. Implementations: MemStore here,
// the Raft-replicated store in internal/raftfsm.
type Store interface {
	// Put validates r and creates or replaces the rule of its name. With
	// expected non-nil it is a compare-and-set on the stored version (0:
	// the rule must not exist) failing with ErrVersionMismatch. It returns
	// the stored rule with its Version and Generation.
	Put(ctx context.Context, r *Rule, expected *uint64) (*Rule, error)
	// Delete removes a rule (ErrNotFound if there is none), with the same
	// compare-and-set as Put.
	Delete(ctx context.Context, name string, expected *uint64) error
	// Get returns a current copy of one rule, or ErrNotFound.
	Get(ctx context.Context, name string) (*Rule, error)
	// List returns current copies of every rule, sorted by name.
	List(ctx context.Context) ([]*Rule, error)
	// Table returns the local table. It never returns nil.
	Table() *Table
}

// MemStore is a Store in memory: a restart loses its rules. It is safe for
// simultaneous use by multiple goroutines.
type MemStore struct {
	mu      sync.Mutex // serializes writes
	version uint64
	rules   map[string]*Rule
	table   atomic.Pointer[Table]
}

var _ Store = (*MemStore)(nil)

// NewMemStore returns an empty MemStore.
func NewMemStore() *MemStore {
	s := &MemStore{rules: make(map[string]*Rule)}
	s.table.Store(NewTable(0, nil, nil))
	return s
}

// Put implements Store.
func (s *MemStore) Put(_ context.Context, r *Rule, expected *uint64) (*Rule, error) {
	r = r.Clone()
	r.Normalize()
	if err := r.Validate(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.rules[r.Name]
	if err := CheckExpected(r.Name, old, expected); err != nil {
		return nil, err
	}
	if err := CheckRuleCount(r.Name, old != nil, len(s.rules)); err != nil {
		return nil, err
	}
	s.version++
	r.Version = s.version
	r.Generation = s.version
	if old != nil && old.Algorithm == r.Algorithm {
		r.Generation = old.Generation
	}
	s.rules[r.Name] = r
	s.publish(r, "")
	return r.Clone(), nil
}

// Delete implements Store.
func (s *MemStore) Delete(_ context.Context, name string, expected *uint64) error {
	if err := ValidName(name); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.rules[name]
	if old == nil {
		return fmt.Errorf("delete %q: %w", name, ErrNotFound)
	}
	if err := CheckExpected(name, old, expected); err != nil {
		return err
	}
	s.version++
	delete(s.rules, name)
	s.publish(nil, name)
	return nil
}

// ErrTooManyRules means a new rule would pass the cluster's rule cap
// (SetMaxRules); the server answers ResourceExhausted.
var ErrTooManyRules = errors.New("too many rules")

var maxRules atomic.Int64

func init() { maxRules.Store(DefaultMaxRules) }

// SetMaxRules sets the most rules a cluster holds (n <= 0: DefaultMaxRules).
// Stores check it when a write is applied, so every node of a cluster must
// use the same value: a node with a lower one would refuse a rule the
// others hold. It is process-wide.
func SetMaxRules(n int) {
	if n <= 0 {
		n = DefaultMaxRules
	}
	maxRules.Store(int64(n))
}

// MaxRules is the cap SetMaxRules set.
func MaxRules() int { return int(maxRules.Load()) }

// CheckRuleCount is the rule cap of Put: nil when the rule named name
// exists already or have rules leave room for one more, else
// ErrTooManyRules.
func CheckRuleCount(name string, exists bool, have int) error {
	if exists || int64(have) < maxRules.Load() {
		return nil
	}
	return fmt.Errorf("rule %q would be rule %d, above the cluster's limit of %d rules (--max-rules): %w", name, have+1, maxRules.Load(), ErrTooManyRules)
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

// publish swaps in a new table with r put or the rule named del deleted;
// s.mu is held.
func (s *MemStore) publish(r *Rule, del string) {
	old := s.table.Load()
	s.table.Store(old.With(s.version, r, del))
	old.Supersede()
}

// Get implements Store.
func (s *MemStore) Get(_ context.Context, name string) (*Rule, error) {
	if err := ValidName(name); err != nil {
		return nil, err
	}
	c := s.Table().Get(name)
	if c == nil {
		return nil, fmt.Errorf("get %q: %w", name, ErrNotFound)
	}
	return c.Rule.Clone(), nil
}

// List implements Store.
func (s *MemStore) List(context.Context) ([]*Rule, error) {
	rules := s.Table().Rules()
	for i, r := range rules {
		rules[i] = r.Clone()
	}
	return rules, nil
}

// Table implements Store.
func (s *MemStore) Table() *Table { return s.table.Load() }

// ErrNotLeader means a write or a current read must be made on the leader;
// the error is a *LeaderError that names it, so the caller can forward.
var ErrNotLeader = errors.New("not the leader")

// LeaderError is ErrNotLeader with the leader's id and gRPC address.
type LeaderError struct {
	ID       string
	GRPCAddr string
}

func (e *LeaderError) Error() string {
	return fmt.Sprintf("not the leader: the leader is %s at %s", e.ID, e.GRPCAddr)
}

// Is makes errors.Is(err, ErrNotLeader) true.
func (e *LeaderError) Is(target error) bool { return target == ErrNotLeader }
