package server

import (
	"cmp"
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"

	"github.com/tokenserver/tokenserver/internal/auth"
	"github.com/tokenserver/tokenserver/internal/rule"
	"github.com/tokenserver/tokenserver/internal/rulepb"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// ViewHeartbeat is the longest a WatchClusterView stream goes without a
// message: the current view is sent again at least this often, so that a
// client hearing nothing for twice as long knows the node froze.
const ViewHeartbeat = time.Second

// ViewHeartbeatHeader is request metadata by which a WatchClusterView
// caller asks for small heartbeats: when set to "1", the view is sent
// whole only when it changed, and between changes, every ViewHeartbeat, a
// heartbeat: a ClusterView with the epoch, leader, readiness and
// answered_by of the current view but no members and no rules (the view
// the caller has still holds). Without it every heartbeat is the whole
// view, as clients that predate it expect.
const ViewHeartbeatHeader = pb.ViewHeartbeatHeader

// GetClusterView implements pb.TokenServiceServer.
func (s *tokenService) GetClusterView(context.Context, *pb.GetClusterViewRequest) (*pb.ClusterView, error) {
	return s.n.clusterView(), nil
}

// WatchClusterView implements pb.TokenServiceServer: the current view, then
// a new one after every change of the members, the leader, the rules or
// the node's readiness, and the same one again at least every
// ViewHeartbeat, until the client goes away. Every stream of the node sends
// the same view message, built once per change; at most
// Config.MaxViewStreams streams at once, and Config.MaxViewStreamsPerPrincipal
// of one caller. A caller that sets ViewHeartbeatHeader gets small
// heartbeats instead of the unchanged view.
func (s *tokenService) WatchClusterView(_ *pb.GetClusterViewRequest, stream grpc.ServerStreamingServer[pb.ClusterView]) error {
	n := s.n
	vc := &n.views
	if limit := n.cfg.maxViewStreams(); vc.streams.Add(1) > int64(limit) {
		vc.streams.Add(-1)
		return toError(failf(ErrStreamCap, "this node serves %d WatchClusterView streams already (its cap); watch another member or poll GetClusterView", limit))
	}
	defer vc.streams.Add(-1)
	who := caller(stream.Context())
	if limit := cmp.Or(n.cfg.MaxViewStreamsPerPrincipal, DefaultMaxViewStreamsPerPrincipal); !vc.take(who, limit) {
		return toError(failf(ErrStreamCap, "%s has %d WatchClusterView streams on this node already (the cap per caller)", who, limit))
	}
	defer vc.give(who)
	beats := wantsHeartbeats(stream.Context())
	vc.once.Do(func() {
		vc.cur.Store(n.publication())
		go n.cast()
	})
	p := vc.cur.Load()
	var sent *encodedView // the whole view this stream sent last
	for {
		msg := p.enc
		if beats && sent == p.enc {
			msg = p.beat
		}
		if err := stream.SendMsg(msg); err != nil {
			return err
		}
		if msg == p.enc {
			sent = p.enc
		}
		select {
		case <-p.next:
			p = vc.cur.Load()
		case <-stream.Context().Done():
			return nil
		case <-n.done:
			return toError(failf(ErrUnavailable, "node is shutting down"))
		}
	}
}

// viewCaster publishes the view that every WatchClusterView stream of a
// node sends: one goroutine builds it once per change and publishes it
// again every ViewHeartbeat.
type viewCaster struct {
	once    sync.Once
	streams atomic.Int64
	cur     atomic.Pointer[viewPub]

	mu    sync.Mutex
	byWho map[string]int // streams per caller
}

// take counts a stream of caller who, false when who has limit already.
func (vc *viewCaster) take(who string, limit int) bool {
	vc.mu.Lock()
	defer vc.mu.Unlock()
	if vc.byWho[who] >= limit {
		return false
	}
	if vc.byWho == nil {
		vc.byWho = map[string]int{}
	}
	vc.byWho[who]++
	return true
}

// give forgets a stream of who.
func (vc *viewCaster) give(who string) {
	vc.mu.Lock()
	defer vc.mu.Unlock()
	if vc.byWho[who]--; vc.byWho[who] <= 0 {
		delete(vc.byWho, who)
	}
}

// caller names who makes a call, for caps per caller: its authenticated
// principal, else its remote IP address.
func caller(ctx context.Context) string {
	if p, ok := auth.FromContext(ctx); ok {
		return "principal " + p.String()
	}
	if pr, ok := peer.FromContext(ctx); ok && pr.Addr != nil {
		host, _, err := net.SplitHostPort(pr.Addr.String())
		if err != nil {
			host = pr.Addr.String()
		}
		return "address " + host
	}
	return "an unknown caller"
}

// wantsHeartbeats reports whether the caller set ViewHeartbeatHeader.
func wantsHeartbeats(ctx context.Context) bool {
	v := metadata.ValueFromIncomingContext(ctx, ViewHeartbeatHeader)
	return len(v) > 0 && v[0] == "1"
}

// viewPub is one publication: a view nobody modifies, the table and the
// view-change signal it was built after, and a channel closed when the
// next publication replaces it.
type viewPub struct {
	view        *pb.ClusterView
	enc         *encodedView // view, encoded once for every stream
	beat        *encodedView // the heartbeat of view (no members, no rules)
	table       *rule.Table
	viewChanged <-chan struct{}
	next        chan struct{}
}

// publication builds a publication of the current view.
func (n *Node) publication() *viewPub {
	t, vch := n.data.Table(), n.data.ViewChanged() // before the state they signal changes of
	v := n.clusterView()
	beat := &pb.ClusterView{Epoch: v.GetEpoch(), Leader: v.GetLeader(), Ready: v.GetReady(), AnsweredBy: v.GetAnsweredBy()}
	return &viewPub{view: v, enc: encodeView(v), beat: encodeView(beat), table: t, viewChanged: vch, next: make(chan struct{})}
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
func (n *Node) cast() {
	vc := &n.views
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
			leader, _ := n.data.Leader()
			rebuild = leader != p.view.GetLeader() || n.data.Ready() != p.view.GetReady()
		case <-n.done:
			return
		}
		next := &viewPub{view: p.view, enc: p.enc, beat: p.beat, table: p.table, viewChanged: p.viewChanged, next: make(chan struct{})}
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
	ready := n.data.Ready() // before reading the state it vouches for
	v := n.data.View()
	leader, _ := n.data.Leader()
	out := &pb.ClusterView{Leader: leader, Epoch: v.Epoch, Ready: ready, AnsweredBy: n.data.ID()}
	voters := map[string]bool{}
	if st, err := n.control.Status(); err == nil {
		for _, m := range st.Members {
			voters[m.ID] = m.Voter
		}
	}
	for _, m := range v.Members() {
		out.Members = append(out.Members, &pb.Member{Id: m.ID, GrpcAddr: m.GRPCAddr, RaftAddr: m.RaftAddr, Voter: voters[m.ID]})
	}
	for _, r := range n.data.Table().Rules() {
		out.Rules = append(out.Rules, rulepb.ClientRule(r))
	}
	return out
}
