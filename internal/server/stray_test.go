package server

import (
	"context"
	"sync"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/cluster"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// countingOwner is a key's owner that allows every acquire and gives
// back every refill, counting the calls and keeping the ForwardedHeader
// of the last.
type countingOwner struct {
	pb.UnimplementedTokenServiceServer
	mu                sync.Mutex
	acquires, refills int
	fwd               []string
}

func (o *countingOwner) AcquireToken(ctx context.Context, _ *pb.AcquireTokenRequest) (*pb.AcquireTokenResponse, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.acquires++
	o.fwd = metadata.ValueFromIncomingContext(ctx, ForwardedHeader)
	return &pb.AcquireTokenResponse{Allowed: true, Granted: 1, Remaining: 7}, nil
}

func (o *countingOwner) RefillToken(ctx context.Context, _ *pb.RefillTokenRequest) (*pb.RefillTokenResponse, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.refills++
	o.fwd = metadata.ValueFromIncomingContext(ctx, ForwardedHeader)
	return &pb.RefillTokenResponse{Refilled: 1}, nil
}

// Regression (the handoff tests: an SDK key started fresh on two nodes
// while a member joined; a key admitted 110 of 100 a day): a call routed
// by a view older than the node it lands on, for a key that node holds no
// bucket of and whose owner in its view is another member, was decided
// there on a fresh bucket: beside the key's state on its new owner, after
// this node had handed its bucket over and dropped it (or, for a new key,
// beside the fresh bucket the owner starts). Such a call now goes to the
// owner in the newer view, once per newer view; a call routed by the same
// view, a key whose bucket this node holds, and a decision as the key's
// next owner stay here.
func TestStrayCallGoesToTheOwner(t *testing.T) {
	for _, tc := range []struct {
		name string
		// fwd is the ForwardedHeader's value ("" for a call this node
		// routed itself, by the view of epoch routed); avoid names the
		// owner in the AvoidHeader (a failover of it).
		fwd    string
		routed uint64
		avoid  bool
		held   bool
		down   bool
		sentOn bool
	}{
		{name: "forwarded by an older view", fwd: "1", sentOn: true},
		{name: "forwarded by this view", fwd: "2"},
		{name: "forwarded by a newer view", fwd: "3"},
		{name: "forwarded by an older view, bucket held here", fwd: "1", held: true},
		{name: "forwarded by an older view for an owner found down", fwd: "1", avoid: true, down: true},
		{name: "batch item routed here by an older view", routed: 1, sentOn: true},
		{name: "batch item routed here by this view", routed: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			owner := &countingOwner{}
			serving := healthpb.HealthCheckResponse_SERVING
			if tc.down {
				serving = healthpb.HealthCheckResponse_NOT_SERVING
			}
			addr := memberStub(t, serving, owner)
			var w *withView
			tn := newTestNodeWith(t, func(s *Standalone) DataPlane {
				w = &withView{Standalone: s, view: cluster.NewView(2, []cluster.Member{{ID: "node-1", GRPCAddr: "bufnet"}, {ID: "owner", GRPCAddr: addr}})}
				return w
			})
			tn.put(t, tokenBucket("r", 8))
			n := tn.node
			key := keyOf(t, w.view, "owner")
			if tc.held {
				if _, err := n.buckets.Acquire(n.data.Table().Get("r"), key, bucket.Request{Permits: 1}, n.now()); err != nil {
					t.Fatal(err)
				}
			}
			c, cancel := context.WithTimeout(ctx(t), 2*time.Second)
			defer cancel()
			var md []string
			if tc.fwd != "" {
				md = append(md, ForwardedHeader, tc.fwd)
			}
			if tc.avoid {
				md = append(md, AvoidHeader, "owner")
			}
			in := metadata.NewIncomingContext(c, metadata.Pairs(md...))
			before := n.buckets.Live()
			var resp pb.AcquireTokenResponse
			routed := tc.routed
			if routed == 0 {
				routed = w.view.Epoch
			}
			g, err := n.decide(in, n.data.Table(), routed, &pb.AcquireTokenRequest{Rule: "r", Key: key}, &resp)
			if err != nil || !resp.GetAllowed() {
				t.Fatalf("acquire: %v, %v", &resp, err)
			}
			owner.mu.Lock()
			acquires, fwd := owner.acquires, owner.fwd
			owner.mu.Unlock()
			if got := acquires == 1; got != tc.sentOn {
				t.Fatalf("sent on to the owner: %v, want %v", got, tc.sentOn)
			}
			if tc.sentOn {
				if !g.IsZero() || resp.GetRemaining() != 7 || n.buckets.Live() != before {
					t.Fatalf("sent on, but decided here too: grant %v, %v, buckets %d -> %d", g, &resp, before, n.buckets.Live())
				}
				if len(fwd) != 1 || fwd[0] != "2" {
					t.Fatalf("the owner got ForwardedHeader %q, want the epoch of the view that sent it on (2)", fwd)
				}
				// A settlement forwarded by the same older view goes the
				// same way (a release of a lease the owner holds).
				if tc.fwd != "" {
					out := metadata.AppendToOutgoingContext(c, md...)
					r, err := tn.token.RefillToken(out, &pb.RefillTokenRequest{Rule: "r", Key: key, GrantId: "the owner's grant"})
					owner.mu.Lock()
					refills := owner.refills
					owner.mu.Unlock()
					if err != nil || r.GetRefilled() != 1 || refills != 1 {
						t.Fatalf("refill: %v, %v (owner refills %d), want it given back on the owner", r, err, refills)
					}
				}
				return
			}
			if g.IsZero() {
				t.Fatalf("not decided here: %v", &resp)
			}
		})
	}
}
