package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokenserver/tokenserver/internal/auth"
	"github.com/tokenserver/tokenserver/internal/buildinfo"
	"github.com/tokenserver/tokenserver/internal/rule"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// JoinCluster implements pb.AdminServiceServer.
func (s *adminService) JoinCluster(ctx context.Context, req *pb.JoinClusterRequest) (*pb.JoinClusterResponse, error) {
	if req.GetId() == "" || req.GetRaftAddr() == "" || req.GetGrpcAddr() == "" {
		return nil, toError(failf(ErrBadRequest, "join needs id, raft_addr and grpc_addr"))
	}
	for _, f := range []struct{ name, addr string }{{"raft_addr", req.GetRaftAddr()}, {"grpc_addr", req.GetGrpcAddr()}} {
		if err := checkHostPort(f.addr); err != nil {
			return nil, toError(failf(ErrBadRequest, "%s %q is not host:port: %v", f.name, f.addr, err))
		}
	}
	// A node joining itself must be the node its certificate names (a
	// member's forwarded join was checked where it arrived; a node not yet
	// a member is checked whatever the marker says; an admin's join, or a
	// peer CA without node ids, is checked by the join probe: the Raft
	// address must answer as that id).
	if err := auth.CheckJoin(ctx, req.GetId(), forwarded(ctx)); err != nil {
		return nil, toError(failf(ErrWrongNode, "%s", status.Convert(err).Message()))
	}
	if err := s.n.control.AddMember(ctx, req.GetId(), req.GetRaftAddr(), req.GetGrpcAddr()); err != nil {
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
		return nil, toError(failf(ErrBadRequest, "id is empty"))
	}
	if err := memberError(req.GetId(), s.n.control.RemoveMember(ctx, req.GetId())); err != nil {
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
		return nil, toError(failf(ErrBadRequest, "id is empty"))
	}
	if err := memberError(req.GetId(), s.n.control.DrainMember(ctx, req.GetId())); err != nil {
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
	st, err := s.n.control.Status()
	if err != nil {
		return nil, toError(err)
	}
	t := s.n.data.Table()
	return &pb.NodeStatusResponse{
		Id: st.ID, Role: strings.ToLower(st.State), Term: st.Term, CommitIndex: st.CommitIndex, AppliedIndex: st.AppliedIndex,
		Leader: st.Leader, Epoch: st.Epoch, Ready: s.n.ready.Load(), LastIndex: st.LastIndex, Draining: st.Draining || s.n.draining.Load(),
		Version: buildinfo.Version(), RulesDigest: s.digestOf(t), Rules: uint64(t.Len()), Insecure: s.n.insecure(),
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
	if id, addr := s.n.data.Leader(); id != "" && id != s.n.data.ID() && addr != "" && !forwarded(ctx) {
		if c, err := s.n.peers.connTo(id, addr); err == nil {
			cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			resp, err := pb.NewAdminServiceClient(c).ClusterStatus(markForwarded(cctx), req)
			cancel()
			if err == nil {
				return resp, nil
			}
		}
	}
	st, err := s.n.control.Status()
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
			} else if c, cerr := s.n.peers.connTo(m.ID, m.GRPCAddr); cerr == nil {
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

// checkHostPort reports why addr is not a dialable host:port, nil if it
// is one.
func checkHostPort(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if host == "" {
		return errors.New("the host is empty")
	}
	if p, err := strconv.Atoi(port); err != nil || p <= 0 || p > 65535 {
		return fmt.Errorf("port %q is not a number from 1 to 65535", port)
	}
	return nil
}
