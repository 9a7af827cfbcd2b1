// Package handoff moves bucket state between nodes when the routing view
// moves keys on a planned change: the wire format, batching, the sender
// and the receiver (which holds decisions on a key back, bounded in time,
// until its state has arrived).
package handoff

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tokenserver/tokenserver/internal/cluster"
	"github.com/tokenserver/tokenserver/internal/grant"
	"github.com/tokenserver/tokenserver/internal/rule"
	"github.com/tokenserver/tokenserver/internal/shard"
	peerv1 "github.com/tokenserver/tokenserver/proto/tokenserver/peer/v1"
)

// Defaults.
const (
	// BatchBuckets is the most buckets in one batch.
	BatchBuckets = 512
	// DefaultWait bounds how long a receiver holds a key's decisions back
	// waiting for its state.
	DefaultWait = 3 * time.Second
)

// FromPB converts a wire bucket to a shard one.
func FromPB(b *peerv1.BucketState) shard.BucketState {
	s := shard.BucketState{Rule: b.GetRule(), Generation: b.GetGeneration(), Key: b.GetKey(), Seq: b.GetSeq(), First: b.GetFirst(),
		PenaltyLeft: b.GetPenaltyLeftNs(), State: b.GetState(), RefillFloor: b.GetRefillFloorNs()}
	for _, r := range b.GetRefilled() {
		s.Refilled = append(s.Refilled, shard.RefilledGrant{Nonce: r.GetNonce(), ExpiresIn: r.GetExpiresInNs()})
	}
	return s
}

// ToPB converts a shard bucket to its wire form.
func ToPB(s shard.BucketState) *peerv1.BucketState {
	b := &peerv1.BucketState{Rule: s.Rule, Generation: s.Generation, Key: s.Key, Seq: s.Seq, First: s.First,
		PenaltyLeftNs: s.PenaltyLeft, State: s.State, RefillFloorNs: s.RefillFloor}
	for _, r := range s.Refilled {
		b.Refilled = append(b.Refilled, &peerv1.Refilled{Nonce: r.Nonce, ExpiresInNs: r.ExpiresIn})
	}
	return b
}

// Local is the node a Sender and a Receiver work for.
type Local struct {
	// ID is this node's id.
	ID string
	// Buckets is the node's bucket map.
	Buckets *shard.Map
	// Table returns the current rule table.
	Table func() *rule.Table
	// Now is the node's monotonic clock (the shard's).
	Now func() int64
}

// Send streams every bucket for which moved reports a new owner to that
// owner, one Transfer stream per owner, in batches of BatchBuckets, the
// grant issuers first. dial opens a connection to a member. A failed
// owner's buckets are sent again, to the owner moved reports then (the
// view may have moved the key on), every retry until ctx ends; import is
// idempotent, so a stream cut in the middle is simply sent again. It
// returns the buckets and bytes sent.
func Send(ctx context.Context, l Local, moved func(ruleName, key string) (cluster.Member, bool), dial func(addr string) (grpc.ClientConnInterface, error), retry time.Duration) (buckets, bytes int64, err error) {
	for {
		groups := map[string]*group{}
		now := l.Now()
		err := l.Buckets.Export(now, func(ruleName, key string) bool {
			m, ok := moved(ruleName, key)
			return ok && m.ID != l.ID
		}, func(s shard.BucketState) error {
			m, _ := moved(s.Rule, s.Key)
			g := groups[m.ID]
			if g == nil {
				g = &group{member: m}
				groups[m.ID] = g
			}
			g.states = append(g.states, ToPB(s))
			return nil
		})
		if err != nil {
			return buckets, bytes, fmt.Errorf("handoff export: %w", err)
		}
		var failed error
		for _, g := range groups {
			n, b, err := sendGroup(ctx, l, g, now, dial)
			buckets += n
			bytes += b
			if err != nil {
				failed = errors.Join(failed, fmt.Errorf("handoff to %s: %w", g.member.ID, err))
			}
		}
		if failed == nil {
			return buckets, bytes, nil
		}
		select {
		case <-ctx.Done():
			return buckets, bytes, fmt.Errorf("%w (gave up: %v)", failed, ctx.Err())
		case <-time.After(retry):
		}
	}
}

type group struct {
	member cluster.Member
	states []*peerv1.BucketState
}

// sendGroup streams g to its member.
func sendGroup(ctx context.Context, l Local, g *group, now int64, dial func(string) (grpc.ClientConnInterface, error)) (n, bytes int64, err error) {
	conn, err := dial(g.member.GRPCAddr)
	if err != nil {
		return 0, 0, err
	}
	stream, err := peerv1.NewHandoffServiceClient(conn).Transfer(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("open transfer: %w", err)
	}
	issuers, err := issuersPB(l.Buckets.Issuers())
	if err != nil {
		return 0, 0, err
	}
	for i := 0; i == 0 || i < len(g.states); i += BatchBuckets {
		batch := &peerv1.HandoffBatch{From: l.ID, SenderNowNs: now, Buckets: g.states[i:min(i+BatchBuckets, len(g.states))]}
		if i == 0 {
			batch.Issuers = issuers
		}
		batch.Last = i+BatchBuckets >= len(g.states)
		if err := stream.Send(batch); err != nil {
			_, err = stream.CloseAndRecv() // the real error
			return n, bytes, fmt.Errorf("send batch: %w", err)
		}
		n += int64(len(batch.Buckets))
		bytes += int64(batchSize(batch))
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		return n, bytes, fmt.Errorf("close transfer: %w", err)
	}
	return n, bytes, nil
}

func issuersPB(is []shard.Issuer) ([]*peerv1.Issuer, error) {
	out := make([]*peerv1.Issuer, 0, len(is))
	for _, in := range is {
		b, err := in.Keys.MarshalBinary()
		if err != nil {
			return nil, fmt.Errorf("grant keys: %w", err)
		}
		out = append(out, &peerv1.Issuer{Keys: b, OffsetNs: in.Offset})
	}
	return out, nil
}

// Prepare tells member that l is about to hand its keys over (it drains):
// the member holds back decisions on them for up to wait.
func Prepare(ctx context.Context, l Local, member cluster.Member, dial func(string) (grpc.ClientConnInterface, error), wait time.Duration) error {
	conn, err := dial(member.GRPCAddr)
	if err != nil {
		return err
	}
	_, err = peerv1.NewHandoffServiceClient(conn).Prepare(ctx, &peerv1.PrepareRequest{From: l.ID, WaitNs: int64(wait)})
	if err != nil {
		return fmt.Errorf("prepare handoff on %s: %w", member.ID, err)
	}
	return nil
}

// Receiver serves HandoffService: it installs what peers send and holds
// decisions on keys whose state is in flight. Build it with NewReceiver.
type Receiver struct {
	peerv1.UnimplementedHandoffServiceServer
	l Local
	// IsPeer reports whether a call comes from another node; calls that
	// do not are refused with PermissionDenied.
	isPeer func(context.Context) bool
	// view is the current routing view (for Prepare's old view).
	view func() *cluster.View

	mu       sync.Mutex
	pending  map[string]*pending
	finished map[string]time.Time // when each sender's last handoff ended
	npending atomic.Int64
	// Installed counts buckets installed; Waited counts decisions held
	// back, Expired those whose wait ran out before the state came;
	// SentBuckets and SentBytes what this node handed over.
	Installed, Waited, Expired, SentBuckets, SentBytes atomic.Int64

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

// Unplanned records that member from left the view old without handing
// its keys over (it failed): its keys start fresh here, and Exposure
// counts them. A member that announced its drain is not unplanned.
func (r *Receiver) Unplanned(from string, old *cluster.View) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.pending[from]; ok {
		return
	}
	if t, ok := r.finished[from]; ok && time.Since(t) < unplannedFor {
		return
	}
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

// pending is a handoff expected from one member.
type pending struct {
	from     string
	old      *cluster.View // the view in which from owned the keys
	deadline time.Time
	done     chan struct{}
	closed   bool
}

// NewReceiver returns a Receiver for l.
func NewReceiver(l Local, isPeer func(context.Context) bool, view func() *cluster.View) *Receiver {
	return &Receiver{l: l, isPeer: isPeer, view: view, pending: map[string]*pending{}, finished: map[string]time.Time{},
		unplanned: map[string]*cluster.View{}, fresh: map[freshKey]time.Time{}}
}

// Expect registers a handoff from member from, which owned keys in old,
// for up to wait: Await holds its keys back until it ends.
func (r *Receiver) Expect(from string, old *cluster.View, wait time.Duration) {
	r.expect(from, old, wait, false)
}

// expect is Expect; announced (by Prepare) counts even when a handoff from
// the sender ended recently.
func (r *Receiver) expect(from string, old *cluster.View, wait time.Duration, announced bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if t, ok := r.finished[from]; ok && !announced && time.Since(t) < wait {
		return // its handoff came before this node saw the view change
	}
	if p := r.pending[from]; p != nil && !p.closed {
		p.old, p.deadline = old, time.Now().Add(wait)
		return
	}
	r.pending[from] = &pending{from: from, old: old, deadline: time.Now().Add(wait), done: make(chan struct{})}
	r.npending.Add(1)
}

// finish ends the handoff from from.
func (r *Receiver) finish(from string, completed bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
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

// Await returns once key's bucket of ruleName may be decided here: at
// once when no handoff is pending, or the bucket is here already;
// otherwise when the handoff from the key's old owner ends, its wait
// runs out, or ctx ends. It costs one atomic load when nothing is
// pending.
func (r *Receiver) Await(ctx context.Context, ruleName, key string) {
	if r.npending.Load() == 0 && r.nunplanned.Load() == 0 || r.l.Buckets.Has(ruleName, key) {
		return
	}
	r.mu.Lock()
	for from, old := range r.unplanned {
		if o, ok := old.Owner(key); ok && o.ID == from {
			r.markFresh(ruleName, key)
		}
	}
	var p *pending
	for _, q := range r.pending {
		if o, ok := q.old.Owner(key); ok && o.ID == q.from && o.ID != r.l.ID {
			p = q
			break
		}
	}
	r.mu.Unlock()
	if p == nil {
		return
	}
	r.Waited.Add(1)
	t := time.NewTimer(time.Until(p.deadline))
	defer t.Stop()
	select {
	case <-p.done:
	case <-ctx.Done():
	case <-t.C:
		r.Expired.Add(1)
		r.mu.Lock()
		r.markFresh(ruleName, key)
		r.mu.Unlock()
		r.finish(p.from, false) // the sender is gone or slow: stop holding its keys
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
	r.expect(req.GetFrom(), r.view(), wait, true)
	return &peerv1.PrepareResponse{}, nil
}

// Transfer implements peerv1.HandoffServiceServer: every batch is
// installed as it arrives; the last one ends the handoff's hold.
func (r *Receiver) Transfer(stream grpc.ClientStreamingServer[peerv1.HandoffBatch, peerv1.TransferResponse]) error {
	if !r.isPeer(stream.Context()) {
		return status.Error(codes.PermissionDenied, "handoff is for peers only: present a peer certificate")
	}
	var installed int64
	first := true
	for {
		b, err := stream.Recv()
		if err == io.EOF {
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
		if b.GetLast() {
			r.finish(b.GetFrom(), true)
		}
	}
}

// batchSize is a batch's encoded size.
func batchSize(b *peerv1.HandoffBatch) int { return proto.Size(b) }
