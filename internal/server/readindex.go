package server

import (
	"context"
	"errors"
	"time"

	"github.com/tokenserver/tokenserver/internal/rule"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// The NotFound contract of the data plane: a rule whose PutRule returned
// is known to every node that answers. A node that does not find a rule in
// its table asks the leader (a current read: ReadIndex and VerifyLeader,
// see ControlPlane.Get) before it answers NotFound; if the leader has the
// rule, the node waits for its own table to apply it and decides. So a
// rule is NotFound only if the leader did not have it at some moment
// during the call. When the leader cannot be asked in time the node
// answers from its own table, as before.

// maxRuleConfirms bounds the leader reads of unknown rules a node makes at
// once: past it, an unknown rule is NotFound from the local table alone
// (so a flood of made-up rule names costs the leader little).
const maxRuleConfirms = 16

// confirmWait bounds a confirmation: the leader read and the wait for the
// local apply, within the caller's deadline.
const confirmWait = time.Second

// confirmRule asks the leader whether rule name exists and, if it does,
// waits for this node's table to hold it and returns it; nil when the
// rule does not exist, or the answer did not come in time.
func (n *Node) confirmRule(ctx context.Context, name string) *rule.Compiled {
	select {
	case n.confirms <- struct{}{}:
		defer func() { <-n.confirms }()
	default:
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, confirmWait)
	defer cancel()
	if !n.leaderHas(ctx, name) {
		return nil
	}
	for {
		t := n.data.Table()
		if c := t.Get(name); c != nil {
			return c
		}
		select {
		case <-t.Changed():
		case <-ctx.Done():
			return nil
		case <-n.done:
			return nil
		}
	}
}

// leaderHas reports whether the leader's table holds rule name, by a
// current read on the leader (this node, or the leader over gRPC).
func (n *Node) leaderHas(ctx context.Context, name string) bool {
	if id, _ := n.data.Leader(); id == "" {
		return false // no leader to ask (a minority, an election): the local table answers
	}
	n.metrics.ruleConfirms.Inc()
	_, err := n.control.Get(ctx, name)
	var le *rule.LeaderError
	if !errors.As(err, &le) {
		return err == nil
	}
	conn, err := n.peers.connTo(le.ID, le.GRPCAddr)
	if err != nil {
		return false
	}
	_, err = pb.NewAdminServiceClient(conn).GetRule(markForwarded(ctx), &pb.GetRuleRequest{Name: name})
	return err == nil
}
