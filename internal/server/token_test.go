package server

import (
	"context"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/cluster"
	"github.com/tokenserver/tokenserver/internal/rule"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// recvWithin receives one view from stream, failing after d.
func recvWithin(t *testing.T, what string, stream interface {
	Recv() (*pb.ClusterView, error)
}, d time.Duration) *pb.ClusterView {
	t.Helper()
	type got struct {
		v   *pb.ClusterView
		err error
	}
	ch := make(chan got, 1)
	go func() { v, err := stream.Recv(); ch <- got{v, err} }()
	select {
	case g := <-ch:
		if g.err != nil {
			t.Fatalf("%s: %v", what, g.err)
		}
		return g.v
	case <-time.After(d):
		t.Fatalf("%s: nothing within %v", what, d)
	}
	return nil
}

// Every WatchClusterView stream gets the view at once, says who answered
// and that it is ready, gets it again at least every ViewHeartbeat without
// a change (a client hearing nothing for 2 s knows the node froze), and a
// rule change promptly.
func TestWatchClusterViewHeartbeat(t *testing.T) {
	tn := newTestNode(t, nil)
	sctx, cancel := context.WithCancel(ctx(t))
	defer cancel()
	var streams []pb.TokenService_WatchClusterViewClient
	for i := 0; i < 2; i++ {
		st, err := tn.token.WatchClusterView(sctx, &pb.GetClusterViewRequest{})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	for i, st := range streams {
		v := recvWithin(t, "first view", st, 5*time.Second)
		if !v.GetReady() || v.GetAnsweredBy() != "node-1" || len(v.GetMembers()) != 1 {
			t.Fatalf("stream %d: first view %v: want ready, answered by node-1, one member", i, v)
		}
		start := time.Now()
		recvWithin(t, "heartbeat", st, ViewHeartbeat+time.Second)
		if took := time.Since(start); took < ViewHeartbeat/2 {
			t.Logf("stream %d: second view after %v (a publication raced the first)", i, took)
		}
	}
	if _, err := tn.admin.PutRule(ctx(t), &pb.PutRuleRequest{Rule: &pb.Rule{Name: "r", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 5, Period: durationpb.New(time.Second)}}); err != nil {
		t.Fatal(err)
	}
	for i, st := range streams {
		deadline := time.Now().Add(5 * time.Second)
		for {
			v := recvWithin(t, "the rule", st, ViewHeartbeat+time.Second)
			if len(v.GetRules()) == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("stream %d: no view with the rule", i)
			}
		}
	}
}

// Past the cap a new stream is ResourceExhausted; a closed stream frees
// its place.
func TestWatchClusterViewCap(t *testing.T) {
	tn := newTestNode(t, func(c *Config) { c.MaxViewStreams = 2 })
	open := func() (pb.TokenService_WatchClusterViewClient, context.CancelFunc, error) {
		sctx, cancel := context.WithCancel(ctx(t))
		st, err := tn.token.WatchClusterView(sctx, &pb.GetClusterViewRequest{})
		if err != nil {
			cancel()
			return nil, nil, err
		}
		_, err = st.Recv()
		return st, cancel, err
	}
	_, c1, err := open()
	if err != nil {
		t.Fatal(err)
	}
	_, c2, err := open()
	if err != nil {
		t.Fatal(err)
	}
	defer c2()
	if _, _, err := open(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("third stream with a cap of 2: %v, want ResourceExhausted", err)
	}
	c1()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, c3, err := open()
		if err == nil {
			c3()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a stream after one closed: %v", err)
		}
		time.Sleep(10 * time.Millisecond) // the server notices the cancel asynchronously
	}
}

// notReadyCluster is a Standalone that is not ready: no routing view, and
// (unless sole) two members in its Raft configuration.
type notReadyCluster struct {
	*Standalone
	sole bool
}

func (c *notReadyCluster) Ready() bool         { return false }
func (c *notReadyCluster) View() *cluster.View { return cluster.NewView(0, nil) }
func (c *notReadyCluster) Status() (Status, error) {
	st, err := c.Standalone.Status()
	if !c.sole {
		st.Members = append(st.Members, MemberStatus{ID: "node-2"})
	}
	return st, err
}

func isNotReady(err error) bool {
	for _, d := range status.Convert(err).Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.GetReason() == NotReadyReason {
			return status.Code(err) == codes.Unavailable
		}
	}
	return false
}

// A node without a routing view answers Unavailable marked NOT_READY (the
// SDK retries, it does not fall back), unless it is the only member, caught
// up and leading: then it decides (a single fresh node decides from its
// first rule write on). A rule missing from a node that is not ready is
// NOT_READY, not NotFound: its log may not be replayed yet.
func TestNotReadyNode(t *testing.T) {
	for _, sole := range []bool{false, true} {
		store := inmem(t, 0)
		if _, err := store.Put(context.Background(), &rule.Rule{Name: "r", Algorithm: bucket.TokenBucket, Limit: 5, Period: time.Second}, nil); err != nil {
			t.Fatal(err)
		}
		nr := &notReadyCluster{Standalone: NewStandalone("node-1", "x", store), sole: sole}
		n, err := New(DefaultConfig(), Deps{Data: nr, Control: nr})
		if err != nil {
			t.Fatal(err)
		}
		s := &tokenService{n: n}
		_, err = s.AcquireToken(context.Background(), &pb.AcquireTokenRequest{Rule: "r", Key: "k"})
		if sole && err != nil {
			t.Fatalf("sole member without a view: %v, want a decision", err)
		}
		if !sole && !isNotReady(err) {
			t.Fatalf("no view, two members: %v, want Unavailable NOT_READY", err)
		}
		resp, err := s.AcquireTokens(context.Background(), &pb.AcquireTokensRequest{Requests: []*pb.AcquireTokenRequest{{Rule: "r", Key: "k"}, {Rule: "nope", Key: "k"}}})
		switch {
		case !sole && !isNotReady(err):
			t.Fatalf("batch, no view, two members: %v, want Unavailable NOT_READY", err)
		case sole && err != nil:
			t.Fatalf("batch, sole member: %v", err)
		case sole && (resp.GetResults()[0].GetResponse() == nil || !isNotReady(status.ErrorProto(resp.GetResults()[1].GetStatus()))):
			t.Fatalf("batch, sole member: %v; want a decision, then NOT_READY for a rule the node may not have replayed yet", resp)
		}
		n.Stop()
	}
}

// replayingNode is a Standalone still replaying its Raft log after a
// start: its view (one of the past) names it, but it has not caught up.
type replayingNode struct {
	*Standalone
	view *cluster.View
}

func (r *replayingNode) CaughtUp() bool      { return false }
func (r *replayingNode) Ready() bool         { return false }
func (r *replayingNode) View() *cluster.View { return r.view }

// Status lists both members of its view: it is not a sole member.
func (r *replayingNode) Status() (Status, error) {
	st, err := r.Standalone.Status()
	st.Members = append(st.Members, MemberStatus{ID: "node-2"})
	return st, err
}

// Regression (a trace of the rolling restart test: a restarted node
// forwarded a batch routed by the view of epoch 4 while the cluster was at
// epoch 20): a node still replaying its log routed callers' calls by the
// views it replayed, deciding keys of a past view on fresh buckets or
// sending them to members that no longer own them. Until it has caught up
// it answers a caller NOT_READY (the members do not route to it before it
// rejoins the view); a forwarded call is still answered.
func TestReplayingNodeRefusesCallers(t *testing.T) {
	store := inmem(t, 0)
	if _, err := store.Put(context.Background(), &rule.Rule{Name: "r", Algorithm: bucket.TokenBucket, Limit: 5, Period: time.Second}, nil); err != nil {
		t.Fatal(err)
	}
	past := cluster.NewView(4, []cluster.Member{{ID: "node-1", GRPCAddr: "x"}, {ID: "node-2", GRPCAddr: "127.0.0.1:1"}})
	r := &replayingNode{Standalone: NewStandalone("node-1", "x", store), view: past}
	n, err := New(DefaultConfig(), Deps{Data: r, Control: r})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Stop()
	s := &tokenService{n: n}
	mine, theirs := keyOf(t, past, "node-1"), keyOf(t, past, "node-2")
	for _, tc := range []struct {
		name string
		call func(context.Context) error
	}{
		{"acquire of its own key", func(ctx context.Context) error {
			_, err := s.AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: "r", Key: mine})
			return err
		}},
		{"acquire of another member's key", func(ctx context.Context) error {
			_, err := s.AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: "r", Key: theirs})
			return err
		}},
		{"batch", func(ctx context.Context) error {
			_, err := s.AcquireTokens(ctx, &pb.AcquireTokensRequest{Requests: []*pb.AcquireTokenRequest{{Rule: "r", Key: mine}, {Rule: "r", Key: theirs}}})
			return err
		}},
		{"refill", func(ctx context.Context) error {
			_, err := s.RefillToken(ctx, &pb.RefillTokenRequest{Rule: "r", Key: mine, GrantId: "g"})
			return err
		}},
	} {
		if err := tc.call(context.Background()); !isNotReady(err) {
			t.Errorf("%s on a node replaying its log: %v, want Unavailable NOT_READY", tc.name, err)
		}
	}
	if n.buckets.Live() != 0 {
		t.Fatalf("%d buckets made by calls refused", n.buckets.Live())
	}
	fwd := metadata.NewIncomingContext(context.Background(), metadata.Pairs(ForwardedHeader, "4"))
	if resp, err := s.AcquireToken(fwd, &pb.AcquireTokenRequest{Rule: "r", Key: mine}); err != nil || !resp.GetAllowed() {
		t.Fatalf("forwarded acquire on a node replaying its log: %v, %v; want it answered", resp, err)
	}
}
