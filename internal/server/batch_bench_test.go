package server

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// BenchmarkBatch is one AcquireTokens call of 100 items over an in-memory
// connection to one node, client and server together: what the SDK's
// coalescing sends.
func BenchmarkBatch(b *testing.B) {
	tn := newTestNode(b, nil)
	tn.put(b, &pb.Rule{Name: "bench", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 1 << 40, Period: durationpb.New(time.Second)})
	req := &pb.AcquireTokensRequest{Requests: make([]*pb.AcquireTokenRequest, 100)}
	for i := range req.Requests {
		req.Requests[i] = &pb.AcquireTokenRequest{Rule: "bench", Key: fmt.Sprint("user-", i)}
	}
	runParallel(b, func(ctx context.Context) error {
		resp, err := tn.token.AcquireTokens(ctx, req)
		if err == nil && len(resp.GetResults()) != len(req.Requests) {
			err = fmt.Errorf("%d results for %d items", len(resp.GetResults()), len(req.Requests))
		}
		return err
	})
}
