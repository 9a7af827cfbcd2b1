package handoff

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tokenserver/tokenserver/internal/cluster"
	"github.com/tokenserver/tokenserver/internal/grant"
	"github.com/tokenserver/tokenserver/internal/rule"
	"github.com/tokenserver/tokenserver/internal/shard"
	peerv1 "github.com/tokenserver/tokenserver/proto/tokenserver/peer/v1"
)

// Receiver serves HandoffService: it installs what peers send and tells
// the node which keys are still in flight (InFlight), so that their
// decisions go to the old owner, or wait for the state (WaitKey), rather
// than start fresh. Build it with NewReceiver. It never blocks a decision
// by itself: the node bounds every wait by the caller's deadline.
type Receiver struct {
	peerv1.UnimplementedHandoffServiceServer
	l Local
	// isPeer reports whether a call comes from another node; calls that
	// do not are refused with PermissionDenied.
	isPeer func(context.Context) bool
	// view is the current routing view (for Prepare's old view).
	view func() *cluster.View

	mu       sync.Mutex
	pending  map[string]*pending
	finished map[string]time.Time // when each sender's last handoff ended
	npending atomic.Int64
	// installed is closed, and replaced, each time a batch is installed:
	// WaitKey's wake-up.
	installed chan struct{}

	// Installed counts buckets installed; Asked the decisions sent to a
	// key's old owner while its state was in flight, Waited those that
	// waited for the state here, Held those answered with a retry because
	// the state had not come within the caller's time, Expired the
	// handoffs whose wait ran out before they ended; SentBuckets and
	// SentBytes what this node handed over.
	Installed, Asked, Waited, Held, Expired, SentBuckets, SentBytes atomic.Int64

	// unplanned are members that left the view without a handoff; fresh
	// the keys started fresh here because of one (rule, key: when).
	unplanned  map[string]*cluster.View
	nunplanned atomic.Int64
	fresh      map[freshKey]time.Time
}

// freshKey is a key started fresh after an unplanned move.
type freshKey struct{ rule, key string }

// MaxFresh bounds the fresh keys the exposure metric remembers.
const MaxFresh = 100_000

// unplannedFor is how long keys of a failed member count as moved
// unplanned when they first show up here.
const unplannedFor = 10 * time.Minute

// pending is a handoff expected from one member.
type pending struct {
	from     string
	old      *cluster.View // the view in which from owned the keys
	deadline time.Time
	done     chan struct{}
	closed   bool
	// guessed marks an entry's expectation (ExpectEntry): nothing says
	// that from owes a handoff, so a wait that runs out does not count
	// from as gone unplanned.
	guessed bool
	// senders is old without the members the receiver's view has lost
	// since (from always kept), and seen the view it was made for
	// (ownerOf).
	senders, seen *cluster.View
}

// ownerOf is the owner of ownerKey when from handed its keys over: in
// old, without the members that left the receiver's view cur since (from
// is kept). old is the receiver's view when it learned of the handoff;
// the sender's own view can already be without members whose leaving the
// receiver has not applied yet (a scale-down of two nodes in a row), and
// their keys then went to the sender: keyed by old alone, they would not
// count as in flight and would start fresh here. A member the receiver
// has lost without the sender having lost it only makes a key wait for
// the sender's handoff to end. p is under the receiver's lock.
func (p *pending) ownerOf(ownerKey string, cur *cluster.View) (cluster.Member, bool) {
	if p.guessed || cur == nil {
		return p.old.Owner(ownerKey)
	}
	if p.seen != cur {
		ms := make([]cluster.Member, 0, p.old.Len())
		for _, m := range p.old.Members() {
			if _, ok := cur.Member(m.ID); ok || m.ID == p.from {
				ms = append(ms, m)
			}
		}
		p.senders, p.seen = cluster.NewView(p.old.Epoch, ms), cur
	}
	return p.senders.Owner(ownerKey)
}

// NewReceiver returns a Receiver for l.
func NewReceiver(l Local, isPeer func(context.Context) bool, view func() *cluster.View) *Receiver {
	return &Receiver{l: l, isPeer: isPeer, view: view, pending: map[string]*pending{}, finished: map[string]time.Time{},
		installed: make(chan struct{}), unplanned: map[string]*cluster.View{}, fresh: map[freshKey]time.Time{}}
}

// Unplanned records that member from left the view old without handing
// its keys over (it failed): its keys start fresh here, and Exposure
// counts them. A member that announced its drain is not unplanned.
func (r *Receiver) Unplanned(from string, old *cluster.View) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p, ok := r.pending[from]; ok {
		if !p.guessed {
			return
		}
		r.finishLocked(from, false) // only guessed: it owed nothing known
	}
	if t, ok := r.finished[from]; ok && time.Since(t) < unplannedFor {
		return
	}
	r.unplannedLocked(from, old)
}

// unplannedLocked is Unplanned without its checks; r.mu is held.
func (r *Receiver) unplannedLocked(from string, old *cluster.View) {
	if _, ok := r.unplanned[from]; !ok {
		r.nunplanned.Add(1)
	}
	r.unplanned[from] = old
	time.AfterFunc(unplannedFor, func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.unplanned[from] == old {
			delete(r.unplanned, from)
			r.nunplanned.Add(-1)
		}
	})
}

// markFresh records that key of ruleName starts fresh here; r.mu is held.
func (r *Receiver) markFresh(ruleName, key string) {
	if len(r.fresh) < MaxFresh {
		k := freshKey{ruleName, key}
		if _, ok := r.fresh[k]; !ok {
			r.fresh[k] = time.Now()
		}
	}
}

// MarkStale records that key of ruleName goes on here from a state that
// may be stale (a bucket this node handed over, thawed because the
// handoff back never came): the exposure metric counts it as a fresh
// start, which bounds it.
func (r *Receiver) MarkStale(ruleName, key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.markFresh(ruleName, key)
}

// Exposure is the over-admission bound, in permits, that this node's
// fresh starts expose for rule c at now: every key started fresh within
// one period of c, times its capacity. Older records are forgotten.
func (r *Receiver) Exposure(c *rule.Compiled, now time.Time) int64 {
	if c == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var sum int64
	for k, t := range r.fresh {
		if now.Sub(t) >= max(c.Rule.Period, unplannedFor) {
			delete(r.fresh, k)
			continue
		}
		if k.rule == c.Rule.Name {
			sum += c.ConfigFor(k.key).Capacity()
		}
	}
	return sum
}

// Expect registers a handoff from member from, which owned keys in old,
// for up to wait: until it ends, InFlight names from for those keys.
func (r *Receiver) Expect(from string, old *cluster.View, wait time.Duration) {
	r.expect(from, old, wait, false, false)
}

// ExpectEntry is Expect for a node that finds itself in a view without
// having seen the view before it entered: its first view after a restart
// can already hold it (an old local state, or view changes that came
// together), so it cannot tell what moved. It expects from to hand over
// the keys from owned in old (the view without this node) and to end
// the handoff, as every member does on a view change, with a last batch,
// empty if it had nothing. A wait that runs out here does not count from
// as gone unplanned: it may simply have owed nothing.
func (r *Receiver) ExpectEntry(from string, old *cluster.View, wait time.Duration) {
	r.expect(from, old, wait, false, true)
}

// Heard reports whether a handoff from from has ended here (completed,
// empty or not) since this receiver was built.
func (r *Receiver) Heard(from string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.finished[from]
	return ok
}

// Guessed reports whether the handoff expected from from is only
// guessed (ExpectEntry): nothing has said that from owes one.
func (r *Receiver) Guessed(from string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.pending[from]
	return p != nil && p.guessed
}

// expect is Expect; announced (by Prepare) counts even when a handoff from
// the sender ended recently; guessed is ExpectEntry's.
func (r *Receiver) expect(from string, old *cluster.View, wait time.Duration, announced, guessed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t, ok := r.finished[from]; ok && !announced && time.Since(t) < wait {
		return // its handoff came before this node saw the view change
	}
	if p := r.pending[from]; p != nil && !p.closed {
		p.old, p.deadline, p.seen = old, time.Now().Add(wait), nil
		p.guessed = p.guessed && guessed
		return
	}
	r.pending[from] = &pending{from: from, old: old, deadline: time.Now().Add(wait), done: make(chan struct{}), guessed: guessed}
	r.npending.Add(1)
}

// finish ends the handoff from from.
func (r *Receiver) finish(from string, completed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.finishLocked(from, completed)
}

// finishLocked is finish; r.mu is held.
func (r *Receiver) finishLocked(from string, completed bool) {
	if completed {
		r.finished[from] = time.Now()
	}
	if p := r.pending[from]; p != nil && !p.closed {
		p.closed = true
		close(p.done)
		delete(r.pending, from)
		r.npending.Add(-1)
	}
}

// pendingFor is the pending handoff that the state of the key whose
// owner is hashed from ownerKey belongs to: one from the member that
// owned it in the view before, nil if none; a
// handoff announced or owed comes before a guessed one (ExpectEntry). A
// handoff whose wait ran out ends here: its sender counts as gone
// unplanned, unless it was only guessed. r.mu is held.
func (r *Receiver) pendingFor(ownerKey string, now time.Time) *pending {
	var guess *pending
	cur := r.view()
	for from, q := range r.pending {
		o, ok := q.ownerOf(ownerKey, cur)
		if !ok || o.ID != from || o.ID == r.l.ID {
			continue
		}
		if q.guessed {
			// A guess covers only the keys the view gives this node.
			if c, ok := cur.Owner(ownerKey); !ok || c.ID != r.l.ID {
				continue
			}
		}
		if now.After(q.deadline) {
			r.Expired.Add(1)
			r.finishLocked(from, false)
			if !q.guessed {
				r.unplannedLocked(from, q.old)
			}
			continue
		}
		if !q.guessed {
			return q
		}
		guess = q
	}
	return guess
}

// Busy reports whether a handoff to this node is pending or a member
// left unplanned lately: whether InFlight can say anything but no. It is
// one atomic load each.
func (r *Receiver) Busy() bool { return r.npending.Load() != 0 || r.nunplanned.Load() != 0 }

// InFlight reports the member whose handoff of key's bucket of ruleName
// this node still waits for: it owned the key before and has announced
// (or, the view says, owes) a handoff that has not ended, and the bucket
// is not here yet. The node then asks that member to decide. A key whose
// old owner left unplanned starts fresh here, and is counted (Exposure).
// It costs one atomic load when nothing is pending or unplanned.
func (r *Receiver) InFlight(ruleName, key string) (cluster.Member, bool) {
	return r.InFlightOwned(ruleName, key, key)
}

// InFlightOwned is InFlight for a bucket whose owner is not hashed from
// its key but from ownerKey (an Envoy counter's is its descriptor's).
func (r *Receiver) InFlightOwned(ruleName, key, ownerKey string) (cluster.Member, bool) {
	if !r.Busy() || r.l.Buckets.Has(ruleName, key) {
		return cluster.Member{}, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if p := r.pendingFor(ownerKey, time.Now()); p != nil {
		o, _ := p.ownerOf(ownerKey, r.view())
		return o, true
	}
	for from, old := range r.unplanned {
		if o, ok := old.Owner(ownerKey); ok && o.ID == from {
			r.markFresh(ruleName, key)
		}
	}
	return cluster.Member{}, false
}

// WaitKey waits until key's bucket of ruleName is installed here (true:
// decide here), or until until passes or ctx ends (false: the state is
// still in flight). When the old owner has not said that it handed the
// bucket over (handedOver false: it did not answer), the end of the
// handoff the key belongs to, or there being none, is also true. The
// wait is that of a batch on the wire.
func (r *Receiver) WaitKey(ctx context.Context, ruleName, key string, until time.Time, handedOver bool) bool {
	return r.WaitKeyOwned(ctx, ruleName, key, key, until, handedOver)
}

// WaitKeyOwned is WaitKey for a bucket whose owner is hashed from
// ownerKey (InFlightOwned).
func (r *Receiver) WaitKeyOwned(ctx context.Context, ruleName, key, ownerKey string, until time.Time, handedOver bool) bool {
	r.Waited.Add(1)
	for {
		if r.l.Buckets.Has(ruleName, key) {
			return true
		}
		now := time.Now()
		r.mu.Lock()
		p, woke := r.pendingFor(ownerKey, now), r.installed
		r.mu.Unlock()
		if p == nil && !handedOver {
			return true
		}
		left := until.Sub(now)
		if left <= 0 {
			return false
		}
		var done <-chan struct{}
		if p != nil {
			done, left = p.done, min(left, p.deadline.Sub(now))
		}
		t := time.NewTimer(left)
		select {
		case <-woke:
		case <-done:
			if handedOver { // it ended without this key: it went elsewhere
				t.Stop()
				return r.l.Buckets.Has(ruleName, key)
			}
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return false
		}
		t.Stop()
	}
}

// Prepare implements peerv1.HandoffServiceServer.
func (r *Receiver) Prepare(ctx context.Context, req *peerv1.PrepareRequest) (*peerv1.PrepareResponse, error) {
	if !r.isPeer(ctx) {
		return nil, status.Error(codes.PermissionDenied, "handoff is for peers only: present a peer certificate")
	}
	wait := time.Duration(req.GetWaitNs())
	if wait <= 0 || wait > time.Minute {
		wait = DefaultWait
	}
	r.expect(req.GetFrom(), r.view(), wait, true, false)
	return &peerv1.PrepareResponse{}, nil
}

// Transfer implements peerv1.HandoffServiceServer: every batch is
// installed as it arrives; the last one ends the handoff.
func (r *Receiver) Transfer(stream grpc.ClientStreamingServer[peerv1.HandoffBatch, peerv1.TransferResponse]) error {
	if !r.isPeer(stream.Context()) {
		return status.Error(codes.PermissionDenied, "handoff is for peers only: present a peer certificate")
	}
	var installed int64
	first := true
	for {
		b, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return stream.SendAndClose(&peerv1.TransferResponse{Installed: installed})
		}
		if err != nil {
			return err
		}
		now := r.l.Now()
		offset := now - b.GetSenderNowNs() // the sender's clock to ours
		if first {
			first = false
			var is []shard.Issuer
			for _, in := range b.GetIssuers() {
				var k grant.Keys
				if err := k.UnmarshalBinary(in.GetKeys()); err != nil {
					return status.Errorf(codes.InvalidArgument, "issuer: %v", err)
				}
				is = append(is, shard.Issuer{Keys: k, Offset: in.GetOffsetNs() + offset})
			}
			r.l.Buckets.AddIssuers(is)
		}
		t := r.l.Table()
		for _, s := range b.GetBuckets() {
			ok, err := r.l.Buckets.Import(t, FromPB(s), now)
			if err != nil {
				return status.Errorf(codes.FailedPrecondition, "install bucket of rule %q: %v", s.GetRule(), err)
			}
			if ok {
				installed++
				r.Installed.Add(1)
			}
		}
		r.mu.Lock()
		close(r.installed)
		r.installed = make(chan struct{})
		r.mu.Unlock()
		if b.GetLast() {
			r.finish(b.GetFrom(), true)
		}
	}
}
