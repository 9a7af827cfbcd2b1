package server

import (
	"context"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
	"github.com/tokenserver/tokenserver/internal/shard"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// MaxBatch is the most items one AcquireTokens call may carry.
const MaxBatch = 1000

// tokenService is the data plane.
type tokenService struct {
	pb.UnimplementedTokenServiceServer
	n *Node
}

var _ pb.TokenServiceServer = (*tokenService)(nil)

// lookup validates the rule name and key and finds the rule.
func lookup(t *rule.Table, name, key string) (*rule.Compiled, error) {
	if err := rule.ValidName(name); err != nil {
		return nil, err
	}
	if err := rule.ValidKey(key); err != nil {
		return nil, err
	}
	c := t.Get(name)
	if c == nil {
		return nil, fmt.Errorf("rule %q: %w", name, rule.ErrNotFound)
	}
	return c, nil
}

// decide answers one acquire into resp, except its grant id, which the
// caller encodes from the returned grant.
func (n *Node) decide(t *rule.Table, req *pb.AcquireTokenRequest, resp *pb.AcquireTokenResponse) (shard.Grant, error) {
	c, err := lookup(t, req.GetRule(), req.GetKey())
	if err != nil {
		return shard.Grant{}, err
	}
	permits := int64(1)
	if req.Permits != nil {
		permits = *req.Permits
	}
	d, err := n.buckets.Acquire(c, req.GetKey(), bucket.Request{Permits: permits, Partial: req.GetPartial(), MaxWait: req.GetMaxWaitNs()}, n.now())
	if err != nil {
		return shard.Grant{}, err
	}
	resp.Allowed = d.Allowed
	resp.Granted = d.Granted
	resp.Remaining = d.Remaining
	resp.RetryAfterNs = d.RetryAfter
	resp.ResetAfterNs = d.ResetAfter
	resp.WaitBeforeNs = d.WaitBefore
	resp.RuleVersion = c.Rule.Version
	resp.Epoch = n.epoch()
	resp.Reason = pb.Reason(d.Reason)
	resp.ShadowDenied = d.ShadowDenied
	return d.Grant, nil
}

// AcquireToken implements pb.TokenServiceServer.
func (s *tokenService) AcquireToken(_ context.Context, req *pb.AcquireTokenRequest) (*pb.AcquireTokenResponse, error) {
	resp := new(pb.AcquireTokenResponse)
	g, err := s.n.decide(s.n.store.Table(), req, resp)
	if err != nil {
		return nil, toError(err)
	}
	resp.GrantId = g.String()
	return resp, nil
}

// AcquireTokens implements pb.TokenServiceServer. It decides the items in
// order on the calling goroutine with a fixed number of allocations per
// batch (the response structs and grant ids are carved from shared slices).
func (s *tokenService) AcquireTokens(_ context.Context, req *pb.AcquireTokensRequest) (*pb.AcquireTokensResponse, error) {
	items := req.GetRequests()
	if len(items) > MaxBatch {
		return nil, status.Errorf(codes.InvalidArgument, "requests has %d items, above the limit of %d per call", len(items), MaxBatch)
	}
	t := s.n.store.Table()
	results := make([]pb.AcquireTokensResult, len(items))
	resps := make([]pb.AcquireTokenResponse, len(items))
	out := &pb.AcquireTokensResponse{Results: make([]*pb.AcquireTokensResult, len(items))}
	ids := make([]byte, 0, len(items)*shard.GrantIDLen)
	ends := make([]int32, len(items)) // end of item i's id in ids; 0 for none
	for i, it := range items {
		out.Results[i] = &results[i]
		g, err := s.n.decide(t, it, &resps[i])
		if err != nil {
			results[i].Status = toStatus(err).Proto()
			continue
		}
		results[i].Response = &resps[i]
		if !g.IsZero() {
			ids = g.Append(ids)
			ends[i] = int32(len(ids))
		}
	}
	all := string(ids)
	for i, end := range ends {
		if end > 0 {
			resps[i].GrantId = all[int(end)-shard.GrantIDLen : end]
		}
	}
	return out, nil
}

// RefillToken implements pb.TokenServiceServer.
func (s *tokenService) RefillToken(_ context.Context, req *pb.RefillTokenRequest) (*pb.RefillTokenResponse, error) {
	c, err := lookup(s.n.store.Table(), req.GetRule(), req.GetKey())
	if err != nil {
		return nil, toError(err)
	}
	permits := int64(-1)
	if req.Permits != nil {
		if *req.Permits < 0 {
			return nil, status.Errorf(codes.InvalidArgument, "permits must be >= 0, got %d", *req.Permits)
		}
		permits = *req.Permits
	}
	if req.GetGrantId() == "" {
		return nil, status.Error(codes.InvalidArgument, "grant_id is empty")
	}
	refilled, remaining, err := s.n.buckets.Refill(c, req.GetKey(), req.GetGrantId(), permits, s.n.now())
	if err != nil {
		return nil, toError(err)
	}
	return &pb.RefillTokenResponse{Refilled: refilled, Remaining: remaining, RuleVersion: c.Rule.Version}, nil
}

// RenewLease implements pb.TokenServiceServer.
func (s *tokenService) RenewLease(_ context.Context, req *pb.RenewLeaseRequest) (*pb.RenewLeaseResponse, error) {
	c, err := lookup(s.n.store.Table(), req.GetRule(), req.GetKey())
	if err != nil {
		return nil, toError(err)
	}
	if req.GetGrantId() == "" {
		return nil, status.Error(codes.InvalidArgument, "grant_id is empty")
	}
	ok, err := s.n.buckets.Renew(c, req.GetKey(), req.GetGrantId(), s.n.now())
	if err != nil {
		return nil, toError(err)
	}
	resp := &pb.RenewLeaseResponse{Renewed: ok}
	if ok {
		resp.ExpiresAfterNs = c.ConfigFor(req.GetKey()).Period
	}
	return resp, nil
}

// GetClusterView implements pb.TokenServiceServer.
func (s *tokenService) GetClusterView(context.Context, *pb.GetClusterViewRequest) (*pb.ClusterView, error) {
	return s.n.view(s.n.store.Table()), nil
}

// WatchClusterView implements pb.TokenServiceServer: the current view, then
// a new one after every rule change, until the client goes away.
func (s *tokenService) WatchClusterView(_ *pb.GetClusterViewRequest, stream grpc.ServerStreamingServer[pb.ClusterView]) error {
	for {
		t := s.n.store.Table()
		if err := stream.Send(s.n.view(t)); err != nil {
			return err
		}
		select {
		case <-t.Changed():
		case <-stream.Context().Done():
			return nil
		case <-s.n.done:
			return status.Error(codes.Unavailable, "node is shutting down")
		}
	}
}

// view is the cluster view of a single node: itself, leading, epoch 1.
func (n *Node) view(t *rule.Table) *pb.ClusterView {
	v := &pb.ClusterView{
		Members: []*pb.Member{{Id: n.cfg.NodeID, GrpcAddr: n.advertiseGRPC(), Voter: true}},
		Leader:  n.cfg.NodeID,
		Epoch:   n.epoch(),
	}
	for _, r := range t.Rules() {
		v.Rules = append(v.Rules, clientRule(r))
	}
	return v
}
