package client

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// heartbeatNode is a fake member that answers WatchClusterView as a
// server does for a caller that sets pb.ViewHeartbeatHeader: the whole
// view once, then heartbeats (no members, no rules) every 50ms. It
// records whether the caller asked for them.
type heartbeatNode struct {
	pb.UnimplementedTokenServiceServer
	view   *pb.ClusterView
	asked  atomic.Bool
	beats  atomic.Int64
	stream atomic.Int64
}

func (h *heartbeatNode) GetClusterView(context.Context, *pb.GetClusterViewRequest) (*pb.ClusterView, error) {
	return h.view, nil
}

func (h *heartbeatNode) WatchClusterView(_ *pb.GetClusterViewRequest, s grpc.ServerStreamingServer[pb.ClusterView]) error {
	h.stream.Add(1)
	if v := metadata.ValueFromIncomingContext(s.Context(), pb.ViewHeartbeatHeader); len(v) == 1 && v[0] == "1" {
		h.asked.Store(true)
	}
	if err := s.Send(h.view); err != nil {
		return err
	}
	beat := &pb.ClusterView{Epoch: h.view.GetEpoch(), Ready: true, AnsweredBy: h.view.GetAnsweredBy()}
	for {
		select {
		case <-s.Context().Done():
			return nil
		case <-time.After(50 * time.Millisecond):
		}
		if err := s.Send(beat); err != nil {
			return err
		}
		h.beats.Add(1)
	}
}

// TestWatchHeartbeatsKeepTheView (issue 20, item 12): the SDK asks for
// small heartbeats on its watch stream, and a heartbeat (no members, no
// rules) changes nothing: the rules and members stay, and the stream is
// not taken for silent.
func TestWatchHeartbeatsKeepTheView(t *testing.T) {
	h := &heartbeatNode{}
	addr := serveFake(t, h)
	h.view = &pb.ClusterView{Members: []*pb.Member{{Id: "a", GrpcAddr: addr}}, Epoch: 3, Ready: true, AnsweredBy: "a",
		Rules: []*pb.ClientRule{clientRule("r", 1, pb.FallbackPolicy_DENY)}}
	c, _ := newClient(t, []string{addr}, withWatchSilence(300*time.Millisecond))
	waitRule(t, c, "r")
	// Heartbeats for well over the silence time.
	waitFor(t, 10*time.Second, "20 heartbeats", func() bool { return h.beats.Load() >= 20 })
	if !h.asked.Load() {
		t.Fatalf("the watch stream did not set %s: 1", pb.ViewHeartbeatHeader)
	}
	st := c.state.Load()
	if st.rules["r"] == nil || st.view.Len() != 1 || st.view.Epoch != 3 {
		t.Fatalf("after heartbeats: rules %v, %d members, epoch %d; want rule r, 1 member, epoch 3", st.rules, st.view.Len(), st.view.Epoch)
	}
	if n := h.stream.Load(); n != 1 {
		t.Fatalf("%d watch streams: heartbeats were taken for silence", n)
	}
}
