package server

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tokenserver/tokenserver/internal/cluster"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// memberStub is another member: a gRPC server on 127.0.0.1 with a member
// health status and, optionally, a TokenService.
func memberStub(t *testing.T, serving healthpb.HealthCheckResponse_ServingStatus, tokens pb.TokenServiceServer) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	hs := health.NewServer()
	hs.SetServingStatus(MemberHealthService, serving)
	healthpb.RegisterHealthServer(gs, hs)
	if tokens != nil {
		pb.RegisterTokenServiceServer(gs, tokens)
	}
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	return lis.Addr().String()
}

// recordingOwner allows every call and records the metadata of the last.
type recordingOwner struct {
	pb.UnimplementedTokenServiceServer
	mu sync.Mutex
	md metadata.MD
}

func (r *recordingOwner) AcquireToken(ctx context.Context, _ *pb.AcquireTokenRequest) (*pb.AcquireTokenResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	r.mu.Lock()
	r.md = md
	r.mu.Unlock()
	return &pb.AcquireTokenResponse{Allowed: true, Granted: 1}, nil
}

// withView is a Standalone with a fixed routing view.
type withView struct {
	*Standalone
	view *cluster.View
}

func (w *withView) View() *cluster.View { return w.view }

// TestIssue20Item17_HealthyOwnersKeysNeverMove: after a partition heals, a
// node whose connection to a healthy owner is still broken fails over that
// owner's keys; the next owner must not decide them from a fresh bucket.
// The failover names the owner it could not reach (AvoidHeader), and the
// next owner decides such a key only when its own health check finds the
// owner down. A plain forward routed by the same view is still served
// where it lands (one routed by an older view: TestStrayCallGoesToTheOwner).
func TestIssue20Item17_HealthyOwnersKeysNeverMove(t *testing.T) {
	t.Run("next owner refuses a healthy owner's keys", func(t *testing.T) {
		for _, tc := range []struct {
			name    string
			owner   healthpb.HealthCheckResponse_ServingStatus
			avoid   bool
			decided bool
		}{
			{"owner healthy, named unreachable", healthpb.HealthCheckResponse_SERVING, true, false},
			{"owner down, named unreachable", healthpb.HealthCheckResponse_NOT_SERVING, true, true},
			{"owner healthy, plain forward", healthpb.HealthCheckResponse_SERVING, false, true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				addr := memberStub(t, tc.owner, nil)
				var w *withView
				tn := newTestNodeWith(t, func(s *Standalone) DataPlane {
					w = &withView{Standalone: s, view: cluster.NewView(2, []cluster.Member{{ID: "node-1", GRPCAddr: "bufnet"}, {ID: "owner", GRPCAddr: addr}})}
					return w
				})
				tn.put(t, tokenBucket("r", 1))
				key := keyOf(t, w.view, "owner")
				md := []string{ForwardedHeader, "2"} // routed by the view node-1 holds
				if tc.avoid {
					md = append(md, AvoidHeader, "owner")
				}
				c, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx(t), md...), 2*time.Second)
				defer cancel()
				resp, err := tn.token.AcquireToken(c, &pb.AcquireTokenRequest{Rule: "r", Key: key})
				switch {
				case tc.decided && (err != nil || !resp.GetAllowed()):
					t.Fatalf("want decided here: %v, %v", resp, err)
				case !tc.decided && status.Code(err) != codes.Unavailable:
					t.Fatalf("want Unavailable, got %v, %v", resp, err)
				case !tc.decided && tn.node.buckets.Live() != 0:
					t.Fatalf("a bucket was made for the healthy owner's key")
				case !tc.decided && !strings.Contains(err.Error(), "health check"):
					t.Fatalf("error does not say why: %v", err)
				}
			})
		}
	})

	t.Run("failover names the owner it could not reach", func(t *testing.T) {
		frozen := memberStub(t, healthpb.HealthCheckResponse_SERVING, frozenOwner{})
		next := &recordingOwner{}
		nextAddr := memberStub(t, healthpb.HealthCheckResponse_SERVING, next)
		var w *withView
		tn := newTestNodeWith(t, func(s *Standalone) DataPlane {
			w = &withView{Standalone: s, view: cluster.NewView(2, []cluster.Member{
				{ID: "node-1", GRPCAddr: "bufnet"}, {ID: "frozen", GRPCAddr: frozen}, {ID: "next", GRPCAddr: nextAddr}})}
			return w
		})
		tn.put(t, tokenBucket("r", 1))
		var key string
		for i := 0; key == ""; i++ {
			k := fmt.Sprint("k", i)
			o, _ := w.view.Owner(k)
			n, _ := w.view.OwnerExcept(cluster.KeyHash(k), func(id string) bool { return id == "frozen" })
			if o.ID == "frozen" && n.ID == "next" {
				key = k
			}
		}
		c, cancel := context.WithTimeout(ctx(t), time.Second)
		defer cancel()
		if resp, err := tn.token.AcquireToken(c, &pb.AcquireTokenRequest{Rule: "r", Key: key}); err != nil || !resp.GetAllowed() {
			t.Fatalf("failover: %v, %v", resp, err)
		}
		next.mu.Lock()
		defer next.mu.Unlock()
		if got := next.md.Get(AvoidHeader); len(got) != 1 || got[0] != "frozen" || len(next.md.Get(ForwardedHeader)) == 0 {
			t.Fatalf("the next owner got %s=%q, %s=%q; want the unreachable owner named", AvoidHeader, got, ForwardedHeader, next.md.Get(ForwardedHeader))
		}
	})

	t.Run("this node as next owner keeps a healthy owner's keys", func(t *testing.T) {
		// The owner takes calls and never answers them, yet answers its
		// health check: this node is its next owner and must not decide.
		frozen := memberStub(t, healthpb.HealthCheckResponse_SERVING, frozenOwner{})
		var w *withView
		tn := newTestNodeWith(t, func(s *Standalone) DataPlane {
			w = &withView{Standalone: s, view: cluster.NewView(2, []cluster.Member{{ID: "node-1", GRPCAddr: "bufnet"}, {ID: "frozen", GRPCAddr: frozen}})}
			return w
		})
		tn.put(t, tokenBucket("r", 1))
		c, cancel := context.WithTimeout(ctx(t), time.Second)
		defer cancel()
		_, err := tn.token.AcquireToken(c, &pb.AcquireTokenRequest{Rule: "r", Key: keyOf(t, w.view, "frozen")})
		if status.Code(err) != codes.Unavailable || tn.node.buckets.Live() != 0 {
			t.Fatalf("want Unavailable and no bucket, got %v (%d buckets)", err, tn.node.buckets.Live())
		}
	})
}

// keyOf returns a key that member id owns in v.
func keyOf(t *testing.T, v *cluster.View, id string) string {
	t.Helper()
	for i := range 10000 {
		k := fmt.Sprint("k", i)
		if o, _ := v.Owner(k); o.ID == id {
			return k
		}
	}
	t.Fatalf("no key of %s", id)
	return ""
}
