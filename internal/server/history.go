package server

import (
	"context"
	"fmt"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/tokenserver/tokenserver/internal/auth"
	"github.com/tokenserver/tokenserver/internal/raftfsm"
	"github.com/tokenserver/tokenserver/internal/rule"
	"github.com/tokenserver/tokenserver/internal/rulepb"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// historian is the part of the control plane that keeps rule history
// (the Raft node's, through RaftCluster and Standalone).
type historian interface {
	RuleHistory(name string) []raftfsm.RuleVersion
	Rollback(ctx context.Context, name string, toVersion uint64, expected *uint64, principal string) (*rule.Rule, error)
}

// history returns the control plane's historian, or an error saying the
// node keeps none.
func (n *Node) history() (historian, error) {
	h, ok := n.control.(historian)
	if !ok {
		return nil, failf(ErrUnavailable, "this node's control plane keeps no rule history")
	}
	return h, nil
}

// leaderElsewhere returns the leader's id and address when this node is
// not the leader and knows it.
func (n *Node) leaderElsewhere() (id, addr string, ok bool) {
	id, addr = n.data.Leader()
	return id, addr, id != "" && id != n.data.ID() && addr != ""
}

// atLeader calls the leader for a read that should be current: call runs
// against the leader's AdminService with the forwarded marker.
func (n *Node) atLeader(ctx context.Context, id, addr string, call func(context.Context, pb.AdminServiceClient) error) error {
	return n.onLeader(ctx, &rule.LeaderError{ID: id, GRPCAddr: addr}, call)
}

// RuleHistory implements pb.AdminServiceServer: the rule's versions,
// newest first, as the leader has them (or this node, with local).
func (s *adminService) RuleHistory(ctx context.Context, req *pb.RuleHistoryRequest) (*pb.RuleHistoryResponse, error) {
	if err := auth.CheckName(ctx, req.GetName()); err != nil {
		return nil, err
	}
	if err := rule.ValidName(req.GetName()); err != nil {
		return nil, toError(err)
	}
	if id, addr, ok := s.n.leaderElsewhere(); ok && !req.GetLocal() && !forwarded(ctx) {
		var resp *pb.RuleHistoryResponse
		err := s.n.atLeader(ctx, id, addr, func(ctx context.Context, c pb.AdminServiceClient) (err error) {
			resp, err = c.RuleHistory(ctx, req)
			return err
		})
		return resp, err
	}
	h, err := s.n.history()
	if err != nil {
		return nil, toError(err)
	}
	vs := h.RuleHistory(req.GetName())
	if len(vs) == 0 {
		return nil, toError(fmt.Errorf("rule %q has no history: %w", req.GetName(), rule.ErrNotFound))
	}
	out := &pb.RuleHistoryResponse{Versions: make([]*pb.RuleVersion, len(vs))}
	for i, v := range vs {
		pv := &pb.RuleVersion{Version: v.Version, Principal: v.Principal, Change: v.Change}
		if !v.Time.IsZero() {
			pv.TimeUnixNs = v.Time.UnixNano()
		}
		if v.Rule != nil {
			pv.Rule = rulepb.ToProto(v.Rule)
		}
		out.Versions[i] = pv
	}
	return out, nil
}

// RollbackRule implements pb.AdminServiceServer: a new version equal to
// an old one, written on the leader and audited like PutRule.
func (s *adminService) RollbackRule(ctx context.Context, req *pb.RollbackRuleRequest) (*pb.PutRuleResponse, error) {
	if err := auth.CheckName(ctx, req.GetName()); err != nil {
		return nil, err
	}
	h, err := s.n.history()
	if err != nil {
		return nil, toError(err)
	}
	r, err := h.Rollback(ctx, req.GetName(), req.GetToVersion(), req.ExpectedVersion, actor(ctx))
	if err != nil {
		var resp *pb.PutRuleResponse
		err = s.n.onLeader(ctx, err, func(ctx context.Context, c pb.AdminServiceClient) (err error) {
			resp, err = c.RollbackRule(ctx, req)
			return err
		})
		return resp, err
	}
	s.n.log.Info("rule rolled back", "rule", r.Name, "to_version", req.GetToVersion(), "version", r.Version, "by", r.UpdatedBy)
	return &pb.PutRuleResponse{Rule: rulepb.ToProto(r)}, nil
}

// Fields DiffRules leaves out: the server sets them on every write.
var diffIgnored = map[protoreflect.Name]bool{"version": true, "generation": true, "updated_by": true}

// DiffRules implements pb.AdminServiceServer: what PutRule of each rule
// would change against the leader's table, with the validation error of
// a rule PutRule would refuse. It changes nothing.
func (s *adminService) DiffRules(ctx context.Context, req *pb.DiffRulesRequest) (*pb.DiffRulesResponse, error) {
	if id, addr, ok := s.n.leaderElsewhere(); ok && !forwarded(ctx) {
		var resp *pb.DiffRulesResponse
		err := s.n.atLeader(ctx, id, addr, func(ctx context.Context, c pb.AdminServiceClient) (err error) {
			resp, err = c.DiffRules(ctx, req)
			return err
		})
		return resp, err
	}
	if len(req.GetRules()) > maxListPage {
		return nil, toError(failf(ErrBadRequest, "rules has %d items, above the limit of %d per call", len(req.GetRules()), maxListPage))
	}
	t := s.n.data.Table()
	out := &pb.DiffRulesResponse{Diffs: make([]*pb.RuleDiff, 0, len(req.GetRules()))}
	for _, in := range req.GetRules() {
		d := &pb.RuleDiff{Name: in.GetName()}
		out.Diffs = append(out.Diffs, d)
		r := rulepb.FromProto(in)
		r.Normalize()
		if err := r.Validate(); err != nil {
			d.Error = toStatus(err).Message()
			d.Proposed = in
			continue
		}
		d.Proposed = rulepb.ToProto(r)
		c := t.Get(r.Name)
		if c == nil {
			d.Change = "CREATE"
			continue
		}
		d.Current = rulepb.ToProto(c.Rule)
		d.Fields = diffFields(d.Current, d.Proposed)
		d.Change = "UPDATE"
		if len(d.Fields) == 0 {
			d.Change = "UNCHANGED"
		}
	}
	return out, nil
}

// diffFields lists the JSON names of the fields of a and b that differ,
// in field-number order, leaving out diffIgnored.
func diffFields(a, b *pb.Rule) []string {
	ra, rb := a.ProtoReflect(), b.ProtoReflect()
	fields := ra.Descriptor().Fields()
	var out []string
	for i := range fields.Len() {
		fd := fields.Get(i)
		if diffIgnored[fd.Name()] {
			continue
		}
		if ra.Has(fd) != rb.Has(fd) {
			out = append(out, fd.JSONName())
			continue
		}
		if !ra.Has(fd) {
			continue
		}
		ma, mb := new(pb.Rule), new(pb.Rule)
		ma.ProtoReflect().Set(fd, ra.Get(fd))
		mb.ProtoReflect().Set(fd, rb.Get(fd))
		if !proto.Equal(ma, mb) {
			out = append(out, fd.JSONName())
		}
	}
	return out
}
