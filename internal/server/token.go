package server

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/cluster"
	"github.com/tokenserver/tokenserver/internal/rule"
	"github.com/tokenserver/tokenserver/internal/shard"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// MaxBatch is the most items one AcquireTokens call may carry.
const MaxBatch = pb.MaxBatch

// tokenService is the data plane: acquire, refill and renew here, the
// cluster view in view.go.
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

// lookupReady is lookup that answers ErrNotReady instead of NotFound
// while the node has not replayed its Raft log: the rule may exist. A
// ready node that does not know the rule asks the leader before it
// answers NotFound (see confirmRule): a rule written a moment ago may
// not have reached this node's table yet.
func (n *Node) lookupReady(ctx context.Context, t *rule.Table, name, key string) (*rule.Compiled, error) {
	c, err := lookup(t, name, key)
	if err != nil && errors.Is(err, rule.ErrNotFound) {
		if !n.data.Ready() {
			return nil, failf(ErrNotReady, "rule %q is not in this node's table yet (the node is replaying its Raft log); retry", name)
		}
		if c2 := n.confirmRule(ctx, name); c2 != nil {
			return c2, nil
		}
	}
	return c, err
}

// decide answers one acquire into resp, except its grant id, which the
// caller encodes from the returned grant; a decision another node made
// (handoff.go) comes with its grant id in resp and a zero grant.
func (n *Node) decide(ctx context.Context, t *rule.Table, epoch uint64, req *pb.AcquireTokenRequest, resp *pb.AcquireTokenResponse) (shard.Grant, error) {
	c, err := n.lookupReady(ctx, t, req.GetRule(), req.GetKey())
	if err != nil {
		return shard.Grant{}, err
	}
	permits := int64(1)
	if req.Permits != nil {
		permits = *req.Permits
	}
	if req.GetLimit() != nil && req.GetLease() {
		return shard.Grant{}, rule.Invalid("limit: a lease takes the rule's limit; send limit without lease")
	}
	// A key whose state is in flight is decided by its old owner, or
	// waits for the state within the caller's time (handoff.go).
	if done, err := n.handoffDecide(ctx, c, epoch, req, resp); done || err != nil {
		return shard.Grant{}, err
	}
	var d shard.Decision
	n.installReplica(c, req.GetKey()) // durable rules: continue from a copy (replica.go)
	if l := req.GetLimit(); l != nil {
		d, err = n.buckets.AcquireInline(c, req.GetKey(), inlineLimit(l), bucket.Request{Permits: permits, Partial: req.GetPartial(), MaxWait: req.GetMaxWaitNs()}, n.now())
	} else if req.GetLease() {
		d, err = n.buckets.AcquireLease(c, req.GetKey(), permits, n.now())
	} else {
		d, err = n.buckets.Acquire(c, req.GetKey(), bucket.Request{Permits: permits, Partial: req.GetPartial(), MaxWait: req.GetMaxWaitNs()}, n.now())
	}
	if errors.Is(err, shard.ErrMoved) {
		// This node handed the bucket over: its new owner decides.
		return shard.Grant{}, n.decideMoved(ctx, t, epoch, req, resp)
	}
	if err != nil {
		return shard.Grant{}, err
	}
	n.recordDecision(c, req.GetKey(), permits, &d)
	n.replica.Touch(c, req.GetKey(), d.Granted) // durable rules only (replica.go)
	resp.Allowed = d.Allowed
	resp.Granted = d.Granted
	resp.Remaining = d.Remaining
	resp.RetryAfterNs = d.RetryAfter
	resp.ResetAfterNs = d.ResetAfter
	resp.WaitBeforeNs = d.WaitBefore
	resp.RuleVersion = c.Rule.Version
	resp.Epoch = epoch
	// Reason says why a decision went as it did; an algorithm's plain
	// allow has none (LIMIT is for what the limit denied, or a shadow rule
	// would have).
	if !d.Allowed || d.ShadowDenied || d.Reason != shard.ReasonLimit {
		resp.Reason = pb.Reason(d.Reason)
	}
	resp.ShadowDenied = d.ShadowDenied
	return d.Grant, nil
}

// inlineLimit is the rule form of a request's limit.
func inlineLimit(l *pb.InlineLimit) rule.InlineLimit {
	alg := bucket.Algorithm(l.GetAlgorithm())
	if l.GetAlgorithm() < 0 || l.GetAlgorithm() > pb.Algorithm(bucket.Concurrency) {
		alg = bucket.Algorithm(255) // unknown: differs from every rule's
	}
	return rule.InlineLimit{Algorithm: alg, Limit: l.GetLimit(), Period: time.Duration(l.GetPeriodNs()), Burst: l.GetBurst()}
}

// AcquireToken implements pb.TokenServiceServer.
func (s *tokenService) AcquireToken(ctx context.Context, req *pb.AcquireTokenRequest) (*pb.AcquireTokenResponse, error) {
	v := s.n.data.View()
	owner, err := s.n.route(ctx, v, req.GetKey())
	if err != nil {
		return nil, toError(err)
	}
	if owner != nil {
		acquire := func(ctx context.Context, c pb.TokenServiceClient) (*pb.AcquireTokenResponse, error) {
			return c.AcquireToken(ctx, req)
		}
		ctx = routedBy(ctx, v.Epoch)
		resp, err := tryOwner(ctx, s.n, owner, acquire)
		if err == nil || !unreachable(err) {
			return resp, err
		}
		// The owner cannot decide: its next owner does, from its own bucket.
		next, local, ok := s.n.nextOwner(ctx, v, req.GetKey(), owner.ID, err)
		if !ok {
			return nil, toError(err)
		}
		if !local {
			return toOwner(avoiding(ctx, owner.ID), s.n, &next, acquire)
		}
		ctx = asNextOwner(ctx)
	}
	resp := new(pb.AcquireTokenResponse)
	g, err := s.n.decide(ctx, s.n.data.Table(), v.Epoch, req, resp)
	if err != nil {
		return nil, toError(err)
	}
	if !g.IsZero() { // else another node decided, and set it
		resp.GrantId = g.String()
	}
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
		return nil, toError(failf(ErrBadRequest, "requests has %d items, above the limit of %d per call", len(items), MaxBatch))
	}
	aon := req.GetAllOrNothing()
	if aon {
		if err := checkAllOrNothing(items); err != nil {
			return nil, toError(err)
		}
	}
	s.n.metrics.batch.Observe(float64(len(items)))
	v := s.n.data.View()
	fwd := forwarded(ctx)
	if !fwd && !s.n.data.CaughtUp() && !s.n.sole() {
		return nil, toError(notCaughtUp())
	}
	if v.Len() == 0 {
		if !s.n.sole() {
			return nil, toError(failf(ErrNotReady, "this node has no routing view yet; retry"))
		}
		fwd = true // every key is this node's
	}
	t := s.n.data.Table()
	results := make([]pb.AcquireTokensResult, len(items))
	resps := make([]pb.AcquireTokenResponse, len(items))
	out := &pb.AcquireTokensResponse{Results: make([]*pb.AcquireTokensResult, len(items))}
	ids := make([]byte, 0, len(items)*shard.GrantIDLen)
	ends := make([]int32, len(items)) // end of item i's id in ids; 0 for none
	var remote map[string][]int       // owner id → item indexes
	self := s.n.data.ID()
	var avoid map[string]bool
	if !fwd {
		avoid = s.n.avoided(ctx, v)
	}
	var local []bool // all_or_nothing: the items decided here
	if aon {
		local = make([]bool, len(items))
	}
	for i, it := range items {
		out.Results[i] = &results[i]
		if !fwd {
			owner, _ := v.Owner(it.GetKey())
			if avoid[owner.ID] {
				owner, _ = v.OwnerExcept(cluster.KeyHash(it.GetKey()), func(id string) bool { return avoid[id] && id != self })
			}
			if owner.ID != self {
				if remote == nil {
					remote = map[string][]int{}
				}
				remote[owner.ID] = append(remote[owner.ID], i)
				continue
			}
		}
		g, err := s.n.decide(ctx, t, v.Epoch, it, &resps[i])
		if local != nil {
			// Decided here only when this node sealed the grant: one
			// another node made while the key moves (handoff.go) is
			// given back through RefillToken's routing.
			local[i] = !g.IsZero()
		}
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
	if aon {
		s.settleAllOrNothing(ctx, items, out, local)
	}
	return out, nil
}

// owned resolves the rule and key of a refill or renew on this node, or
// returns the member to forward to.
func (n *Node) owned(ctx context.Context, name, key string) (*rule.Compiled, *cluster.Member, error) {
	owner, err := n.route(ctx, n.data.View(), key)
	if err != nil || owner != nil {
		return nil, owner, err
	}
	c, err := n.lookupReady(ctx, n.data.Table(), name, key)
	return c, nil, err
}

// RefillToken implements pb.TokenServiceServer.
func (s *tokenService) RefillToken(ctx context.Context, req *pb.RefillTokenRequest) (*pb.RefillTokenResponse, error) {
	if req.Permits != nil && *req.Permits < 0 {
		return nil, toError(failf(ErrBadRequest, "permits must be >= 0, got %d", *req.Permits))
	}
	if req.GetGrantId() == "" {
		return nil, toError(failf(ErrBadRequest, "grant_id is empty"))
	}
	c, owner, err := s.n.owned(ctx, req.GetRule(), req.GetKey())
	if err != nil {
		return nil, toError(err)
	}
	remote := func(ctx context.Context, c pb.TokenServiceClient) (*pb.RefillTokenResponse, error) {
		return c.RefillToken(ctx, req)
	}
	if owner != nil {
		return toOwner(ctx, s.n, owner, remote)
	}
	permits := int64(-1)
	if req.Permits != nil {
		permits = *req.Permits
	}
	// Where the key's bucket is while it moves (commit.go).
	resp, err := settle(ctx, s.n, c, req.GetKey(), func() (*pb.RefillTokenResponse, error) {
		s.n.installReplica(c, req.GetKey()) // durable rules (replica.go)
		refilled, remaining, err := s.n.buckets.Refill(c, req.GetKey(), req.GetGrantId(), permits, s.n.now())
		s.n.replica.Touch(c, req.GetKey(), 0)
		if err != nil {
			return nil, err
		}
		return &pb.RefillTokenResponse{Refilled: refilled, Remaining: remaining, RuleVersion: c.Rule.Version}, nil
	}, remote)
	if err != nil {
		return nil, toError(err)
	}
	return resp, nil
}

// RenewLease implements pb.TokenServiceServer.
func (s *tokenService) RenewLease(ctx context.Context, req *pb.RenewLeaseRequest) (*pb.RenewLeaseResponse, error) {
	if req.GetGrantId() == "" {
		return nil, toError(failf(ErrBadRequest, "grant_id is empty"))
	}
	c, owner, err := s.n.owned(ctx, req.GetRule(), req.GetKey())
	if err != nil {
		return nil, toError(err)
	}
	remote := func(ctx context.Context, c pb.TokenServiceClient) (*pb.RenewLeaseResponse, error) {
		return c.RenewLease(ctx, req)
	}
	if owner != nil {
		return toOwner(ctx, s.n, owner, remote)
	}
	// Where the key's bucket is while it moves (commit.go).
	resp, err := settle(ctx, s.n, c, req.GetKey(), func() (*pb.RenewLeaseResponse, error) {
		s.n.installReplica(c, req.GetKey()) // durable rules (replica.go)
		ok, err := s.n.buckets.Renew(c, req.GetKey(), req.GetGrantId(), s.n.now())
		s.n.replica.Touch(c, req.GetKey(), 0)
		if err != nil {
			return nil, err
		}
		resp := &pb.RenewLeaseResponse{Renewed: ok}
		if ok {
			resp.ExpiresAfterNs = c.ConfigFor(req.GetKey()).Period
		}
		return resp, nil
	}, remote)
	if err != nil {
		return nil, toError(err)
	}
	return resp, nil
}
