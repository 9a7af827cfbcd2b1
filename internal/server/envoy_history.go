package server

import (
	"context"
	"fmt"

	"github.com/tokenserver/tokenserver/internal/raftfsm"
	"github.com/tokenserver/tokenserver/internal/rule"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// envoyHistoryStore is an envoyStore that keeps the domains' history
// (raftfsm.Node does).
type envoyHistoryStore interface {
	EnvoyDomainHistory(name string) []raftfsm.EnvoyDomainVersion
}

// EnvoyDomainHistory implements pb.AdminServiceServer: from the leader's
// copy unless local is set, like RuleHistory.
func (s *adminService) EnvoyDomainHistory(ctx context.Context, req *pb.EnvoyDomainHistoryRequest) (*pb.EnvoyDomainHistoryResponse, error) {
	if req.GetDomain() == "" {
		return nil, toError(failf(ErrBadRequest, "domain: must not be empty"))
	}
	if id, addr, ok := s.n.leaderElsewhere(); ok && !req.GetLocal() && !forwarded(ctx) {
		var resp *pb.EnvoyDomainHistoryResponse
		err := s.n.atLeader(ctx, id, addr, func(ctx context.Context, c pb.AdminServiceClient) (err error) {
			resp, err = c.EnvoyDomainHistory(ctx, req)
			return err
		})
		return resp, err
	}
	st, err := s.envoyStore()
	if err != nil {
		return nil, toError(err)
	}
	hs, ok := st.(envoyHistoryStore)
	if !ok {
		return nil, toError(failf(ErrNoRaft, "this node keeps no Envoy domain history"))
	}
	vs := hs.EnvoyDomainHistory(req.GetDomain())
	if len(vs) == 0 {
		return nil, toError(fmt.Errorf("envoy domain %q has no history: %w", req.GetDomain(), rule.ErrNotFound))
	}
	out := &pb.EnvoyDomainHistoryResponse{Versions: make([]*pb.EnvoyDomainVersion, len(vs))}
	for i, v := range vs {
		pv := &pb.EnvoyDomainVersion{Version: v.Version, Principal: v.Principal, Change: v.Change}
		if !v.Time.IsZero() {
			pv.TimeUnixNs = v.Time.UnixNano()
		}
		if v.Domain != nil {
			pv.Domain = envoyDomainPB(*v.Domain)
		}
		out.Versions[i] = pv
	}
	return out, nil
}
