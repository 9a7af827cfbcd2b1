package rule

import (
	"context"
	"errors"
	"fmt"
)

// Store keeps the rule table. Writes are linearizable; Table is the local
// copy the data plane reads without a lock. The implementation is the
// Raft-replicated store in internal/raftfsm (raftfsm.NewInmem for tests);
// the rule-set semantics live once, in Set.
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

// ErrTooManyRules means a new rule would pass the cluster's rule cap; the
// server answers ResourceExhausted.
var ErrTooManyRules = errors.New("too many rules")

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
