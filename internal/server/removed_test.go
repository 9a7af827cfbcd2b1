package server

import (
	"strings"
	"testing"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// removedData is a node's data plane after its removal from the cluster
// (raftfsm.Node.Removed).
type removedData struct{ *Standalone }

func (removedData) Removed() bool { return true }

// TestIssue20Item23_RemovedNodeRefusesDataPlane: a node removed from the
// cluster refuses every call that decides or changes a bucket at once,
// FailedPrecondition with a message that says what happened and what to
// do, and decides nothing; reading the view still works.
func TestIssue20Item23_RemovedNodeRefusesDataPlane(t *testing.T) {
	tn := newTestNodeWith(t, func(s *Standalone) DataPlane { return removedData{s} })
	tn.put(t, tokenBucket("r", 10))
	rls := rlpb.NewRateLimitServiceClient(tn.conn)
	for _, tc := range []struct {
		method string
		call   func() error
	}{
		{"AcquireToken", func() error {
			_, err := tn.token.AcquireToken(ctx(t), &pb.AcquireTokenRequest{Rule: "r", Key: "k"})
			return err
		}},
		{"AcquireTokens", func() error {
			_, err := tn.token.AcquireTokens(ctx(t), &pb.AcquireTokensRequest{Requests: []*pb.AcquireTokenRequest{{Rule: "r", Key: "k"}}})
			return err
		}},
		{"RefillToken", func() error {
			_, err := tn.token.RefillToken(ctx(t), &pb.RefillTokenRequest{Rule: "r", Key: "k", GrantId: "x", Permits: proto.Int64(1)})
			return err
		}},
		{"CommitToken", func() error {
			_, err := tn.token.CommitToken(ctx(t), &pb.CommitTokenRequest{Rule: "r", Key: "k", GrantId: "x", Used: 1})
			return err
		}},
		{"RenewLease", func() error {
			_, err := tn.token.RenewLease(ctx(t), &pb.RenewLeaseRequest{Rule: "r", Key: "k", GrantId: "x"})
			return err
		}},
		{"ShouldRateLimit", func() error {
			_, err := rls.ShouldRateLimit(ctx(t), &rlpb.RateLimitRequest{Domain: "d"})
			return err
		}},
	} {
		err := tc.call()
		if st := status.Convert(err); st.Code() != codes.FailedPrecondition || !strings.HasPrefix(st.Message(), "this node was removed from the cluster; ") {
			t.Errorf("%s on a removed node: %v, want FailedPrecondition \"this node was removed from the cluster; ...\"", tc.method, err)
		}
	}
	if n := tn.node.buckets.Live(); n != 0 {
		t.Errorf("a removed node made %d buckets", n)
	}
	if _, err := tn.token.GetClusterView(ctx(t), &pb.GetClusterViewRequest{}); err != nil {
		t.Errorf("GetClusterView on a removed node: %v", err)
	}
}
