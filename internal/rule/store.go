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

// MemStore is a Store in memory, without Raft: a restart loses its rules.
// It has no rule semantics of its own: it validates a write (the edge,
// like the Raft node's Put) and hands it to a Set, numbering writes 1, 2,
// 3... as its versions. Tests of other packages should prefer
// raftfsm.NewInmem, which goes through the Raft log as production does.
// It is safe for simultaneous use by multiple goroutines.
type MemStore struct {
	mu      sync.Mutex // serializes writes
	version uint64     // of the last successful write
	set     *Set
	table   atomic.Pointer[Table]
}

var _ Store = (*MemStore)(nil)

// NewMemStore returns an empty MemStore.
func NewMemStore() *MemStore {
	s := &MemStore{set: NewSet()}
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
	if err := s.set.Put(s.version+1, r, expected, MaxRules()); err != nil { //nolint:staticcheck // the process-wide cap until internal/server stops setting it
		return nil, err
	}
	s.version++
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
	if err := s.set.Delete(name, expected); err != nil {
		return err
	}
	s.version++
	s.publish(nil, name)
	return nil
}

// ErrTooManyRules means a new rule would pass the cluster's rule cap; the
// server answers ResourceExhausted.
var ErrTooManyRules = errors.New("too many rules")

// maxRules is the process-wide cap of SetMaxRules.
//
// Deprecated: it stays only while internal/server calls SetMaxRules; the
// cap is a configuration field (raftfsm.Config.MaxRules) carried in each
// put entry, and rule.Set takes it as an argument.
var maxRules atomic.Int64

func init() { maxRules.Store(DefaultMaxRules) }

// SetMaxRules sets the process-wide rule cap that MemStore applies and that
// a raftfsm node uses when its Config.MaxRules is 0 (n <= 0:
// DefaultMaxRules).
//
// Deprecated: set raftfsm.Config.MaxRules instead; this is removed once
// internal/server stops calling it.
func SetMaxRules(n int) {
	if n <= 0 {
		n = DefaultMaxRules
	}
	maxRules.Store(int64(n))
}

// MaxRules is the cap SetMaxRules set.
//
// Deprecated: see SetMaxRules.
func MaxRules() int { return int(maxRules.Load()) }

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
