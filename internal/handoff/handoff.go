// Package handoff moves bucket state between nodes when the routing view
// moves keys on a planned change: the wire format, batching, the sender
// and the receiver (which tells the node which keys are still in flight,
// so that it asks their old owner instead of starting them fresh).
package handoff

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/cluster"
	"github.com/tokenserver/tokenserver/internal/rule"
	"github.com/tokenserver/tokenserver/internal/shard"
	peerv1 "github.com/tokenserver/tokenserver/proto/tokenserver/peer/v1"
)

// Defaults.
const (
	// BatchBuckets is the most buckets in one batch.
	BatchBuckets = 512
	// DefaultWait bounds how long a receiver treats the keys of an
	// announced handoff as in flight: past it, the sender is taken as
	// gone and its keys start fresh here (counted as unplanned).
	DefaultWait = 3 * time.Second
	// DefaultDropFrozenAfter is Local.DropFrozenAfter's default.
	DefaultDropFrozenAfter = 5 * time.Second
)

// FromPB converts a wire bucket to a shard one.
func FromPB(b *peerv1.BucketState) shard.BucketState {
	s := shard.BucketState{Rule: b.GetRule(), Generation: b.GetGeneration(), Key: b.GetKey(), Seq: b.GetSeq(), First: b.GetFirst(),
		PenaltyLeft: b.GetPenaltyLeftNs(), State: b.GetState(), RefillFloor: b.GetRefillFloorNs()}
	for _, r := range b.GetRefilled() {
		s.Refilled = append(s.Refilled, shard.RefilledGrant{Nonce: r.GetNonce(), ExpiresIn: r.GetExpiresInNs()})
	}
	if l := b.GetInline(); l != nil {
		s.Inline = &rule.InlineLimit{Algorithm: bucket.Algorithm(l.GetAlgorithm()), Limit: l.GetLimit(), Period: time.Duration(l.GetPeriodNs()), Burst: l.GetBurst()}
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
	if l := s.Inline; l != nil {
		b.Inline = &peerv1.InlineLimit{Algorithm: int32(l.Algorithm), Limit: l.Limit, PeriodNs: int64(l.Period), Burst: l.Burst}
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
	// DropFrozenAfter is how long Send keeps the frozen copy of a bucket
	// once the key's new owner has acknowledged its state, before it
	// drops it (shard.Map.DropFrozen): meanwhile a call that a peer whose
	// view lags still sends here finds the frozen bucket and goes on to
	// the new owner instead of starting a fresh bucket here. 0 means
	// DefaultDropFrozenAfter; below 0, the copy is dropped at once.
	DropFrozenAfter time.Duration
}

// dropFrozen drops refs from l's buckets after l.DropFrozenAfter.
func (l Local) dropFrozen(refs []shard.FrozenRef) {
	after := cmp.Or(l.DropFrozenAfter, DefaultDropFrozenAfter)
	if after < 0 {
		l.Buckets.DropFrozen(refs)
		return
	}
	time.AfterFunc(after, func() { l.Buckets.DropFrozen(refs) })
}

// Send streams every bucket for which moved reports a new owner to that
// owner, one Transfer stream per owner, in batches of BatchBuckets, the
// grant issuers first. Each bucket is frozen here as it is exported
// (shard.Map.HandOver): decisions on it after that go to the new owner,
// so the state it receives is the whole count. dial opens a connection
// to a member. A failed owner's buckets are sent again, to the owner
// moved reports then (the view may have moved the key on; a key moved
// back here is thawed), every retry until ctx ends; import is
// idempotent, so a stream cut in the middle is simply sent again. Once
// an owner has acknowledged its buckets, their frozen copies here are
// dropped (Local.DropFrozenAfter). It returns the buckets and bytes sent.
//
// Every member of also that gets no bucket is sent an empty last batch,
// so that it stops waiting for this node's keys at once.
func Send(ctx context.Context, l Local, moved func(ruleName, key string) (cluster.Member, bool), dial func(addr string) (grpc.ClientConnInterface, error), retry time.Duration, also ...cluster.Member) (buckets, bytes int64, err error) {
	now := l.Now()
	var states []*peerv1.BucketState
	var refs []shard.FrozenRef // of states, one for one
	err = l.Buckets.HandOver(now, func(ruleName, key string) bool {
		m, ok := moved(ruleName, key)
		return ok && m.ID != l.ID
	}, func(s shard.BucketState) error {
		states = append(states, ToPB(s))
		refs = append(refs, s.Ref())
		return nil
	})
	if err != nil {
		return 0, 0, fmt.Errorf("handoff export: %w", err)
	}
	for {
		groups := map[string]*group{}
		for _, m := range also {
			if m.ID != l.ID {
				groups[m.ID] = &group{member: m}
			}
		}
		for i, s := range states {
			m, ok := moved(s.GetRule(), s.GetKey())
			if !ok || m.ID == l.ID {
				// The key came back here before a new owner had it: it
				// goes on from the state it left with.
				l.Buckets.Thaw(s.GetRule(), s.GetKey())
				continue
			}
			g := groups[m.ID]
			if g == nil {
				g = &group{member: m}
				groups[m.ID] = g
			}
			g.states = append(g.states, s)
			g.refs = append(g.refs, refs[i])
		}
		var failed error
		states, refs, also = states[:0:0], refs[:0:0], nil
		for _, g := range groups {
			n, b, err := sendGroup(ctx, l, g, now, dial)
			buckets += n
			bytes += b
			if err != nil && len(g.states) > 0 {
				// Sent again whole (import is idempotent), to the owner
				// the view gives each key then. (A member that had
				// nothing to get is not retried: its wait runs out.)
				states = append(states, g.states...)
				refs = append(refs, g.refs...)
				failed = errors.Join(failed, fmt.Errorf("handoff to %s: %w", g.member.ID, err))
			} else if err == nil && len(g.refs) > 0 {
				// The new owner holds the state: the frozen copies here
				// would only linger.
				l.dropFrozen(g.refs)
			}
		}
		if failed == nil {
			return buckets, bytes, nil
		}
		select {
		case <-ctx.Done():
			return buckets, bytes, fmt.Errorf("%w (gave up: %w)", failed, ctx.Err())
		case <-time.After(retry):
		}
	}
}

type group struct {
	member cluster.Member
	states []*peerv1.BucketState
	refs   []shard.FrozenRef // of states, one for one
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

// batchSize is a batch's encoded size.
func batchSize(b *peerv1.HandoffBatch) int { return proto.Size(b) }
