package server

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokenserver/tokenserver/internal/auth"
	"github.com/tokenserver/tokenserver/internal/buildinfo"
	"github.com/tokenserver/tokenserver/internal/rule"
	"github.com/tokenserver/tokenserver/internal/rulepb"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// adminService is the control plane.
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
		return status.Errorf(codes.Unavailable, "leadership moved to %s while the call was forwarded; retry", le.ID)
	}
	conn, cerr := n.peers.conn(le.GRPCAddr)
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
		return nil, status.Error(codes.InvalidArgument, "rule is missing")
	}
	in := rulepb.FromProto(req.GetRule())
	in.UpdatedBy = actor(ctx)
	r, err := s.n.cluster.Put(ctx, in, req.ExpectedVersion)
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
	if req.GetLocal() {
		if err := rule.ValidName(req.GetName()); err != nil {
			return nil, toError(err)
		}
		c := s.n.cluster.Table().Get(req.GetName())
		if c == nil {
			return nil, status.Errorf(codes.NotFound, "rule %q not found on node %s", req.GetName(), s.n.cluster.ID())
		}
		return rulepb.ToProto(c.Rule), nil
	}
	r, err := s.n.cluster.Get(ctx, req.GetName())
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
		return nil, status.Errorf(codes.InvalidArgument, "page_token %q is not a token ListRules returned", req.GetPageToken())
	}
	size := int(req.GetPageSize())
	switch {
	case size < 0:
		return nil, status.Errorf(codes.InvalidArgument, "page_size must be >= 0, got %d", size)
	case size == 0:
		size = defaultListPage
	case size > maxListPage:
		size = maxListPage
	}
	var rules []*rule.Rule
	more := false
	if req.GetLocal() {
		rules, more = s.n.cluster.Table().Page(string(after), size)
	} else {
		var err error
		if rules, err = s.n.cluster.List(ctx); err != nil {
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
	if err := s.n.cluster.Delete(ctx, req.GetName(), req.ExpectedVersion); err != nil {
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

// JoinCluster implements pb.AdminServiceServer.
func (s *adminService) JoinCluster(ctx context.Context, req *pb.JoinClusterRequest) (*pb.JoinClusterResponse, error) {
	if req.GetId() == "" || req.GetRaftAddr() == "" || req.GetGrpcAddr() == "" {
		return nil, status.Error(codes.InvalidArgument, "join needs id, raft_addr and grpc_addr")
	}
	// A node joining itself must be the node its certificate names (a
	// forwarded join was checked where it arrived; an admin's join, or a
	// peer CA without node ids, is checked by the join probe: the Raft
	// address must answer as that id).
	if p, ok := auth.FromContext(ctx); ok && p.IsPeer() && p.NodeID != "" && !forwarded(ctx) && !auth.PeerNamesNode(ctx, req.GetId()) {
		return nil, status.Errorf(codes.PermissionDenied, "%s may join only as itself, not as %q", p, req.GetId())
	}
	if err := s.n.cluster.AddMember(ctx, req.GetId(), req.GetRaftAddr(), req.GetGrpcAddr()); err != nil {
		err = s.n.onLeader(ctx, err, func(ctx context.Context, c pb.AdminServiceClient) error {
			_, err := c.JoinCluster(ctx, req)
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	return &pb.JoinClusterResponse{}, nil
}

// RemoveMember implements pb.AdminServiceServer.
func (s *adminService) RemoveMember(ctx context.Context, req *pb.RemoveMemberRequest) (*pb.RemoveMemberResponse, error) {
	if req.GetId() == "" {
		return nil, status.Error(codes.InvalidArgument, "id is empty")
	}
	if err := s.n.cluster.RemoveMember(ctx, req.GetId()); err != nil {
		err = s.n.onLeader(ctx, err, func(ctx context.Context, c pb.AdminServiceClient) error {
			_, err := c.RemoveMember(ctx, req)
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	s.n.log.Info("member removed", "member", req.GetId())
	return &pb.RemoveMemberResponse{}, nil
}

// DrainMember implements pb.AdminServiceServer.
func (s *adminService) DrainMember(ctx context.Context, req *pb.DrainMemberRequest) (*pb.DrainMemberResponse, error) {
	if req.GetId() == "" {
		return nil, status.Error(codes.InvalidArgument, "id is empty")
	}
	if err := s.n.cluster.DrainMember(ctx, req.GetId()); err != nil {
		err = s.n.onLeader(ctx, err, func(ctx context.Context, c pb.AdminServiceClient) error {
			_, err := c.DrainMember(ctx, req)
			return err
		})
		if err != nil {
			return nil, err
		}
	}
	return &pb.DrainMemberResponse{}, nil
}

// NodeStatus implements pb.AdminServiceServer: this node alone.
func (s *adminService) NodeStatus(context.Context, *pb.NodeStatusRequest) (*pb.NodeStatusResponse, error) {
	st, err := s.n.cluster.Status()
	if err != nil {
		return nil, toError(err)
	}
	t := s.n.cluster.Table()
	return &pb.NodeStatusResponse{
		Id: st.ID, Role: strings.ToLower(st.State), Term: st.Term, CommitIndex: st.CommitIndex, AppliedIndex: st.AppliedIndex,
		Leader: st.Leader, Epoch: st.Epoch, Ready: s.n.ready.Load(), LastIndex: st.LastIndex, Draining: st.Draining || s.n.draining.Load(),
		Version: buildinfo.Version(), RulesDigest: s.digestOf(t), Rules: uint64(t.Len()), Insecure: s.n.cfg.Security.Insecure,
	}, nil
}

// digestOf is digest(t.Rules()), computed once per table version.
func (s *adminService) digestOf(t *rule.Table) string {
	if c := s.digest.Load(); c != nil && c.table == t {
		return c.sum
	}
	c := &digestCache{table: t, sum: digest(t.Rules())}
	s.digest.Store(c)
	return c.sum
}

// digestCache is the digest of one table.
type digestCache struct {
	table *rule.Table
	sum   string
}

// digest is a short hash of a rule table, equal on replicas that agree.
func digest(rules []*rule.Rule) string {
	b, _ := json.Marshal(rules)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// ClusterStatus implements pb.AdminServiceServer: the membership as this
// node sees it, with each member's own NodeStatus (asked concurrently, 2 s
// at most each).
func (s *adminService) ClusterStatus(ctx context.Context, req *pb.ClusterStatusRequest) (*pb.ClusterStatusResponse, error) {
	// Health and autopilot state are the leader's: ask it when it is
	// another node, and answer from here when it cannot be reached.
	if id, addr := s.n.cluster.Leader(); id != "" && id != s.n.cluster.ID() && addr != "" && !forwarded(ctx) {
		if c, err := s.n.peers.conn(addr); err == nil {
			cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			resp, err := pb.NewAdminServiceClient(c).ClusterStatus(markForwarded(cctx), req)
			cancel()
			if err == nil {
				return resp, nil
			}
		}
	}
	st, err := s.n.cluster.Status()
	if err != nil {
		return nil, toError(err)
	}
	out := &pb.ClusterStatusResponse{Leader: st.Leader, Epoch: st.Epoch, AnsweredBy: st.ID, Members: make([]*pb.MemberStatus, len(st.Members))}
	var wg sync.WaitGroup
	for i, m := range st.Members {
		ms := &pb.MemberStatus{Id: m.ID, GrpcAddr: m.GRPCAddr, RaftAddr: m.RaftAddr, Voter: m.Voter, Live: m.Live, Role: "unreachable",
			Suffrage: m.Suffrage, Healthy: m.Healthy, Stabilization: m.Stabilization}
		if m.HealthFor > 0 {
			ms.HealthFor = durationpb.New(m.HealthFor)
		}
		out.Members[i] = ms
		if m.GRPCAddr == "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var ns *pb.NodeStatusResponse
			var err error
			if m.ID == st.ID {
				ns, err = s.NodeStatus(ctx, nil)
			} else if c, cerr := s.n.peers.conn(m.GRPCAddr); cerr == nil {
				cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				ns, err = pb.NewAdminServiceClient(c).NodeStatus(cctx, &pb.NodeStatusRequest{})
				cancel()
			} else {
				err = cerr
			}
			if err == nil {
				ms.Role, ms.AppliedIndex, ms.CommitIndex, ms.Term, ms.Ready = ns.GetRole(), ns.GetAppliedIndex(), ns.GetCommitIndex(), ns.GetTerm(), ns.GetReady()
			}
		}()
	}
	wg.Wait()
	return out, nil
}
