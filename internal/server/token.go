package server

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/cluster"
	"github.com/tokenserver/tokenserver/internal/rule"
	"github.com/tokenserver/tokenserver/internal/rulepb"
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

// route returns the owner of key when it is another node and the call may
// be forwarded; nil when this node answers. A forwarded call is always
// answered where it lands.
func (n *Node) route(ctx context.Context, v *cluster.View, key string) (*cluster.Member, error) {
	if v.Len() == 0 {
		return nil, status.Error(codes.Unavailable, "this node has no routing view yet; retry")
	}
	owner, _ := v.Owner(key)
	if owner.ID == n.cluster.ID() || forwarded(ctx) { // the owner is checked first: it is free
		return nil, nil
	}
	return &owner, nil
}

// decide answers one acquire into resp, except its grant id, which the
// caller encodes from the returned grant.
func (n *Node) decide(t *rule.Table, epoch uint64, req *pb.AcquireTokenRequest, resp *pb.AcquireTokenResponse) (shard.Grant, error) {
	c, err := lookup(t, req.GetRule(), req.GetKey())
	if err != nil {
		return shard.Grant{}, err
	}
	permits := int64(1)
	if req.Permits != nil {
		permits = *req.Permits
	}
	var d shard.Decision
	if req.GetLease() {
		d, err = n.buckets.AcquireLease(c, req.GetKey(), permits, n.now())
	} else {
		d, err = n.buckets.Acquire(c, req.GetKey(), bucket.Request{Permits: permits, Partial: req.GetPartial(), MaxWait: req.GetMaxWaitNs()}, n.now())
	}
	if err != nil {
		return shard.Grant{}, err
	}
	switch {
	case d.ShadowDenied:
		c.Stats.ShadowDenied.Add(1)
	case d.Allowed:
		c.Stats.Allowed.Add(1)
	default:
		c.Stats.Denied.Add(1)
	}
	resp.Allowed = d.Allowed
	resp.Granted = d.Granted
	resp.Remaining = d.Remaining
	resp.RetryAfterNs = d.RetryAfter
	resp.ResetAfterNs = d.ResetAfter
	resp.WaitBeforeNs = d.WaitBefore
	resp.RuleVersion = c.Rule.Version
	resp.Epoch = epoch
	resp.Reason = pb.Reason(d.Reason)
	resp.ShadowDenied = d.ShadowDenied
	return d.Grant, nil
}

// AcquireToken implements pb.TokenServiceServer.
func (s *tokenService) AcquireToken(ctx context.Context, req *pb.AcquireTokenRequest) (*pb.AcquireTokenResponse, error) {
	v := s.n.cluster.View()
	owner, err := s.n.route(ctx, v, req.GetKey())
	if err != nil {
		return nil, err
	}
	if owner != nil {
		return toOwner(ctx, s.n, owner, func(ctx context.Context, c pb.TokenServiceClient) (*pb.AcquireTokenResponse, error) {
			return c.AcquireToken(ctx, req)
		})
	}
	resp := new(pb.AcquireTokenResponse)
	g, err := s.n.decide(s.n.cluster.Table(), v.Epoch, req, resp)
	if err != nil {
		return nil, toError(err)
	}
	resp.GrantId = g.String()
	return resp, nil
}

// AcquireTokens implements pb.TokenServiceServer. Items this node owns are
// decided in order on the calling goroutine, with a fixed number of
// allocations per batch (response structs and grant ids are carved from
// shared slices); items of other owners travel as one sub-batch per owner,
// sent concurrently.
func (s *tokenService) AcquireTokens(ctx context.Context, req *pb.AcquireTokensRequest) (*pb.AcquireTokensResponse, error) {
	items := req.GetRequests()
	if len(items) > MaxBatch {
		return nil, status.Errorf(codes.InvalidArgument, "requests has %d items, above the limit of %d per call", len(items), MaxBatch)
	}
	s.n.metrics.batch.Observe(float64(len(items)))
	v := s.n.cluster.View()
	if v.Len() == 0 {
		return nil, status.Error(codes.Unavailable, "this node has no routing view yet; retry")
	}
	t := s.n.cluster.Table()
	results := make([]pb.AcquireTokensResult, len(items))
	resps := make([]pb.AcquireTokenResponse, len(items))
	out := &pb.AcquireTokensResponse{Results: make([]*pb.AcquireTokensResult, len(items))}
	ids := make([]byte, 0, len(items)*shard.GrantIDLen)
	ends := make([]int32, len(items)) // end of item i's id in ids; 0 for none
	var remote map[string][]int       // owner id → item indexes
	fwd := forwarded(ctx)
	self := s.n.cluster.ID()
	for i, it := range items {
		out.Results[i] = &results[i]
		if !fwd {
			if owner, _ := v.Owner(it.GetKey()); owner.ID != self {
				if remote == nil {
					remote = map[string][]int{}
				}
				remote[owner.ID] = append(remote[owner.ID], i)
				continue
			}
		}
		g, err := s.n.decide(t, v.Epoch, it, &resps[i])
		if err != nil {
			st := toStatus(err)
			s.n.metrics.observeError(st.Code())
			results[i].Status = st.Proto()
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
	if remote != nil {
		s.n.forwardBatch(ctx, v, items, remote, out.Results)
	}
	return out, nil
}

// forwardBatch sends each owner its items as one AcquireTokens call and
// writes the answers (or the call's error, per item) into results.
func (n *Node) forwardBatch(ctx context.Context, v *cluster.View, items []*pb.AcquireTokenRequest, remote map[string][]int, results []*pb.AcquireTokensResult) {
	var wg sync.WaitGroup
	for id, idx := range remote {
		wg.Add(1)
		go func() {
			defer wg.Done()
			owner, _ := v.Member(id)
			sub := &pb.AcquireTokensRequest{Requests: make([]*pb.AcquireTokenRequest, len(idx))}
			for j, i := range idx {
				sub.Requests[j] = items[i]
			}
			resp, err := toOwner(ctx, n, &owner, func(ctx context.Context, c pb.TokenServiceClient) (*pb.AcquireTokensResponse, error) {
				return c.AcquireTokens(ctx, sub)
			})
			if err == nil && len(resp.GetResults()) != len(idx) {
				err = status.Errorf(codes.Internal, "owner %s answered %d items for %d", id, len(resp.GetResults()), len(idx))
			}
			for j, i := range idx {
				if err != nil {
					results[i].Status = status.Convert(err).Proto()
				} else {
					results[i].Status = resp.GetResults()[j].GetStatus()
					results[i].Response = resp.GetResults()[j].GetResponse()
				}
			}
		}()
	}
	wg.Wait()
}

// toOwner makes a data-plane call on the key's owner, marked forwarded and
// under the caller's deadline; a failure to reach it is Unavailable.
func toOwner[R any](ctx context.Context, n *Node, owner *cluster.Member, call func(context.Context, pb.TokenServiceClient) (R, error)) (R, error) {
	var zero R
	conn, err := n.peers.conn(owner.GRPCAddr)
	if err != nil {
		return zero, peerError("owner "+owner.ID, err)
	}
	n.metrics.forwarded.WithLabelValues(owner.ID).Inc()
	resp, err := call(markForwarded(ctx), pb.NewTokenServiceClient(conn))
	if err != nil {
		return zero, peerError("owner "+owner.ID, err)
	}
	return resp, nil
}

// owned resolves the rule and key of a refill or renew on this node, or
// returns the owner to forward to.
func (n *Node) owned(ctx context.Context, name, key string) (*rule.Compiled, *cluster.Member, error) {
	owner, err := n.route(ctx, n.cluster.View(), key)
	if err != nil || owner != nil {
		return nil, owner, err
	}
	c, err := lookup(n.cluster.Table(), name, key)
	return c, nil, err
}

// RefillToken implements pb.TokenServiceServer.
func (s *tokenService) RefillToken(ctx context.Context, req *pb.RefillTokenRequest) (*pb.RefillTokenResponse, error) {
	if req.Permits != nil && *req.Permits < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "permits must be >= 0, got %d", *req.Permits)
	}
	if req.GetGrantId() == "" {
		return nil, status.Error(codes.InvalidArgument, "grant_id is empty")
	}
	c, owner, err := s.n.owned(ctx, req.GetRule(), req.GetKey())
	if err != nil {
		return nil, toError(err)
	}
	if owner != nil {
		return toOwner(ctx, s.n, owner, func(ctx context.Context, c pb.TokenServiceClient) (*pb.RefillTokenResponse, error) {
			return c.RefillToken(ctx, req)
		})
	}
	permits := int64(-1)
	if req.Permits != nil {
		permits = *req.Permits
	}
	refilled, remaining, err := s.n.buckets.Refill(c, req.GetKey(), req.GetGrantId(), permits, s.n.now())
	if err != nil {
		return nil, toError(err)
	}
	return &pb.RefillTokenResponse{Refilled: refilled, Remaining: remaining, RuleVersion: c.Rule.Version}, nil
}

// RenewLease implements pb.TokenServiceServer.
func (s *tokenService) RenewLease(ctx context.Context, req *pb.RenewLeaseRequest) (*pb.RenewLeaseResponse, error) {
	if req.GetGrantId() == "" {
		return nil, status.Error(codes.InvalidArgument, "grant_id is empty")
	}
	c, owner, err := s.n.owned(ctx, req.GetRule(), req.GetKey())
	if err != nil {
		return nil, toError(err)
	}
	if owner != nil {
		return toOwner(ctx, s.n, owner, func(ctx context.Context, c pb.TokenServiceClient) (*pb.RenewLeaseResponse, error) {
			return c.RenewLease(ctx, req)
		})
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
	return s.n.clusterView(), nil
}

// WatchClusterView implements pb.TokenServiceServer: the current view, then
// a new one after every change of the members, the leader or the rules,
// until the client goes away.
func (s *tokenService) WatchClusterView(_ *pb.GetClusterViewRequest, stream grpc.ServerStreamingServer[pb.ClusterView]) error {
	var last *pb.ClusterView
	tick := time.NewTicker(time.Second) // leader changes have no signal of their own
	defer tick.Stop()
	for {
		t, viewChanged := s.n.cluster.Table(), s.n.cluster.ViewChanged()
		if v := s.n.clusterView(); !proto.Equal(v, last) {
			if err := stream.Send(v); err != nil {
				return err
			}
			last = v
		}
		select {
		case <-t.Changed():
		case <-viewChanged:
		case <-tick.C:
		case <-stream.Context().Done():
			return nil
		case <-s.n.done:
			return status.Error(codes.Unavailable, "node is shutting down")
		}
	}
}

// clusterView is what clients need to route and fall back.
func (n *Node) clusterView() *pb.ClusterView {
	v := n.cluster.View()
	leader, _ := n.cluster.Leader()
	out := &pb.ClusterView{Leader: leader, Epoch: v.Epoch}
	voters := map[string]bool{}
	if st, err := n.cluster.Status(); err == nil {
		for _, m := range st.Members {
			voters[m.ID] = m.Voter
		}
	}
	for _, m := range v.Members() {
		out.Members = append(out.Members, &pb.Member{Id: m.ID, GrpcAddr: m.GRPCAddr, RaftAddr: m.RaftAddr, Voter: voters[m.ID]})
	}
	for _, r := range n.cluster.Table().Rules() {
		out.Rules = append(out.Rules, rulepb.ClientRule(r))
	}
	return out
}
