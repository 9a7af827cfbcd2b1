package raftfsm

import (
	"context"
	"fmt"
	"time"

	"github.com/tokenserver/tokenserver/internal/rule"
	raftv1 "github.com/tokenserver/tokenserver/proto/tokenserver/raft/v1"
)

// The rule store: writes that enter the log here (validated, capped,
// with their request ids) and reads that are current on the leader.

// Put implements rule.Store: PutRequest without a request id.
func (n *Node) Put(ctx context.Context, r *rule.Rule, expected *uint64) (*rule.Rule, error) {
	return n.PutRequest(ctx, "", r, expected)
}

// PutRequest puts a rule on the leader; elsewhere it returns a
// *rule.LeaderError for the caller to forward. It is where a rule write
// enters the log, so it normalizes and validates the rule here, and
// refuses a rule past the table's byte cap: the FSM applies what it is
// given (and the caps the entry carries). requestID, when not empty, is
// the write's idempotency key: a write the cluster already applied with
// that id answers its first result again and changes nothing (at most
// MaxRequestIDLen bytes).
func (n *Node) PutRequest(ctx context.Context, requestID string, r *rule.Rule, expected *uint64) (*rule.Rule, error) {
	if err := validRequestID(requestID); err != nil {
		return nil, err
	}
	r = r.Clone()
	r.Normalize()
	if err := r.Validate(); err != nil {
		return nil, err
	}
	if err := n.checkTableBytes(r); err != nil {
		return nil, err
	}
	entry, err := encodeEntry(entryPutRule, &raftv1.PutRule{Rule: ruleToPB(r), ExpectedVersion: expected, MaxRules: int64(n.cfg.maxRules()),
		MaxTableBytes: n.cfg.maxTableBytes(), RequestId: requestID, TimeUnixNs: time.Now().UnixNano()})
	if err != nil {
		return nil, err
	}
	res, err := n.apply(ctx, entry)
	if err != nil {
		return nil, err
	}
	return res.rule, res.err
}

// checkTableBytes refuses at the edge a rule that would bring the local
// table past the byte cap (the FSM checks again against the table the
// entry meets).
func (n *Node) checkTableBytes(r *rule.Rule) error {
	was := n.fsm.state.Load().RuleBytes
	total := was + ruleBytes(r)
	if c := n.fsm.Table().Get(r.Name); c != nil {
		total -= ruleBytes(c.Rule)
	}
	return tableBytesCheck(r.Name, was, total, n.cfg.maxTableBytes())
}

// Delete implements rule.Store: DeleteRequest without a request id.
func (n *Node) Delete(ctx context.Context, name string, expected *uint64) error {
	return n.DeleteRequest(ctx, "", name, expected)
}

// DeleteRequest deletes a rule, like PutRequest.
func (n *Node) DeleteRequest(ctx context.Context, requestID, name string, expected *uint64) error {
	if err := validRequestID(requestID); err != nil {
		return err
	}
	if err := rule.ValidName(name); err != nil {
		return err
	}
	entry, err := encodeEntry(entryDeleteRule, &raftv1.DeleteRule{Name: name, ExpectedVersion: expected, RequestId: requestID,
		Principal: authorOf(ctx), TimeUnixNs: time.Now().UnixNano()})
	if err != nil {
		return err
	}
	res, err := n.apply(ctx, entry)
	if err != nil {
		return err
	}
	return res.err
}

// Get implements rule.Store: a current read on the leader.
func (n *Node) Get(ctx context.Context, name string) (*rule.Rule, error) {
	if err := rule.ValidName(name); err != nil {
		return nil, err
	}
	if err := n.consistent(ctx); err != nil {
		return nil, err
	}
	c := n.fsm.Table().Get(name)
	if c == nil {
		return nil, fmt.Errorf("get %q: %w", name, rule.ErrNotFound)
	}
	return c.Rule.Clone(), nil
}

// List implements rule.Store: a current read on the leader.
func (n *Node) List(ctx context.Context) ([]*rule.Rule, error) {
	if err := n.consistent(ctx); err != nil {
		return nil, err
	}
	rules := n.fsm.Table().Rules()
	for i, r := range rules {
		rules[i] = r.Clone()
	}
	return rules, nil
}
