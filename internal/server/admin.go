package server

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tokenserver/tokenserver/internal/rule"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// adminService is the control plane.
type adminService struct {
	pb.UnimplementedAdminServiceServer
	n *Node
}

var _ pb.AdminServiceServer = (*adminService)(nil)

// PutRule implements pb.AdminServiceServer.
func (s *adminService) PutRule(ctx context.Context, req *pb.PutRuleRequest) (*pb.PutRuleResponse, error) {
	if req.GetRule() == nil {
		return nil, status.Error(codes.InvalidArgument, "rule is missing")
	}
	r, err := s.n.store.Put(ctx, RuleFromProto(req.GetRule()), req.ExpectedVersion)
	if err != nil {
		return nil, toError(err)
	}
	s.n.log.Info("rule put", "rule", r.Name, "algorithm", r.Algorithm.String(), "version", r.Version)
	return &pb.PutRuleResponse{Rule: RuleToProto(r)}, nil
}

// GetRule implements pb.AdminServiceServer.
func (s *adminService) GetRule(ctx context.Context, req *pb.GetRuleRequest) (*pb.Rule, error) {
	if req.GetLocal() {
		if err := rule.ValidName(req.GetName()); err != nil {
			return nil, toError(err)
		}
		c := s.n.store.Table().Get(req.GetName())
		if c == nil {
			return nil, status.Errorf(codes.NotFound, "rule %q not found", req.GetName())
		}
		return RuleToProto(c.Rule), nil
	}
	r, err := s.n.store.Get(ctx, req.GetName())
	if err != nil {
		return nil, toError(err)
	}
	return RuleToProto(r), nil
}

// ListRules implements pb.AdminServiceServer.
func (s *adminService) ListRules(ctx context.Context, req *pb.ListRulesRequest) (*pb.ListRulesResponse, error) {
	var rules []*rule.Rule
	if req.GetLocal() {
		rules = s.n.store.Table().Rules()
	} else {
		var err error
		if rules, err = s.n.store.List(ctx); err != nil {
			return nil, toError(err)
		}
	}
	out := &pb.ListRulesResponse{Rules: make([]*pb.Rule, len(rules))}
	for i, r := range rules {
		out.Rules[i] = RuleToProto(r)
	}
	return out, nil
}

// DeleteRule implements pb.AdminServiceServer.
func (s *adminService) DeleteRule(ctx context.Context, req *pb.DeleteRuleRequest) (*pb.DeleteRuleResponse, error) {
	if err := s.n.store.Delete(ctx, req.GetName(), req.ExpectedVersion); err != nil {
		return nil, toError(err)
	}
	s.n.log.Info("rule deleted", "rule", req.GetName())
	return &pb.DeleteRuleResponse{}, nil
}
