package server

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	"github.com/tokenserver/tokenserver/internal/cluster"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// ForwardedHeader marks a request forwarded by another node: it is served
// where it lands (never forwarded again), but for a key the node landed
// on holds no bucket of and, by a newer view than the one the call was
// routed by, does not own (strayOwner). Its value is the epoch of that
// routing view ("1" from a node that does not say).
const ForwardedHeader = pb.ForwardedHeader

// AvoidHeader is request metadata naming, comma-separated, the member ids
// the caller could not reach. A key whose owner is among them is served by
// its next owner in rendezvous order among the members not named, the owner
// the view will give it once the named ones leave: the SDK sets it while a
// node's circuit breaker is open.
const AvoidHeader = pb.AvoidHeader

// NotReadyReason is the google.rpc.ErrorInfo reason of the Unavailable a
// node answers while it cannot decide yet (no routing view, or its Raft log
// not replayed): it was reached and decided nothing, so the call may be
// retried at once, here or on another member.
const NotReadyReason = pb.NotReadyReason

// forwarded reports whether the call came from another node.
func forwarded(ctx context.Context) bool {
	// ValueFromIncomingContext reads one header without copying the whole
	// metadata map (FromIncomingContext's copy cost ~5% of a call's CPU).
	return len(metadata.ValueFromIncomingContext(ctx, ForwardedHeader)) > 0
}

// forwardedEpoch is the epoch of the view by which the node that
// forwarded the call routed it (the value of its ForwardedHeader; 1 from
// a node that does not say, 0 for a call not forwarded). It reads the
// metadata once: a decision asks it, not forwarded, once.
func forwardedEpoch(ctx context.Context) uint64 {
	vals := metadata.ValueFromIncomingContext(ctx, ForwardedHeader)
	if len(vals) == 0 {
		return 0
	}
	e := uint64(1)
	for _, v := range vals {
		if u, err := strconv.ParseUint(v, 10, 64); err == nil {
			e = max(e, u)
		}
	}
	return e
}

// routedKey is the context key of the epoch of the view a call was routed
// by (routedBy).
type routedKey struct{}

// routedBy returns ctx for forwarding calls routed by the view of epoch:
// the node they land on compares it with its own view (strayOwner).
func routedBy(ctx context.Context, epoch uint64) context.Context {
	return context.WithValue(ctx, routedKey{}, epoch)
}

// routingEpoch is the epoch a call forwarded under ctx was routed by
// (routedBy), this node's current view's if ctx does not say.
func (n *Node) routingEpoch(ctx context.Context) uint64 {
	if e, ok := ctx.Value(routedKey{}).(uint64); ok {
		return e
	}
	return n.data.View().Epoch
}

// markForwarded returns ctx (with its deadline) for a call to another node.
// The call names, in its AvoidHeader, the members its caller could not
// reach (the incoming AvoidHeader, up to MaxAvoid ids) and those this node
// could not (avoiding): the node it lands on then decides a key of such a
// member only if it, too, finds that member down (see route).
func markForwarded(ctx context.Context) context.Context {
	return markForwardedAt(ctx, 1)
}

// markForwardedAt is markForwarded for a data-plane call routed by the
// view of epoch, which its ForwardedHeader carries (forwardedEpoch).
func markForwardedAt(ctx context.Context, epoch uint64) context.Context {
	fwd := strconv.FormatUint(max(epoch, 1), 10)
	ids, _ := ctx.Value(avoidKey{}).([]string)
	for _, val := range metadata.ValueFromIncomingContext(ctx, AvoidHeader) {
		for rest, pieces := val, 0; rest != "" && len(ids) < MaxAvoid && pieces < 16*MaxAvoid; pieces++ {
			var id string
			id, rest, _ = strings.Cut(rest, ",")
			if id = strings.TrimSpace(id); id != "" && !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
	}
	if len(ids) == 0 {
		return metadata.AppendToOutgoingContext(ctx, ForwardedHeader, fwd)
	}
	return metadata.AppendToOutgoingContext(ctx, ForwardedHeader, fwd, AvoidHeader, strings.Join(ids, ","))
}

// nextOwnerKey is the context key marking a decision this node makes as a
// key's next owner, for an owner that could not decide it (asNextOwner).
type nextOwnerKey struct{}

// asNextOwner returns ctx for a decision this node makes in place of the
// key's owner, which could not be reached (nextOwner): it is made here
// whatever the view says (see strayOwner).
func asNextOwner(ctx context.Context) context.Context {
	return context.WithValue(ctx, nextOwnerKey{}, true)
}

// avoidKey is the context key of the member ids this node could not reach
// for a call (avoiding).
type avoidKey struct{}

// avoiding returns ctx for a failover: the calls it forwards name owner,
// which this node could not reach, in their AvoidHeader (markForwarded).
func avoiding(ctx context.Context, owner string) context.Context {
	ids, _ := ctx.Value(avoidKey{}).([]string)
	return context.WithValue(ctx, avoidKey{}, append(slices.Clip(ids), owner))
}

// names reports whether the call's AvoidHeader names member id (among its
// first MaxAvoid ids).
func names(ctx context.Context, id string) bool {
	seen := 0
	for _, val := range metadata.ValueFromIncomingContext(ctx, AvoidHeader) {
		for rest, pieces := val, 0; rest != "" && seen < MaxAvoid && pieces < 16*MaxAvoid; pieces++ {
			var got string
			got, rest, _ = strings.Cut(rest, ",")
			if got = strings.TrimSpace(got); got != "" {
				seen++
				if got == id {
					return true
				}
			}
		}
	}
	return false
}

// route returns the member that answers key when it is another node and
// the call may be forwarded; nil when this node answers. A caller's call
// on a node that has not caught up is ErrNotReady (notCaughtUp). A
// forwarded call is answered where it lands (route never forwards it; a
// newer view may send it on, strayOwner), but a key whose owner
// the forwarding node could not reach (its AvoidHeader names the owner) is
// decided here only if this node finds that owner down too: a node cut off
// from a healthy owner (a broken connection after a partition) must not
// make another node decide that owner's keys from a fresh bucket. A key
// whose owner the caller could not reach (AvoidHeader) goes to its next
// owner among the members not named. A new owner's question about a
// key's state (HandoffHeader) is always answered here.
func (n *Node) route(ctx context.Context, v *cluster.View, key string) (*cluster.Member, error) {
	if !n.data.CaughtUp() && !forwarded(ctx) && !n.sole() {
		return nil, notCaughtUp()
	}
	if v.Len() == 0 {
		if n.sole() {
			return nil, nil
		}
		return nil, failf(ErrNotReady, "this node has no routing view yet; retry")
	}
	owner, _ := v.Owner(key)
	self := n.data.ID()
	if owner.ID == self { // the owner is checked first: it is free
		return nil, nil
	}
	if forwarded(ctx) {
		if fromNewOwner(ctx) {
			// A key's new owner asks about the bucket this node holds
			// or handed over (HandoffHeader): only this node can
			// answer, whoever its view says owns the key.
			return nil, nil
		}
		if names(ctx, owner.ID) && !n.peers.down(ctx, owner) {
			return nil, failf(ErrUnavailable, "the key's owner %s answers its health check from %s, which does not decide its keys for a node that cannot reach it; retry", owner.ID, self)
		}
		return nil, nil
	}
	if avoid := n.avoided(ctx, v); avoid[owner.ID] {
		next, ok := v.OwnerExcept(cluster.KeyHash(key), func(id string) bool { return avoid[id] && id != self })
		if !ok || next.ID == self {
			return nil, nil
		}
		return &next, nil
	}
	remote := owner // a copy: owner stays on the stack when this node owns the key
	return &remote, nil
}

// notCaughtUp is the answer to a caller's call on a node still replaying
// its Raft log after a start: its routing view is one of the past (the
// views it replays), so it neither decides nor forwards by it. The
// members do not route to it until it has caught up and rejoined the
// view; a forwarded call is still answered, and so is any call on a sole
// member that has applied everything committed (sole), before its
// readiness check latches.
func notCaughtUp() error {
	return failf(ErrNotReady, "this node is still replaying its log; retry on another member")
}

// sole reports whether this node may decide every key without a routing
// view: it is the only member of the Raft configuration, leads it and has
// applied everything committed. The view it is about to commit can only
// name itself, so a single fresh node decides from its first rule write on.
func (n *Node) sole() bool {
	st, err := n.control.Status()
	return err == nil && len(st.Members) == 1 && st.Members[0].ID == n.data.ID() &&
		st.State == "Leader" && st.AppliedIndex >= st.CommitIndex
}

// MaxAvoid is the most member ids of an AvoidHeader a node honors; the
// rest are ignored.
const MaxAvoid = 64

// avoided returns the member ids of the caller's AvoidHeader that this
// node honors (see Peers.avoidable), nil if none. It reads at most
// MaxAvoid ids and never splits the whole header: its size is the
// caller's (the transport bounds it by Config.MaxHeaderListSize).
func (n *Node) avoided(ctx context.Context, v *cluster.View) map[string]bool {
	vals := metadata.ValueFromIncomingContext(ctx, AvoidHeader)
	if len(vals) == 0 {
		return nil
	}
	var out map[string]bool
	seen, pieces := 0, 0
	for _, val := range vals {
		for rest := val; rest != "" && seen < MaxAvoid && pieces < 16*MaxAvoid; pieces++ {
			var id string
			id, rest, _ = strings.Cut(rest, ",")
			if id = strings.TrimSpace(id); id == "" || id == n.data.ID() {
				continue
			}
			seen++
			m, inView := v.Member(id)
			if !inView || n.peers.avoidable(m) {
				if out == nil {
					out = map[string]bool{}
				}
				out[id] = true
			}
		}
	}
	return out
}

// nextOwner is the member that answers key when owner cannot be reached:
// the next in rendezvous order among the members that are neither owner
// nor avoided by the caller. ok is false when there is none, or when this
// node is next and does not find owner down by its own health check
// (Peers.down): a call that failed is no proof that the owner is gone, and
// a healthy owner's keys must not move. A next owner elsewhere is asked
// with owner named in the AvoidHeader (call it with avoiding), and checks
// the same before it decides (route).
//
// cause is how the call to owner failed. Only an owner that took the call
// and did not answer in time (silentOwner) is checked here: a connection
// refused or reset is this node's own proof that the owner's process is
// gone (kill -9: TestSDKKilledOwner), while a silent owner may be alive
// behind a broken path (TestIssue20Item17_HealthyOwnersKeysNeverMove).
func (n *Node) nextOwner(ctx context.Context, v *cluster.View, key, owner string, cause error) (next cluster.Member, local, ok bool) {
	avoid := n.avoided(ctx, v)
	self := n.data.ID()
	next, ok = v.OwnerExcept(cluster.KeyHash(key), func(id string) bool { return id != self && (id == owner || avoid[id]) })
	if ok && next.ID == self && errors.As(cause, new(silentOwner)) {
		if m, inView := v.Member(owner); inView && !n.peers.down(ctx, m) {
			return next, false, false
		}
	}
	if ok {
		n.metrics.failovers.Inc()
	}
	return next, ok && next.ID == self, ok
}

// toOwner makes a data-plane call on the key's owner, marked forwarded and
// under the caller's deadline less a reserve (answerReserve) for this node
// to answer with; a failure to reach it is Unavailable.
func toOwner[R any](ctx context.Context, n *Node, owner *cluster.Member, call func(context.Context, pb.TokenServiceClient) (R, error)) (R, error) {
	return toOwnerWithin(ctx, n, owner, false, call)
}

// tryOwner is toOwner for an attempt that a failover may follow: it gets
// half of what is left of the caller's deadline, at most
// Config.ForwardTimeout, so that the next owner can still answer in time
// (as the SDK fails over within its call). An owner that does not answer
// within that is Unavailable, as one that cannot be reached.
func tryOwner[R any](ctx context.Context, n *Node, owner *cluster.Member, call func(context.Context, pb.TokenServiceClient) (R, error)) (R, error) {
	return toOwnerWithin(ctx, n, owner, true, call)
}

func toOwnerWithin[R any](ctx context.Context, n *Node, owner *cluster.Member, first bool, call func(context.Context, pb.TokenServiceClient) (R, error)) (R, error) {
	var zero R
	conn, err := n.peers.connTo(owner.ID, owner.GRPCAddr)
	if err != nil {
		return zero, peerError("owner "+owner.ID, err)
	}
	n.metrics.forwarded.WithLabelValues(owner.ID).Inc()
	actx, cancel, budget := n.attemptContext(ctx, first)
	defer cancel()
	resp, err := call(markForwardedAt(actx, n.routingEpoch(ctx)), pb.NewTokenServiceClient(conn))
	if err != nil {
		// The caller's time is not up: a deadline hit is the attempt's
		// (the owner may end the call itself just before, by the
		// deadline it was sent).
		if ctx.Err() == nil && (actx.Err() != nil || codeOf(err) == codes.DeadlineExceeded) {
			return zero, silentOwner{failf(ErrUnavailable, "owner %s did not answer within %v", owner.ID, budget.Round(time.Microsecond))}
		}
		return zero, peerError("owner "+owner.ID, err)
	}
	return resp, nil
}

// attemptContext bounds one forwarding attempt: a first attempt (that a
// failover may follow) to half of what is left of ctx's deadline, at most
// Config.ForwardTimeout; a last one to the deadline less a reserve
// (answerReserve) for this node to answer its caller.
func (n *Node) attemptContext(ctx context.Context, first bool) (context.Context, context.CancelFunc, time.Duration) {
	dl, ok := ctx.Deadline()
	if !ok {
		d := cmp.Or(n.cfg.ForwardTimeout, DefaultForwardTimeout)
		c, cancel := context.WithTimeout(ctx, d)
		return c, cancel, d
	}
	left := time.Until(dl)
	d := left - answerReserve(left)
	if first {
		d = min(left/2, cmp.Or(n.cfg.ForwardTimeout, DefaultForwardTimeout))
	}
	c, cancel := context.WithTimeout(ctx, d)
	return c, cancel, d
}

// answerReserve is the part of a call's time left that forwarding leaves
// for this node to answer (a batch, the items it could): a tenth, at most
// 20 ms.
func answerReserve(left time.Duration) time.Duration {
	return min(left/10, 20*time.Millisecond)
}

// forwardBatch sends each owner its items as one AcquireTokens call and
// writes the answers (or the call's error, per item) into results. Items of
// an owner that cannot decide go to their next owners, once.
func (n *Node) forwardBatch(ctx context.Context, v *cluster.View, items []*pb.AcquireTokenRequest, remote map[string][]int, results []*pb.AcquireTokensResult) {
	n.forwardBatchOnce(routedBy(ctx, v.Epoch), v, items, remote, results, true)
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
			resp, err := toOwnerWithin(ctx, n, &owner, failover, func(ctx context.Context, c pb.TokenServiceClient) (*pb.AcquireTokensResponse, error) {
				return c.AcquireTokens(ctx, sub)
			})
			if err == nil && len(resp.GetResults()) != len(idx) {
				err = failf(ErrInternal, "owner %s answered %d items for %d", id, len(resp.GetResults()), len(idx))
			}
			if err != nil && failover && unreachable(err) && n.failoverBatch(ctx, v, items, id, idx, results, err) {
				return
			}
			for j, i := range idx {
				if err != nil {
					results[i].Status = toStatus(err).Proto()
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
func (n *Node) failoverBatch(ctx context.Context, v *cluster.View, items []*pb.AcquireTokenRequest, owner string, idx []int, results []*pb.AcquireTokensResult, cause error) bool {
	var remote map[string][]int
	t := n.data.Table()
	for _, i := range idx {
		next, local, ok := n.nextOwner(ctx, v, items[i].GetKey(), owner, cause)
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
		g, err := n.decide(asNextOwner(ctx), t, v.Epoch, items[i], resp)
		if err != nil {
			st := toStatus(err)
			n.metrics.observeError(st.Code())
			results[i].Status = st.Proto()
			continue
		}
		if !g.IsZero() {
			resp.GrantId = g.String()
		}
		results[i].Response = resp
	}
	if remote != nil {
		n.forwardBatchOnce(avoiding(ctx, owner), v, items, remote, results, false)
	}
	return true
}

// silentOwner is the error of a call that the owner took and did not
// answer within the attempt's time (see nextOwner).
type silentOwner struct{ error }

// Unwrap returns the Unavailable failure.
func (e silentOwner) Unwrap() error { return e.error }
