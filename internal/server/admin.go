package server

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"sort"
	"sync/atomic"

	"google.golang.org/protobuf/proto"

	"github.com/tokenserver/tokenserver/internal/auth"
	"github.com/tokenserver/tokenserver/internal/raftfsm"
	"github.com/tokenserver/tokenserver/internal/rule"
	"github.com/tokenserver/tokenserver/internal/rulepb"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// adminService is the control plane: rules here, membership and status in
// membership.go, snapshots in snapshot.go.
type adminService struct {
	pb.UnimplementedAdminServiceServer
	n      *Node
	digest atomic.Pointer[digestCache]
}

var _ pb.AdminServiceServer = (*adminService)(nil)

// onLeader forwards a call to the leader when err says this node is not it.
// A call that was itself forwarded is not forwarded again: leadership moved
// meanwhile, and the caller retries.
func (n *Node) onLeader(ctx context.Context, err error, call func(context.Context, pb.AdminServiceClient) error) error {
	var le *rule.LeaderError
	if !errors.As(err, &le) {
		return toError(err)
	}
	if forwarded(ctx) {
		return toError(failf(ErrUnavailable, "leadership moved to %s while the call was forwarded; retry", le.ID))
	}
	conn, cerr := n.peers.connTo(le.ID, le.GRPCAddr)
	if cerr != nil {
		return peerError("leader "+le.ID, cerr)
	}
	// The leader records the caller, not this node, as the write's author.
	if ferr := call(auth.ForwardContext(markForwarded(ctx)), pb.NewAdminServiceClient(conn)); ferr != nil {
		return peerError("leader "+le.ID, ferr)
	}
	return nil
}

// PutRule implements pb.AdminServiceServer.
func (s *adminService) PutRule(ctx context.Context, req *pb.PutRuleRequest) (*pb.PutRuleResponse, error) {
	if req.GetRule() == nil {
		return nil, toError(failf(ErrBadRequest, "rule is missing"))
	}
	if err := auth.CheckName(ctx, req.GetRule().GetName()); err != nil {
		return nil, err
	}
	in := rulepb.FromProto(req.GetRule())
	in.UpdatedBy = actor(ctx)
	r, err := s.n.control.PutRequest(ctx, req.GetRequestId(), in, req.ExpectedVersion)
	if err != nil {
		var resp *pb.PutRuleResponse
		err = s.n.onLeader(ctx, err, func(ctx context.Context, c pb.AdminServiceClient) (err error) {
			resp, err = c.PutRule(ctx, req)
			return err
		})
		return resp, err
	}
	s.n.log.Info("rule put", "rule", r.Name, "algorithm", r.Algorithm.String(), "version", r.Version, "by", r.UpdatedBy)
	return &pb.PutRuleResponse{Rule: rulepb.ToProto(r)}, nil
}

// GetRule implements pb.AdminServiceServer.
func (s *adminService) GetRule(ctx context.Context, req *pb.GetRuleRequest) (*pb.Rule, error) {
	if err := auth.CheckName(ctx, req.GetName()); err != nil {
		return nil, err
	}
	if req.GetLocal() {
		if err := rule.ValidName(req.GetName()); err != nil {
			return nil, toError(err)
		}
		c := s.n.data.Table().Get(req.GetName())
		if c == nil {
			return nil, toError(&failure{kind: rule.ErrNotFound, msg: fmt.Sprintf("rule %q not found on node %s", req.GetName(), s.n.data.ID())})
		}
		return rulepb.ToProto(c.Rule), nil
	}
	r, err := s.n.control.Get(ctx, req.GetName())
	if err != nil {
		var resp *pb.Rule
		err = s.n.onLeader(ctx, err, func(ctx context.Context, c pb.AdminServiceClient) (err error) {
			resp, err = c.GetRule(ctx, req)
			return err
		})
		return resp, err
	}
	return rulepb.ToProto(r), nil
}

// Paging of ListRules: a page holds at most maxListPage rules and about
// listPageBytes of encoded rules (at least one rule), so that it fits the
// default 4 MiB gRPC message limit of clients.
const (
	defaultListPage = 500
	maxListPage     = 1000
	listPageBytes   = 3 << 20
)

// ListRules implements pb.AdminServiceServer: rules sorted by name, one
// page at a time. page_token is the opaque next_page_token of the previous
// page (the base64 of the last name it held).
func (s *adminService) ListRules(ctx context.Context, req *pb.ListRulesRequest) (*pb.ListRulesResponse, error) {
	after, err := base64.RawURLEncoding.DecodeString(req.GetPageToken())
	if err != nil || len(after) > rule.MaxNameLen {
		return nil, toError(failf(ErrBadRequest, "page_token %q is not a token ListRules returned", req.GetPageToken()))
	}
	size := int(req.GetPageSize())
	switch {
	case size < 0:
		return nil, toError(failf(ErrBadRequest, "page_size must be >= 0, got %d", size))
	case size == 0:
		size = defaultListPage
	case size > maxListPage:
		size = maxListPage
	}
	var rules []*rule.Rule
	more := false
	if req.GetLocal() {
		rules, more = s.n.data.Table().Page(string(after), size)
	} else {
		var err error
		if rules, err = s.n.control.List(ctx); err != nil {
			var resp *pb.ListRulesResponse
			err = s.n.onLeader(ctx, err, func(ctx context.Context, c pb.AdminServiceClient) (err error) {
				resp, err = c.ListRules(ctx, req)
				return err
			})
			return resp, err
		}
		i := sort.Search(len(rules), func(i int) bool { return rules[i].Name > string(after) })
		rules = rules[i:]
		if len(rules) > size {
			rules, more = rules[:size], true
		}
	}
	out := &pb.ListRulesResponse{Rules: make([]*pb.Rule, 0, len(rules))}
	bytes := 0
	for i, r := range rules {
		p := rulepb.ToProto(r)
		if bytes += proto.Size(p); i > 0 && bytes > listPageBytes {
			more = true
			break
		}
		out.Rules = append(out.Rules, p)
	}
	if more && len(out.Rules) > 0 {
		out.NextPageToken = base64.RawURLEncoding.EncodeToString([]byte(out.Rules[len(out.Rules)-1].GetName()))
	}
	return out, nil
}

// DeleteRule implements pb.AdminServiceServer.
func (s *adminService) DeleteRule(ctx context.Context, req *pb.DeleteRuleRequest) (*pb.DeleteRuleResponse, error) {
	if err := auth.CheckName(ctx, req.GetName()); err != nil {
		return nil, err
	}
	if err := s.n.control.DeleteRequest(raftfsm.WithAuthor(ctx, actor(ctx)), req.GetRequestId(), req.GetName(), req.ExpectedVersion); err != nil {
		err = s.n.onLeader(ctx, err, func(ctx context.Context, c pb.AdminServiceClient) error {
			_, err := c.DeleteRule(ctx, req)
			return err
		})
		if err != nil {
			return nil, err
		}
		return &pb.DeleteRuleResponse{}, nil
	}
	s.n.log.Info("rule deleted", "rule", req.GetName())
	return &pb.DeleteRuleResponse{}, nil
}
