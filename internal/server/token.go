package server

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
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

// Limits and timing of WatchClusterView.
const (
	// DefaultMaxViewStreams caps the WatchClusterView streams one node
	// serves at once; past it a new stream gets ResourceExhausted (the SDK
	// then watches another member). Each idle stream costs a goroutine and
	// one send per ViewHeartbeat.
	DefaultMaxViewStreams = 4096
	// ViewHeartbeat is the longest a WatchClusterView stream goes without a
	// message: the current view is sent again at least this often, so that
	// a client hearing nothing for twice as long knows the node froze.
	ViewHeartbeat = time.Second
)

// AvoidHeader is request metadata naming, comma-separated, the member ids
// the caller could not reach. A key whose owner is among them is served by
// its next owner in rendezvous order among the members not named, the owner
// the view will give it once the named ones leave: the SDK sets it while a
// node's circuit breaker is open.
const AvoidHeader = "x-tokenserver-avoid"

// NotReadyReason is the google.rpc.ErrorInfo reason of the Unavailable a
// node answers while it cannot decide yet (no routing view, or its Raft log
// not replayed): it was reached and decided nothing, so the call may be
// retried at once, here or on another member.
const NotReadyReason = "NOT_READY"

// tokenService is the data plane.
type tokenService struct {
	pb.UnimplementedTokenServiceServer
	n     *Node
	views viewCaster
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

// route returns the member that answers key when it is another node and
// the call may be forwarded; nil when this node answers. A forwarded call is
// always answered where it lands. A key whose owner the caller could not
// reach (AvoidHeader) goes to its next owner among the members not named.
func (n *Node) route(ctx context.Context, v *cluster.View, key string) (*cluster.Member, error) {
	if v.Len() == 0 {
		if n.sole() {
			return nil, nil
		}
		return nil, notReady("this node has no routing view yet; retry")
	}
	owner, _ := v.Owner(key)
	self := n.cluster.ID()
	if owner.ID == self || forwarded(ctx) { // the owner is checked first: it is free
		return nil, nil
	}
	if avoid := n.avoided(ctx, v); avoid[owner.ID] {
		next, ok := v.OwnerExcept(cluster.KeyHash(key), func(id string) bool { return avoid[id] && id != self })
		if !ok || next.ID == self {
			return nil, nil
		}
		return &next, nil
	}
	return &owner, nil
}

// sole reports whether this node may decide every key without a routing
// view: it is the only member of the Raft configuration, leads it and has
// applied everything committed. The view it is about to commit can only
// name itself, so a single fresh node decides from its first rule write on.
func (n *Node) sole() bool {
	st, err := n.cluster.Status()
	return err == nil && len(st.Members) == 1 && st.Members[0].ID == n.cluster.ID() &&
		st.State == "Leader" && st.AppliedIndex >= st.CommitIndex
}

// notReady is the Unavailable of a node that was reached and cannot decide
// yet, marked with NotReadyReason.
func notReady(msg string) error {
	st := status.New(codes.Unavailable, msg)
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: NotReadyReason, Domain: "tokenserver.v1"}); err == nil {
		return d.Err()
	}
	return st.Err()
}

// avoided returns the member ids of the caller's AvoidHeader that this
// node honors (see avoidable), nil if none.
func (n *Node) avoided(ctx context.Context, v *cluster.View) map[string]bool {
	vals := metadata.ValueFromIncomingContext(ctx, AvoidHeader)
	if len(vals) == 0 {
		return nil
	}
	var out map[string]bool
	for _, val := range vals {
		for _, id := range strings.Split(val, ",") {
			if id = strings.TrimSpace(id); id == "" || len(out) >= 64 || id == n.cluster.ID() {
				continue
			}
			m, inView := v.Member(id)
			if !inView || n.avoidable(m) {
				if out == nil {
					out = map[string]bool{}
				}
				out[id] = true
			}
		}
	}
	return out
}

// avoidable reports whether this node believes a caller that says member m
// cannot be reached: m's last health check from here failed, or none has
// answered yet. A claim about m with no check in the last
// peerCheckInterval starts one in the background. So a caller that names a
// healthy member to get a second bucket for its keys gains at most the
// calls before the check answers; a frozen, dead or not-ready member is
// avoided from the first call.
func (n *Node) avoidable(m cluster.Member) bool {
	ph := peerHealthOf(n)
	ph.mu.Lock()
	defer ph.mu.Unlock()
	st := ph.m[m.ID]
	if st == nil {
		st = &peerState{}
		ph.m[m.ID] = st
	}
	if !st.checking && time.Since(st.checked) > peerCheckInterval {
		st.checking = true
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), peerCheckTimeout)
			ok := n.peers.Health(ctx, m.GRPCAddr)
			cancel()
			ph.mu.Lock()
			st.healthy, st.checked, st.checking = ok, time.Now(), false
			ph.mu.Unlock()
		}()
	}
	return !st.healthy
}

// How often, and how long, a node checks a member that callers avoid.
const (
	peerCheckInterval = time.Second
	peerCheckTimeout  = 300 * time.Millisecond
)

// peerHealth is what a node learned of the members callers avoid.
type peerHealth struct {
	mu sync.Mutex
	m  map[string]*peerState // by member id
}

type peerState struct {
	healthy  bool // the last check answered SERVING
	checked  time.Time
	checking bool
}

var peerHealths sync.Map // *Node → *peerHealth, until the node stops

func peerHealthOf(n *Node) *peerHealth {
	if ph, ok := peerHealths.Load(n); ok {
		return ph.(*peerHealth)
	}
	ph, loaded := peerHealths.LoadOrStore(n, &peerHealth{m: map[string]*peerState{}})
	if !loaded {
		go func() { <-n.done; peerHealths.Delete(n) }()
	}
	return ph.(*peerHealth)
}

// nextOwner is the member that answers key when owner cannot be reached:
// the next in rendezvous order among the members that are neither owner
// nor avoided by the caller. ok is false when there is none.
func (n *Node) nextOwner(ctx context.Context, v *cluster.View, key, owner string) (next cluster.Member, local, ok bool) {
	avoid := n.avoided(ctx, v)
	self := n.cluster.ID()
	next, ok = v.OwnerExcept(cluster.KeyHash(key), func(id string) bool { return id != self && (id == owner || avoid[id]) })
	if ok {
		n.metrics.failovers.Inc()
	}
	return next, ok && next.ID == self, ok
}

// unreachable reports whether a forwarded call's error says the owner
// could not decide it (down, unreachable or not ready), so that its next
// owner should.
func unreachable(err error) bool {
	return status.Code(err) == codes.Unavailable
}

// lookupReady is lookup that answers NotReadyReason instead of NotFound
// while the node has not replayed its Raft log: the rule may exist.
func (n *Node) lookupReady(t *rule.Table, name, key string) (*rule.Compiled, error) {
	c, err := lookup(t, name, key)
	if err != nil && errors.Is(err, rule.ErrNotFound) && !n.cluster.Ready() {
		return nil, notReady(fmt.Sprintf("rule %q is not in this node's table yet (the node is replaying its Raft log); retry", name))
	}
	return c, err
}

// decide answers one acquire into resp, except its grant id, which the
// caller encodes from the returned grant.
func (n *Node) decide(t *rule.Table, epoch uint64, req *pb.AcquireTokenRequest, resp *pb.AcquireTokenResponse) (shard.Grant, error) {
	c, err := n.lookupReady(t, req.GetRule(), req.GetKey())
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
		acquire := func(ctx context.Context, c pb.TokenServiceClient) (*pb.AcquireTokenResponse, error) {
			return c.AcquireToken(ctx, req)
		}
		resp, err := toOwner(ctx, s.n, owner, acquire)
		if err == nil || !unreachable(err) {
			return resp, err
		}
		// The owner cannot decide: its next owner does, from its own bucket.
		next, local, ok := s.n.nextOwner(ctx, v, req.GetKey(), owner.ID)
		if !ok {
			return nil, err
		}
		if !local {
			return toOwner(ctx, s.n, &next, acquire)
		}
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
	fwd := forwarded(ctx)
	if v.Len() == 0 {
		if !s.n.sole() {
			return nil, notReady("this node has no routing view yet; retry")
		}
		fwd = true // every key is this node's
	}
	t := s.n.cluster.Table()
	results := make([]pb.AcquireTokensResult, len(items))
	resps := make([]pb.AcquireTokenResponse, len(items))
	out := &pb.AcquireTokensResponse{Results: make([]*pb.AcquireTokensResult, len(items))}
	ids := make([]byte, 0, len(items)*shard.GrantIDLen)
	ends := make([]int32, len(items)) // end of item i's id in ids; 0 for none
	var remote map[string][]int       // owner id → item indexes
	self := s.n.cluster.ID()
	var avoid map[string]bool
	if !fwd {
		avoid = s.n.avoided(ctx, v)
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
// writes the answers (or the call's error, per item) into results. Items of
// an owner that cannot decide go to their next owners, once.
func (n *Node) forwardBatch(ctx context.Context, v *cluster.View, items []*pb.AcquireTokenRequest, remote map[string][]int, results []*pb.AcquireTokensResult) {
	n.forwardBatchOnce(ctx, v, items, remote, results, true)
}

func (n *Node) forwardBatchOnce(ctx context.Context, v *cluster.View, items []*pb.AcquireTokenRequest, remote map[string][]int, results []*pb.AcquireTokensResult, failover bool) {
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
			if err != nil && failover && unreachable(err) && n.failoverBatch(ctx, v, items, id, idx, results) {
				return
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

// failoverBatch answers the items idx of an owner that cannot decide them
// by their next owners: this node decides its own, the others are forwarded
// (and served where they land). False when the items have no next owner.
func (n *Node) failoverBatch(ctx context.Context, v *cluster.View, items []*pb.AcquireTokenRequest, owner string, idx []int, results []*pb.AcquireTokensResult) bool {
	var remote map[string][]int
	t := n.cluster.Table()
	for _, i := range idx {
		next, local, ok := n.nextOwner(ctx, v, items[i].GetKey(), owner)
		if !ok {
			return false
		}
		if !local {
			if remote == nil {
				remote = map[string][]int{}
			}
			remote[next.ID] = append(remote[next.ID], i)
			continue
		}
		resp := new(pb.AcquireTokenResponse)
		g, err := n.decide(t, v.Epoch, items[i], resp)
		if err != nil {
			st := toStatus(err)
			n.metrics.observeError(st.Code())
			results[i].Status = st.Proto()
			continue
		}
		resp.GrantId = g.String()
		results[i].Response = resp
	}
	if remote != nil {
		n.forwardBatchOnce(ctx, v, items, remote, results, false)
	}
	return true
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
// returns the member to forward to.
func (n *Node) owned(ctx context.Context, name, key string) (*rule.Compiled, *cluster.Member, error) {
	owner, err := n.route(ctx, n.cluster.View(), key)
	if err != nil || owner != nil {
		return nil, owner, err
	}
	c, err := n.lookupReady(n.cluster.Table(), name, key)
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
// a new one after every change of the members, the leader, the rules or
// the node's readiness, and the same one again at least every
// ViewHeartbeat, until the client goes away. Every stream of the node sends
// the same view message, built once per change; at most
// DefaultMaxViewStreams streams at once.
func (s *tokenService) WatchClusterView(_ *pb.GetClusterViewRequest, stream grpc.ServerStreamingServer[pb.ClusterView]) error {
	vc := &s.views
	if vc.streams.Add(1) > int64(s.maxViewStreams()) {
		vc.streams.Add(-1)
		return status.Errorf(codes.ResourceExhausted, "this node serves %d WatchClusterView streams already (its cap); watch another member or poll GetClusterView", s.maxViewStreams())
	}
	defer vc.streams.Add(-1)
	vc.once.Do(func() {
		vc.cur.Store(s.n.publication())
		go s.cast()
	})
	p := vc.cur.Load()
	for {
		if err := stream.SendMsg(p.enc); err != nil {
			return err
		}
		select {
		case <-p.next:
			p = vc.cur.Load()
		case <-stream.Context().Done():
			return nil
		case <-s.n.done:
			return status.Error(codes.Unavailable, "node is shutting down")
		}
	}
}

// maxViewStreams is the node's cap on WatchClusterView streams: its
// Config.MaxViewStreams, else maxViewStreams.
func (s *tokenService) maxViewStreams() int {
	if m := s.n.cfg.MaxViewStreams; m > 0 {
		return m
	}
	return maxViewStreams
}

// maxViewStreams is DefaultMaxViewStreams; tests lower it.
var maxViewStreams = DefaultMaxViewStreams

// viewCaster publishes the view that every WatchClusterView stream of a
// service sends: one goroutine builds it once per change and publishes it
// again every ViewHeartbeat.
type viewCaster struct {
	once    sync.Once
	streams atomic.Int64
	cur     atomic.Pointer[viewPub]
}

// viewPub is one publication: a view nobody modifies, the table and the
// view-change signal it was built after, and a channel closed when the
// next publication replaces it.
type viewPub struct {
	view        *pb.ClusterView
	enc         *encodedView // view, encoded once for every stream
	table       *rule.Table
	viewChanged <-chan struct{}
	next        chan struct{}
}

// publication builds a publication of the current view.
func (n *Node) publication() *viewPub {
	t, vch := n.cluster.Table(), n.cluster.ViewChanged() // before the state they signal changes of
	v := n.clusterView()
	return &viewPub{view: v, enc: encodeView(v), table: t, viewChanged: vch, next: make(chan struct{})}
}

// encodedView is a view message with its wire encoding, made once per
// publication: the node's codec (utf8Codec) sends the bytes as they are on
// every stream instead of marshaling the view once per stream; any other
// codec marshals the embedded view (it is a proto.Message through it).
type encodedView struct {
	*pb.ClusterView
	wire []byte
}

// encodeView encodes v once (nil wire if it cannot: the codec then
// marshals the view itself).
func encodeView(v *pb.ClusterView) *encodedView {
	b, err := proto.Marshal(v)
	if err != nil {
		b = nil
	}
	return &encodedView{ClusterView: v, wire: b}
}

// cast runs the viewCaster until the node stops.
func (s *tokenService) cast() {
	n, vc := s.n, &s.views
	tick := time.NewTicker(ViewHeartbeat)
	defer tick.Stop()
	for {
		p := vc.cur.Load()
		rebuild := false
		select {
		case <-p.table.Changed():
			rebuild = true
		case <-p.viewChanged:
			rebuild = true
		case <-tick.C:
			// Leader and readiness changes have no signal of their own.
			leader, _ := n.cluster.Leader()
			rebuild = leader != p.view.GetLeader() || n.cluster.Ready() != p.view.GetReady()
		case <-n.done:
			return
		}
		next := &viewPub{view: p.view, enc: p.enc, table: p.table, viewChanged: p.viewChanged, next: make(chan struct{})}
		if rebuild {
			next = n.publication()
			tick.Reset(ViewHeartbeat)
		}
		vc.cur.Store(next)
		close(p.next)
	}
}

// clusterView is what clients need to route and fall back: the routing
// view, the leader, each rule's client-facing fields, and whether this node
// is ready (a view from a node that is not ready may lack rules and
// members; clients do not forget anything because of it).
func (n *Node) clusterView() *pb.ClusterView {
	ready := n.cluster.Ready() // before reading the state it vouches for
	v := n.cluster.View()
	leader, _ := n.cluster.Leader()
	out := &pb.ClusterView{Leader: leader, Epoch: v.Epoch, Ready: ready, AnsweredBy: n.cluster.ID()}
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
