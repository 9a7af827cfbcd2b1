package replica

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tokenserver/tokenserver/internal/cluster"
	"github.com/tokenserver/tokenserver/internal/grant"
	"github.com/tokenserver/tokenserver/internal/handoff"
	"github.com/tokenserver/tokenserver/internal/rule"
	"github.com/tokenserver/tokenserver/internal/shard"
	peerv1 "github.com/tokenserver/tokenserver/proto/tokenserver/peer/v1"
)

// BatchBuckets is the most buckets in one message of a Replicate stream
// or a checkpoint.
const BatchBuckets = 1024

// Local is the node replication works for.
type Local struct {
	// ID is this node's id.
	ID string
	// Buckets is the node's bucket map.
	Buckets *shard.Map
	// Table returns the current rule table.
	Table func() *rule.Table
	// Now is the node's clock (the shard's).
	Now func() int64
	// View returns the current routing view.
	View func() *cluster.View
	// IsPeer reports whether a call comes from another node; Replicate
	// refuses calls that do not with PermissionDenied.
	IsPeer func(context.Context) bool
}

// Replicator replicates this node's durable buckets and keeps the copies
// of other nodes'. Safe for simultaneous use by multiple goroutines. Build
// it with New.
type Replicator struct {
	peerv1.UnimplementedReplicaServiceServer
	l Local
	// Tracker is the dirty set and the lag.
	Tracker *Tracker
	// Store holds the copies kept for others.
	Store *Store

	// SentBuckets, SentBytes and Failures count what Tick sent and the
	// streams that failed; Received what Replicate stored; Installed
	// the copies installed before a decision.
	SentBuckets, SentBytes, Failures, Received, Installed atomic.Int64
	// CheckpointBuckets, CheckpointBytes and CheckpointNanos describe the
	// last checkpoint written.
	CheckpointBuckets, CheckpointBytes, CheckpointNanos atomic.Int64
	// changed is set when buckets were sent or copies received since the
	// last checkpoint.
	changed atomic.Bool
	// restored is set once RestoreOnce ran.
	restored  atomic.Bool
	restoreMu sync.Mutex
	// sendBufs and copyBufs reuse the batches of Tick and storeBatch.
	sendBufs, copyBufs sync.Pool
}

var _ peerv1.ReplicaServiceServer = (*Replicator)(nil)

// New returns a Replicator for l. Its Store holds at most CopyShare
// percent of l.Buckets' memory budget (DefaultMaxCopyBytes without one),
// counted against that budget.
func New(l Local) *Replicator {
	var limit int64
	var budget Budget
	if l.Buckets != nil {
		limit, budget = l.Buckets.MaxBytes()/100*CopyShare, l.Buckets
	}
	r := &Replicator{l: l, Tracker: newTracker(l.Buckets), Store: NewStore(limit, budget)}
	r.sendBufs.New = func() any { return new(sendBuf) }
	r.copyBufs.New = func() any { b := make([]Copy, 0, BatchBuckets); return &b }
	return r
}

// Touch records a change of key's bucket of c that admitted permits; a
// no-op unless c is durable. permits > 0 only right after an Acquire (or
// AcquireInline, AcquireLease) of the bucket map: that decision marked
// the bucket dirty in the map already, so Touch only adds the permits to
// the lag (an atomic add). A change that admitted nothing (a refill, a
// commit, a renewal, a denial) marks the bucket in the map by its key (a
// lookup); a key without a bucket has nothing to send.
func (r *Replicator) Touch(c *rule.Compiled, key string, permits int64) {
	switch {
	case c == nil || !c.Rule.Durable:
	case r.Tracker.src == nil:
		r.Tracker.Touch(c.Rule.Name, key, permits)
	case permits > 0:
		r.Tracker.addLag(c.Rule.Name, permits)
	default:
		r.Tracker.src.MarkKey(c.Rule.Name, key)
	}
}

// Install installs the copy this node holds of key's bucket of c, if
// any, into the bucket map, before a decision on the key: this node has
// become the key's owner (or decides for an owner that does not answer)
// and continues from the copy. Import keeps whichever of the copy and a
// bucket already here has fewer permits left. A no-op (one bool check)
// unless c is durable.
func (r *Replicator) Install(c *rule.Compiled, key string) error {
	if c == nil || !c.Rule.Durable {
		return nil
	}
	cp, ok := r.Store.Take(c.Rule.Name, key)
	if !ok || r.stale(c, cp, r.l.Now()) {
		return nil
	}
	ok, err := r.l.Buckets.Import(r.l.Table(), cp.State, cp.At)
	if err != nil {
		return fmt.Errorf("install replica of rule %q: %w", c.Rule.Name, err)
	}
	if ok {
		r.Installed.Add(1)
		r.l.Buckets.MarkKey(c.Rule.Name, key) // on to this node's own next owner
	}
	return nil
}

// stale reports whether cp is of no use for rule c at now: another
// generation, or older than the key's window (a checkpoint read back
// after a long stop).
func (r *Replicator) stale(c *rule.Compiled, cp Copy, now int64) bool {
	return c.Rule.Generation != cp.State.Generation || now-cp.At >= c.ConfigFor(cp.State.Key).Span()
}

// Prune drops the copies whose rule is gone, no longer durable, of
// another generation, or that are older than their window. Call it only
// with a complete rule table (a ready node). It returns the copies
// dropped.
func (r *Replicator) Prune() int64 {
	t, now := r.l.Table(), r.l.Now()
	var n int64
	r.Store.Range(func(cp Copy) bool {
		c := t.Get(cp.State.Rule)
		if c == nil || !c.Rule.Durable || r.stale(c, cp, now) {
			n++
			return false
		}
		return true
	})
	return n
}

// Resync marks for replication every durable bucket of this node whose
// next owner is another member in view cur than in view old: the new
// next owner has no copy yet, and a bucket that does not change would
// otherwise never reach it. It returns the buckets marked.
func (r *Replicator) Resync(old, cur *cluster.View) (int, error) {
	t := r.l.Table()
	n := 0
	err := r.l.Buckets.Export(r.l.Now(), func(name, key string) bool {
		c := t.Get(name)
		if c == nil || !c.Rule.Durable {
			return false
		}
		now, ok := r.successor(cur, key)
		was, had := r.successor(old, key)
		return ok && (!had || was.ID != now.ID)
	}, func(s shard.BucketState) error {
		r.Tracker.Touch(s.Rule, s.Key, 0)
		n++
		return nil
	})
	if err != nil {
		return n, fmt.Errorf("resync: %w", err)
	}
	return n, nil
}

// successor is the member that keeps the copy of key's buckets: the
// key's next owner in rendezvous order after this node.
func (r *Replicator) successor(v *cluster.View, key string) (cluster.Member, bool) {
	return v.OwnerExcept(cluster.KeyHash(key), func(id string) bool { return id == r.l.ID })
}

// Tick sends every bucket changed since the last Tick to its key's next
// owner: one Replicate stream per member, in batches of BatchBuckets.
// Buckets a member did not acknowledge stay dirty for the next Tick.
// dial opens (or reuses) a connection to a member.
func (r *Replicator) Tick(ctx context.Context, dial func(addr string) (grpc.ClientConnInterface, error)) error {
	tk := r.Tracker.Take()
	if len(tk.Refs) == 0 && len(tk.Marked) == 0 {
		r.Tracker.Ack(tk)
		return nil
	}
	v, now := r.l.View(), r.l.Now()
	type group struct {
		member cluster.Member
		out    outgoing
	}
	groups := map[string]*group{}
	var unsent outgoing
	size := (len(tk.Refs)+len(tk.Marked))/max(1, v.Len()-1) + 1
	add := func(key string) *outgoing {
		m, ok := r.successor(v, key)
		if !ok {
			return &unsent // no other member yet
		}
		g := groups[m.ID]
		if g == nil {
			g = &group{member: m}
			g.out.marked = make([]shard.Dirty, 0, size)
			groups[m.ID] = g
		}
		return &g.out
	}
	for _, d := range tk.Marked {
		o := add(d.Key())
		o.marked = append(o.marked, d)
	}
	for _, ref := range tk.Refs {
		o := add(ref.Key)
		o.refs = append(o.refs, ref)
	}
	issuers, err := issuersPB(r.l.Buckets.Issuers())
	if err != nil {
		r.Tracker.Requeue(tk, tk.Refs, tk.Marked...)
		return err
	}
	var failed error
	for _, g := range groups {
		n, bytes, err := r.send(ctx, dial, g.member, now, issuers, g.out)
		r.SentBuckets.Add(n)
		r.SentBytes.Add(bytes)
		if err != nil {
			r.Failures.Add(1)
			unsent.refs = append(unsent.refs, g.out.refs...)
			unsent.marked = append(unsent.marked, g.out.marked...)
			failed = errors.Join(failed, fmt.Errorf("replicate to %s: %w", g.member.ID, err))
		}
	}
	r.changed.Store(true)
	if unsent.len() > 0 {
		r.Tracker.Requeue(tk, unsent.refs, unsent.marked...)
	} else {
		r.Tracker.Ack(tk)
	}
	return failed
}

// outgoing is the buckets of one Tick for one member: those the bucket
// map marked, read through their mark, and those named by rule and key.
type outgoing struct {
	marked []shard.Dirty
	refs   []Ref
}

func (o *outgoing) len() int { return len(o.marked) + len(o.refs) }

// sendBuf is one batch being built: its messages are reused from batch
// to batch and from Tick to Tick (a stream's Send encodes a message
// before it returns).
type sendBuf struct {
	vals  [BatchBuckets]peerv1.BucketState
	ptrs  [BatchBuckets]*peerv1.BucketState
	batch peerv1.ReplicaBatch
}

// exportBatch fills buf with the states of o's buckets (from the
// front, marked first, as many as a batch holds) as of now; it returns
// the states and consumes the buckets it read from o. A bucket that is
// gone (evicted back at its initial state) has nothing to keep and is
// skipped.
func (r *Replicator) exportBatch(buf *sendBuf, o *outgoing, now int64) ([]*peerv1.BucketState, error) {
	n := 0
	put := func(s shard.BucketState, ok bool, err error) error {
		if err != nil {
			return fmt.Errorf("replicate: %w", err)
		}
		if ok {
			toPB(&buf.vals[n], s)
			buf.ptrs[n] = &buf.vals[n]
			n++
		}
		return nil
	}
	for n < BatchBuckets && len(o.marked) > 0 {
		d := o.marked[0]
		o.marked = o.marked[1:]
		if err := put(d.Export(now)); err != nil {
			return nil, err
		}
	}
	for n < BatchBuckets && len(o.refs) > 0 {
		ref := o.refs[0]
		o.refs = o.refs[1:]
		if err := put(r.l.Buckets.ExportKey(ref.Rule, ref.Key, now)); err != nil {
			return nil, err
		}
	}
	return buf.ptrs[:n], nil
}

// toPB is handoff.ToPB into a message that is reused.
func toPB(b *peerv1.BucketState, s shard.BucketState) {
	*b = peerv1.BucketState{Rule: s.Rule, Generation: s.Generation, Key: s.Key, Seq: s.Seq, First: s.First,
		PenaltyLeftNs: s.PenaltyLeft, State: s.State, RefillFloorNs: s.RefillFloor}
	for _, r := range s.Refilled {
		b.Refilled = append(b.Refilled, &peerv1.Refilled{Nonce: r.Nonce, ExpiresInNs: r.ExpiresIn})
	}
	if l := s.Inline; l != nil {
		b.Inline = &peerv1.InlineLimit{Algorithm: int32(l.Algorithm), Limit: l.Limit, PeriodNs: int64(l.Period), Burst: l.Burst}
	}
}

// send exports o's buckets and streams them to member.
func (r *Replicator) send(ctx context.Context, dial func(string) (grpc.ClientConnInterface, error), member cluster.Member, now int64, issuers []*peerv1.Issuer, o outgoing) (n, bytes int64, err error) {
	conn, err := dial(member.GRPCAddr)
	if err != nil {
		return 0, 0, err
	}
	stream, err := peerv1.NewReplicaServiceClient(conn).Replicate(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("open replicate stream: %w", err)
	}
	buf := r.sendBufs.Get().(*sendBuf)
	defer func() {
		clear(buf.vals[:]) // let go of the states
		r.sendBufs.Put(buf)
	}()
	b := &buf.batch
	for first := true; o.len() > 0; first = false {
		states, err := r.exportBatch(buf, &o, now)
		if err != nil {
			stream.CloseSend()
			return n, bytes, err
		}
		if len(states) == 0 && !first {
			continue
		}
		*b = peerv1.ReplicaBatch{From: r.l.ID, SenderNowNs: now, Buckets: states}
		if first {
			b.Issuers = issuers
		}
		if err := stream.Send(b); err != nil {
			_, err = stream.CloseAndRecv() // the real error
			return n, bytes, fmt.Errorf("send batch: %w", err)
		}
		n += int64(len(b.Buckets))
		bytes += int64(proto.Size(b))
	}
	if _, err := stream.CloseAndRecv(); err != nil {
		return n, bytes, fmt.Errorf("close replicate stream: %w", err)
	}
	return n, bytes, nil
}

// Replicate implements peerv1.ReplicaServiceServer: it stores every
// batch's buckets as copies and accepts the grants of their issuers.
func (r *Replicator) Replicate(stream grpc.ClientStreamingServer[peerv1.ReplicaBatch, peerv1.ReplicateResponse]) error {
	if !r.l.IsPeer(stream.Context()) {
		return status.Error(codes.PermissionDenied, "replication is for peers only: present a peer certificate")
	}
	var stored int64
	for {
		b, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return stream.SendAndClose(&peerv1.ReplicateResponse{Stored: stored})
		}
		if err != nil {
			return err
		}
		n, err := r.storeBatch(b, r.l.Now())
		if err != nil {
			return status.Errorf(codes.InvalidArgument, "replica batch: %v", err)
		}
		stored += n
	}
}

// storeBatch keeps b's buckets, whose sender_now_ns is at on this node's
// clock.
func (r *Replicator) storeBatch(b *peerv1.ReplicaBatch, at int64) (int64, error) {
	if len(b.GetIssuers()) > 0 {
		offset := at - b.GetSenderNowNs()
		var is []shard.Issuer
		for _, in := range b.GetIssuers() {
			var k grant.Keys
			if err := k.UnmarshalBinary(in.GetKeys()); err != nil {
				return 0, fmt.Errorf("issuer: %w", err)
			}
			is = append(is, shard.Issuer{Keys: k, Offset: in.GetOffsetNs() + offset})
		}
		r.l.Buckets.AddIssuers(is)
	}
	var n int64
	buf := r.copyBufs.Get().(*[]Copy)
	defer func() {
		clear(*buf)
		*buf = (*buf)[:0]
		r.copyBufs.Put(buf)
	}()
	bs := b.GetBuckets()
	for len(bs) > 0 {
		part := bs[:min(len(bs), BatchBuckets)]
		bs = bs[len(part):]
		cs := (*buf)[:0]
		for _, s := range part {
			if len(s.GetKey()) > rule.MaxKeyLen || len(s.GetRule()) > rule.MaxNameLen {
				r.Received.Add(n)
				return n, fmt.Errorf("bucket of rule %q: key or rule name too long", s.GetRule())
			}
			cs = append(cs, Copy{State: handoff.FromPB(s), At: at})
		}
		*buf = cs
		n += int64(r.Store.PutBatch(cs))
	}
	r.Received.Add(n)
	r.changed.Store(true)
	return n, nil
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
