package server

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// BenchmarkDurableAcquire is one AcquireToken over an in-memory gRPC
// connection on a rule that is not durable and on a durable one (its
// bucket marked for replication, a copy looked up before the decision):
// the difference is what replication costs the decision path.
func BenchmarkDurableAcquire(b *testing.B) {
	for _, durable := range []bool{false, true} {
		b.Run(fmt.Sprintf("durable=%v", durable), func(b *testing.B) {
			tn := newTestNode(b, nil)
			tn.put(b, &pb.Rule{Name: "bench", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 1 << 40, Period: durationpb.New(time.Hour), Durable: durable})
			keys := make([]string, 10000)
			for i := range keys {
				keys[i] = fmt.Sprint("user-", i)
			}
			i := 0
			start := cpuNanos()
			runParallel(b, func(ctx context.Context) error {
				i++
				_, err := tn.token.AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: "bench", Key: keys[i%len(keys)]})
				return err
			})
			reportCPU(b, start)
		})
	}
}
