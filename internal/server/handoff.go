package server

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tokenserver/tokenserver/internal/auth"
	"github.com/tokenserver/tokenserver/internal/cluster"
	"github.com/tokenserver/tokenserver/internal/handoff"
	"github.com/tokenserver/tokenserver/internal/overadmit"
	"github.com/tokenserver/tokenserver/internal/rule"
	peerv1 "github.com/tokenserver/tokenserver/proto/tokenserver/peer/v1"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// Bucket handoff (internal/handoff): on a planned move of keys (this node
// drains, another joins or comes back) the old owner freezes and sends
// the moved buckets to their new owners. Until a key's state has come,
// its new owner asks the old owner to decide (HandoffHeader), or, once
// the old owner has handed it over, waits for the batch within the
// caller's deadline and otherwise denies with a short retry_after: never
// longer than the caller allows, never a fresh bucket.

// handoffRetry is the pause between attempts to hand buckets over.
const handoffRetry = 200 * time.Millisecond

// handoffLocal is this node as package handoff sees it.
func (n *Node) handoffLocal() handoff.Local {
	return handoff.Local{ID: n.data.ID(), Buckets: n.buckets, Table: n.data.Table, Now: func() int64 { return n.now() }}
}

// newHandoff builds the node's handoff receiver and registers its
// peer-only service.
func (n *Node) newHandoff() func(grpc.ServiceRegistrar) {
	n.handoff = handoff.NewReceiver(n.handoffLocal(), func(ctx context.Context) bool { return !n.peersOnly || auth.IsPeer(ctx) }, n.data.View)
	n.metrics.reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tokenserver_handoff_sent_buckets_total", Help: "Buckets this node handed over to new owners of their keys."},
			func() float64 { return float64(n.handoff.SentBuckets.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tokenserver_handoff_sent_bytes_total", Help: "Bytes of bucket state this node handed over."},
			func() float64 { return float64(n.handoff.SentBytes.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tokenserver_handoff_installed_buckets_total", Help: "Buckets handed over to this node and installed."},
			func() float64 { return float64(n.handoff.Installed.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tokenserver_handoff_expired_waits_total", Help: "Announced handoffs whose wait ran out before they ended (the sender was gone or slow; its keys start fresh here)."},
			func() float64 { return float64(n.handoff.Expired.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tokenserver_handoff_asked_total", Help: "Decisions this node, as a key's new owner, sent to the key's old owner while the key's state was in flight."},
			func() float64 { return float64(n.handoff.Asked.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tokenserver_handoff_held_total", Help: "Decisions denied with a short retry_after because the key's state had not arrived within the caller's deadline."},
			func() float64 { return float64(n.handoff.Held.Load()) }),
		&exposureCollector{n: n},
	)
	n.addBoundParts()
	return func(s grpc.ServiceRegistrar) { peerv1.RegisterHandoffServiceServer(s, n.handoff) }
}

// exposureDesc is tokenserver_overadmission_bound_permits: the sum of the
// components of n.bound (overadmit.Bound), one gauge per rule.
var exposureDesc = prometheus.NewDesc("tokenserver_overadmission_bound_permits",
	"Per rule, the over-admission this node's own actions currently expose, in permits: the sum of keys it started fresh after an unplanned move (or a handoff that did not come) times their capacity, permits held by live concurrency leases, and debt. See docs/operations.md.",
	[]string{"rule"}, nil)

// exposureCollector reports exposureDesc on every scrape.
type exposureCollector struct{ n *Node }

func (c *exposureCollector) Describe(ch chan<- *prometheus.Desc) { ch <- exposureDesc }

func (c *exposureCollector) Collect(ch chan<- prometheus.Metric) {
	t := c.n.data.Table()
	now := time.Now()
	for _, r := range t.Rules() {
		ch <- prometheus.MustNewConstMetric(exposureDesc, prometheus.GaugeValue, float64(c.n.bound.Permits(t.Get(r.Name), now)), r.Name)
	}
}

// owedEvery is how often the debt and lease parts of the bound rescan the
// buckets (shard.Map.Owed): at most once per this, whatever the scrapes.
const owedEvery = 5 * time.Second

// owedCache is the last scan of the buckets' debt and leases, per rule.
type owedCache struct {
	mu     sync.Mutex
	at     time.Time
	debt   map[string]int64
	leased map[string]int64
}

// get returns the scan's figures for rule name, scanning n's buckets
// again when the last scan is older than owedEvery.
func (o *owedCache) get(n *Node, name string, now time.Time) (debt, leased int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.debt == nil || now.Sub(o.at) >= owedEvery {
		o.at, o.debt, o.leased = now, map[string]int64{}, map[string]int64{}
		n.buckets.Owed(n.now(), func(c *rule.Compiled, debt, leased int64) {
			o.debt[c.Rule.Name] += debt
			o.leased[c.Rule.Name] += leased
		})
	}
	return o.debt[name], o.leased[name]
}

// addBoundParts registers the handoff's parts of the over-admission bound
// (others, such as replication lag, register theirs on n.bound).
func (n *Node) addBoundParts() {
	var owed owedCache
	n.bound.Add(overadmit.Func{N: "unplanned_fresh", F: n.handoff.Exposure})
	n.bound.Add(overadmit.Func{N: "leases", F: func(c *rule.Compiled, now time.Time) int64 {
		_, leased := owed.get(n, c.Rule.Name, now)
		return leased
	}})
	n.bound.Add(overadmit.Func{N: "debt", F: func(c *rule.Compiled, now time.Time) int64 {
		debt, _ := owed.get(n, c.Rule.Name, now)
		return debt
	}})
}

// dialPeer opens (or reuses) the connection to a peer.
func (n *Node) dialPeer(addr string) (grpc.ClientConnInterface, error) { return n.peers.conn(addr) }

// prepareHandoff tells the members that take this node's keys once it
// leaves the view that those keys will be in flight: until they arrive,
// those members ask this node to decide them (handoffDecide).
func (n *Node) prepareHandoff(ctx context.Context) {
	self := n.data.ID()
	for _, m := range n.data.View().Members() {
		if m.ID == self {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		if err := handoff.Prepare(cctx, n.handoffLocal(), m, n.dialPeer, handoff.DefaultWait); err != nil {
			n.log.Warn("handoff: could not announce the drain", "member", m.ID, "err", err)
		}
		cancel()
	}
}

// handOver sends the buckets this node no longer owns in the current view
// to their owners, until done or ctx ends. Copies of durable buckets that
// copies selects are installed first, to go with them
// (replica.Replicator.InstallMoved); nil selects none.
func (n *Node) handOver(ctx context.Context, why string, copies func(ruleName, key string) bool) {
	start := time.Now()
	self := n.data.ID()
	if copies != nil {
		if k, err := n.replica.InstallMoved(copies); err != nil {
			n.log.Warn("handoff: copies of moved durable keys not all sent to their owners", "why", why, "err", err)
		} else if k > 0 {
			n.log.Info("handoff: copies of moved durable keys go to their owners", "why", why, "copies", k)
		}
	}
	moved := func(ruleName, key string) (cluster.Member, bool) {
		m, ok := n.data.View().Owner(ownerKey(ruleName, key))
		return m, ok && m.ID != self
	}
	buckets, bytes, err := handoff.Send(ctx, n.handoffLocal(), moved, n.dialPeer, handoffRetry, n.data.View().Members()...)
	n.handoff.SentBuckets.Add(buckets)
	n.handoff.SentBytes.Add(bytes)
	if err != nil {
		n.log.Warn("handoff: buckets not handed over; their keys start fresh on their new owners", "why", why, "buckets_sent", buckets, "err", err)
		return
	}
	if buckets > 0 {
		n.log.Info("handoff: buckets handed over", "why", why, "buckets", buckets, "bytes", bytes, "took", time.Since(start))
	}
}

// viewSeen is the last view observeView handled, and its lock.
type viewSeen struct {
	mu sync.Mutex
	// view is stored once its moves are handled (the handoffs it makes
	// expected), never before: a decision that finds it current decides
	// on what that view moved.
	view atomic.Pointer[cluster.View]
	// handling, in tests, is called while a view is being handled.
	handling func()
	// entering is set while this node, having found itself in a view it
	// did not see itself enter, has not yet heard a handoff end from
	// every other member (expectEntry).
	entering bool
}

// watchMoves runs observeView on every view change, until the node stops.
func (n *Node) watchMoves() {
	defer n.wg.Done()
	ch := n.data.ViewChanged()
	n.observeView(n.data.View())
	for {
		select {
		case <-n.done:
			return
		case <-ch:
		}
		ch = n.data.ViewChanged()
		n.observeView(n.data.View())
	}
}

// observeView handles the move from the last view it saw to cur, once per
// view: it hands buckets over when the view moves keys away from this
// node while it stays a member (a member joins or comes back), and, when
// this node enters the view, expects the members that held its keys to
// hand them over. A drain is Stop's (prepareHandoff, handOver). Decisions
// call it too (cheap when the view is the one seen), so that a key is
// never decided on a view whose moves are not yet expected.
//
// A restarted node may never see a view without itself: its first view
// is its old local state, and the views of its leaving and coming back
// can come together. It then expects every other member to hand over
// what it owned in the view without this node (expectEntry), on each
// view change, until each has ended a handoff here.
func (n *Node) observeView(cur *cluster.View) {
	if n.seen.view.Load() == cur {
		return
	}
	n.seen.mu.Lock()
	defer n.seen.mu.Unlock()
	old := n.seen.view.Load()
	if old == cur {
		return
	}
	// Stored once handled: a decision that loads cur meanwhile waits on
	// the lock above, rather than decide a key whose handoff this node
	// does not expect yet (a fresh bucket, a release of a lease on the
	// wire answered with nothing).
	defer n.seen.view.Store(cur)
	if n.seen.handling != nil {
		n.seen.handling()
	}
	self := n.data.ID()
	in := func(v *cluster.View) bool { _, ok := v.Member(self); return ok }
	if old == nil || old.Len() == 0 {
		// The first view (or none before it): this node cannot tell what
		// moved while it was away.
		if in(cur) && !n.draining.Load() && n.expectEntry(cur) {
			// The others may be guessing too (a restart of every
			// node): end their waits for this node at once, and send
			// on whatever it holds that is no longer its own.
			n.handOverAsync("entry", true, nil)
		}
		return
	}
	if in(cur) {
		// Members gone without announcing a drain failed: their keys
		// start fresh here, which the exposure metric counts.
		for _, m := range old.Members() {
			if _, still := cur.Member(m.ID); !still && m.ID != self {
				n.handoff.Unplanned(m.ID, old)
			}
		}
	}
	switch {
	case n.draining.Load():
	case in(old) && in(cur) && !old.Equal(cur):
		n.handOverAsync("view change", false, old)
	case in(old) && in(cur):
		// The same members at a new epoch: for a node still entering,
		// its leaving and coming back may both lie in between.
		if n.seen.entering {
			n.expectEntry(cur)
		}
	case !in(old) && in(cur):
		n.seen.entering = false // it saw itself enter: old is what moved
		for _, m := range old.Members() {
			if _, still := cur.Member(m.ID); still && m.ID != self {
				n.handoff.Expect(m.ID, old, handoff.DefaultWait)
			}
		}
	}
}

// handOverAsync runs handOver in the background, for at most 30 s or
// until the node stops. On entry (first), it first waits until the node
// is ready, so that its checkpoint is read back and its rule table
// complete, and sends the copies of every key the view gives another
// member; otherwise the copies of keys whose owner changed from old.
func (n *Node) handOverAsync(why string, first bool, old *cluster.View) {
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		go func() { // the node stopping ends the handoff
			select {
			case <-n.done:
				cancel()
			case <-ctx.Done():
			}
		}()
		self := n.data.ID()
		var copies func(ruleName, key string) bool
		if first {
			for !n.data.Ready() {
				select {
				case <-ctx.Done():
					return
				case <-time.After(50 * time.Millisecond):
				}
			}
			n.restoreCheckpoint()
			copies = func(ruleName, key string) bool {
				m, ok := n.data.View().Owner(ownerKey(ruleName, key))
				return ok && m.ID != self
			}
		} else {
			copies = func(ruleName, key string) bool {
				k := ownerKey(ruleName, key)
				was, _ := old.Owner(k)
				m, ok := n.data.View().Owner(k)
				return ok && m.ID != self && m.ID != was.ID
			}
		}
		n.handOver(ctx, why, copies)
	}()
}

// ownCopies selects, for a drain, the copies of keys this node owned in
// the view with it (a checkpoint read back whose keys were not decided
// here since): they go to the keys' owners with the buckets.
func (n *Node) ownCopies() func(ruleName, key string) bool {
	self := n.data.ID()
	ms := append([]cluster.Member{{ID: self}}, n.data.View().Members()...)
	with := cluster.NewView(0, ms)
	return func(ruleName, key string) bool {
		m, ok := with.Owner(ownerKey(ruleName, key))
		return ok && m.ID == self
	}
}

// ownerKey is the key whose owner holds key's bucket of ruleName: the key
// itself, but an Envoy counter's is its descriptor's (envoy_decide.go).
func ownerKey(ruleName, key string) string {
	if k, envoy := envoyOwnerKey(ruleName, key); envoy {
		return k
	}
	return key
}

// expectEntry expects each other member of cur that has not yet ended a
// handoff here to hand over the keys it owned in cur without this node
// (handoff.Receiver.ExpectEntry), and keeps n.seen.entering while any
// has not; it reports whether cur has other members. n.seen.mu is held.
func (n *Node) expectEntry(cur *cluster.View) bool {
	self := n.data.ID()
	others := make([]cluster.Member, 0, cur.Len())
	for _, m := range cur.Members() {
		if m.ID != self {
			others = append(others, m)
		}
	}
	without := cluster.NewView(cur.Epoch, others)
	n.seen.entering = false
	var waiting []string
	for _, m := range others {
		if n.handoff.Heard(m.ID) {
			continue
		}
		n.seen.entering = true
		waiting = append(waiting, m.ID)
		n.handoff.ExpectEntry(m.ID, without, handoff.DefaultWait)
	}
	if len(waiting) > 0 {
		n.log.Info("handoff: in a view this node did not see itself enter; expecting its keys back", "from", waiting, "epoch", cur.Epoch)
	}
	return len(others) > 0
}

// HandoffHeader marks a decision that a key's new owner sends to the
// key's old owner while the key's state is in flight: the old owner
// decides it from the bucket it still holds, or answers Aborted with
// reason HandedOverReason (it froze the bucket to hand it over: the
// state is on the wire) or NotHereReason (it holds no state for the key:
// nothing is in flight). It never forwards such a call.
const HandoffHeader = "x-tokenserver-handoff"

// The google.rpc.ErrorInfo reasons of an old owner's Aborted (see
// HandoffHeader).
const (
	HandedOverReason = "HANDED_OVER"
	NotHereReason    = "NOT_HERE"
)

// handoffRetryAfter is the retry_after of a deny for a key whose state
// did not arrive within the caller's time: about a batch's trip.
const handoffRetryAfter = 20 * time.Millisecond

// fromNewOwner reports whether the call is a new owner's question to this
// node as a key's old owner (HandoffHeader). It counts only on a
// forwarded call, whose marker counts only from peers when peers can be
// told apart (dropForeignForward).
func fromNewOwner(ctx context.Context) bool {
	return forwarded(ctx) && asked(ctx)
}

// asked reports whether the call carries HandoffHeader; fromNewOwner is a
// forwarded call that does.
func asked(ctx context.Context) bool {
	return len(metadata.ValueFromIncomingContext(ctx, HandoffHeader)) > 0
}

// oldOwnerAnswer is the Aborted an old owner answers with reason.
func oldOwnerAnswer(reason, format string, args ...any) error {
	st := status.New(codes.Aborted, fmt.Sprintf(format, args...))
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: pb.ErrorDomain}); err == nil {
		st = d
	}
	return st.Err()
}

// oldOwnerReason is the reason of an old owner's Aborted, "" for any
// other error.
func oldOwnerReason(err error) string {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Aborted {
		return ""
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == pb.ErrorDomain {
			return info.GetReason()
		}
	}
	return ""
}

// stateElsewhere reports the member that holds key's state of ruleName
// while it is not decided here yet: the old owner while its handoff is
// in flight (Receiver.InFlight), or, on a node outside its own view
// (draining, or entering before it has heard that it is back) that a
// call reaches, the owner in its view, when it holds no bucket of the
// key; outside says which. It first observes the current view, so that a
// key is never decided or settled on a view whose moves are not yet
// expected.
//
// A node outside its own view expects no handoff (it does not know yet
// that keys come to it), so when the owner in its view cannot answer, the
// caller waits for the key's state as if that owner had said it handed
// the bucket over (WaitKey's handedOver): it never starts the key fresh.
func (n *Node) stateElsewhere(ruleName, key string) (m cluster.Member, ok, outside bool) {
	v := n.data.View()
	n.observeView(v)
	if old, ok := n.handoff.InFlight(ruleName, key); ok {
		return old, true, false
	}
	if _, in := v.Member(n.data.ID()); in {
		return cluster.Member{}, false, false // the usual case: no owner to hash
	}
	owner, has := v.Owner(key)
	if !has {
		return cluster.Member{}, false, false
	}
	if held, _ := n.buckets.Held(ruleName, key); held {
		return cluster.Member{}, false, false
	}
	return owner, true, true
}

// strayOwner reports the member a decision or settlement of key under
// ruleName goes to instead of this node, which holds no bucket of the key
// and whose view gives it to that member, when the call was routed here
// by an older view (routedBy: this node's view when it routed the call,
// or the forwarding node's, forwardedEpoch): a
// batch decided across a view change, or a forward from a node that has
// not seen it yet. Made here, it would start a fresh bucket beside the
// key's state on its owner (this node handed its bucket over and dropped
// it, or never held one), or settle a grant on none. Not for a decision
// as the key's next owner (asNextOwner, or an owner the caller names in
// its AvoidHeader), nor on a node outside its own view (stateElsewhere).
// Each such hop goes to a newer view, so a call cannot go round.
func (n *Node) strayOwner(ctx context.Context, routedBy uint64, ruleName, key string) (cluster.Member, bool) {
	v := n.data.View()
	if routedBy >= v.Epoch || ctx.Value(nextOwnerKey{}) != nil {
		return cluster.Member{}, false // routed by this view (or a newer one)
	}
	self := n.data.ID()
	if _, in := v.Member(self); !in {
		return cluster.Member{}, false
	}
	owner, ok := v.Owner(key)
	if !ok || owner.ID == self || names(ctx, owner.ID) {
		return cluster.Member{}, false
	}
	if held, _ := n.buckets.Held(ruleName, key); held {
		return cluster.Member{}, false // decided on the state it holds
	}
	return owner, true
}

// handoffDecide handles an acquire whose key's bucket is not decided here
// yet. done says it answered (into resp, grant id included), else the
// caller decides locally.
//
// On the key's new owner, while the state is in flight (InFlight), the
// call goes to the old owner, which still holds the bucket and answers
// while it drains (--drain-linger). Once the old owner has frozen the
// bucket, the call waits for the batch carrying it, within the caller's
// deadline; if the state has still not come,
// it is denied with a short retry_after: a deny is an answer, so the SDK
// does not fall back, and nothing is admitted twice. The caller's time
// goes in thirds: asking, waiting, and a third left to answer in. On the old owner
// (HandoffHeader), a key it holds no state for is NotHereReason.
func (n *Node) handoffDecide(ctx context.Context, c *rule.Compiled, epoch uint64, req *pb.AcquireTokenRequest, resp *pb.AcquireTokenResponse) (bool, error) {
	name, key := req.GetRule(), req.GetKey()
	fe := forwardedEpoch(ctx)
	if fe > 0 && asked(ctx) { // fromNewOwner
		if held, _ := n.buckets.Held(name, key); !held {
			if owner, ok := n.data.View().Owner(key); !ok || owner.ID != n.data.ID() {
				return true, n.notHere(name, key)
			}
		}
		return false, nil
	}
	old, ok, outside := n.stateElsewhere(name, key)
	if !ok {
		routed := epoch
		if fe > 0 {
			routed = fe // routed by the forwarding node's view
		}
		owner, stray := n.strayOwner(ctx, routed, name, key)
		if !stray {
			return false, nil
		}
		r, err := toOwner(ctx, n, &owner, func(ctx context.Context, tc pb.TokenServiceClient) (*pb.AcquireTokenResponse, error) {
			return tc.AcquireToken(ctx, req)
		})
		if err == nil {
			proto.Reset(resp)
			proto.Merge(resp, r)
		}
		return true, err
	}
	n.handoff.Asked.Add(1)
	// The caller's time in thirds: one to ask the old owner, one to wait
	// for the state, one to answer in.
	start := time.Now()
	left := handoff.DefaultWait
	if dl, ok := ctx.Deadline(); ok {
		left = time.Until(dl)
	}
	actx, cancel := context.WithTimeout(ctx, left/3)
	defer cancel()
	r, err := toOwner(metadata.AppendToOutgoingContext(actx, HandoffHeader, "1"), n, &old, func(ctx context.Context, tc pb.TokenServiceClient) (*pb.AcquireTokenResponse, error) {
		return tc.AcquireToken(ctx, req)
	})
	if err != nil && actx.Err() != nil && ctx.Err() == nil {
		err = failf(ErrUnavailable, "old owner %s did not answer within %v", old.ID, left/3)
	}
	reason := oldOwnerReason(err)
	switch {
	case err == nil:
		proto.Reset(resp)
		proto.Merge(resp, r)
		return true, nil
	case reason == NotHereReason:
		return false, nil // nothing of the key is in flight
	case reason == "" && !outside && n.handoff.Guessed(old.ID):
		// Only guessed (ExpectEntry), and the old owner did not say that
		// it holds the key: it is decided here. If the old owner could
		// not be asked, the key counts as fresh; should it hand a state
		// over later, the emptier bucket wins (shard.Map.Import).
		if unreachable(err) {
			n.handoff.MarkStale(name, key)
		}
		return false, nil
	case reason == "" && !unreachable(err):
		return true, err // the old owner's answer (a bad request, an unknown rule)
	}
	// Handed over (on the wire), or the old owner did not answer: wait.
	until := start.Add(2 * left / 3)
	if n.handoff.WaitKey(ctx, name, key, until, reason == HandedOverReason || outside) {
		return false, nil
	}
	n.handoff.Held.Add(1)
	proto.Reset(resp)
	resp.RetryAfterNs = int64(handoffRetryAfter)
	resp.Remaining = 0
	resp.RuleVersion = c.Rule.Version
	resp.Epoch = epoch
	resp.Reason = pb.Reason_LIMIT
	return true, nil
}

// notHere is an old owner's answer to a new owner's question on a key it
// holds no bucket of and does not own: NotHereReason, unless it keeps a
// copy of the key's durable bucket, which its handoff sends to the key's
// owner (handOverAsync): then HandedOverReason, so that the new owner
// waits for it rather than start the key fresh.
func (n *Node) notHere(ruleName, key string) error {
	if n.replica.Store.Has(ruleName, key) {
		return oldOwnerAnswer(HandedOverReason, "node %s sends its copy of the bucket of key %q of rule %q to the key's owner", n.data.ID(), key, ruleName)
	}
	return oldOwnerAnswer(NotHereReason, "node %s holds no state for key %q of rule %q", n.data.ID(), key, ruleName)
}

// decideMoved answers an acquire on a bucket this node handed over
// (shard.ErrMoved). The key's owner in the view decides it; to a new
// owner's question (HandoffHeader) the answer is HandedOverReason. When
// the view gives the key back to this node and no handoff of it is
// pending (InFlight came first), the handoff back never comes: the bucket
// goes on from the state it left with, never fresh, and counts in the
// exposure metric.
func (n *Node) decideMoved(ctx context.Context, t *rule.Table, epoch uint64, req *pb.AcquireTokenRequest, resp *pb.AcquireTokenResponse) error {
	name, key := req.GetRule(), req.GetKey()
	if fromNewOwner(ctx) {
		return oldOwnerAnswer(HandedOverReason, "node %s handed the bucket of key %q of rule %q over", n.data.ID(), key, name)
	}
	owner, ok := n.data.View().Owner(key)
	if !ok || owner.ID == n.data.ID() {
		if n.buckets.Thaw(name, key) {
			n.handoff.MarkStale(name, key)
		}
		g, err := n.decide(ctx, t, epoch, req, resp)
		if err == nil && !g.IsZero() {
			resp.GrantId = g.String()
		}
		return err
	}
	r, err := toOwner(ctx, n, &owner, func(ctx context.Context, tc pb.TokenServiceClient) (*pb.AcquireTokenResponse, error) {
		return tc.AcquireToken(ctx, req)
	})
	if err != nil {
		return err
	}
	proto.Reset(resp)
	proto.Merge(resp, r)
	return nil
}
