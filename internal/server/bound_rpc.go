package server

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/tokenserver/tokenserver/internal/replica"
	"github.com/tokenserver/tokenserver/internal/rule"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// RuleBound implements pb.AdminServiceServer: the rule's over-admission
// bound (n.bound, the value of tokenserver_overadmission_bound_permits)
// part by part on every member of the view, in one fan-out, unless local
// is set. The console's rule page shows it.
func (s *adminService) RuleBound(ctx context.Context, req *pb.RuleBoundRequest) (*pb.RuleBoundResponse, error) {
	n := s.n
	if err := rule.ValidName(req.GetRule()); err != nil {
		return nil, toError(err)
	}
	c := n.data.Table().Get(req.GetRule())
	if c == nil {
		// A rule whose PutRule returned is known here too (readindex.go):
		// a node whose table lags waits for it rather than answer
		// NotFound (the console asks right after a write).
		c = n.confirmRule(ctx, req.GetRule())
	}
	if c == nil {
		if !n.data.Ready() {
			return nil, toError(failf(ErrNotReady, "rule %q is not in this node's table yet; retry", req.GetRule()))
		}
		return nil, toError(fmt.Errorf("rule %q: %w", req.GetRule(), rule.ErrNotFound))
	}
	out := &pb.RuleBoundResponse{Durable: c.Rule.Durable, Nodes: []*pb.NodeBound{n.localBound(c, time.Now())}}
	if req.GetLocal() {
		return out, nil
	}
	peerReq := &pb.RuleBoundRequest{Rule: req.GetRule(), Local: true}
	var others []*pb.NodeBound
	out.MissingNodes = fanOut(ctx, n, func(ctx context.Context, c pb.AdminServiceClient) (*pb.RuleBoundResponse, error) {
		return c.RuleBound(ctx, peerReq)
	}, func(r *pb.RuleBoundResponse) { others = append(others, r.GetNodes()...) })
	slices.SortFunc(others, func(a, b *pb.NodeBound) int { return cmp.Compare(a.GetNode(), b.GetNode()) })
	slices.Sort(out.MissingNodes)
	out.Nodes = append(out.Nodes, others...)
	return out, nil
}

// localBound is this node's bound for c at now, with its last checkpoint
// (the checkpoint file's modification time: the file is replaced whole on
// every write).
func (n *Node) localBound(c *rule.Compiled, now time.Time) *pb.NodeBound {
	nb := &pb.NodeBound{Node: n.data.ID()}
	for _, p := range n.bound.Parts(c, now) {
		nb.Parts = append(nb.Parts, &pb.BoundPart{Name: p.Name, Permits: p.Permits})
		nb.Permits += p.Permits
	}
	if dir := n.cfg.CheckpointDir; dir != "" {
		if fi, err := os.Stat(filepath.Join(dir, replica.CheckpointFile)); err == nil {
			nb.CheckpointUnixNs = fi.ModTime().UnixNano()
			if n.replica != nil {
				nb.CheckpointBuckets = n.replica.CheckpointBuckets.Load()
			}
		}
	}
	return nb
}
