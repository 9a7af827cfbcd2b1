package server

import (
	"context"
	"fmt"
	"math/rand"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// BenchmarkVisibility is BenchmarkUnary's acquire and BenchmarkBatch with
// the top-keys sketch and series on and off: the difference is their cost
// on the decision path, gRPC included; decide is the decision alone,
// without gRPC. Keys cycle over 10,000, so nearly every decision brings a
// key the sketch does not monitor (its worst case: an eviction and a key
// copy per window). Read cpu-ns/op on a shared machine.
func BenchmarkVisibility(b *testing.B) {
	keys := make([]string, 10000)
	for i := range keys {
		keys[i] = fmt.Sprint("user-", i)
	}
	// zipf is a Zipf(1.1) sequence over the same keys: a few hot keys the
	// sketch keeps, a long tail it does not.
	rng := rand.New(rand.NewSource(1))
	z := rand.NewZipf(rng, 1.1, 1, uint64(len(keys)-1))
	zipf := make([]string, 1<<16)
	for i := range zipf {
		zipf[i] = keys[z.Uint64()]
	}
	for _, on := range []bool{false, true} {
		mutate := func(c *Config) { c.Visibility = on }
		b.Run(fmt.Sprintf("batch100-zipf/visibility=%v", on), func(b *testing.B) {
			tn := newTestNode(b, mutate)
			tn.put(b, &pb.Rule{Name: "bench", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 1 << 40, Period: durationpb.New(time.Second)})
			req := &pb.AcquireTokensRequest{Requests: make([]*pb.AcquireTokenRequest, 100)}
			i := 0
			cpu := cpuNanos()
			runParallel(b, func(ctx context.Context) error {
				i++
				for j := range req.Requests {
					req.Requests[j] = &pb.AcquireTokenRequest{Rule: "bench", Key: zipf[(i*100+j)%len(zipf)]}
				}
				_, err := tn.token.AcquireTokens(ctx, req)
				return err
			})
			reportCPU(b, cpu)
		})
		b.Run(fmt.Sprintf("unary/visibility=%v", on), func(b *testing.B) {
			tn := newTestNode(b, mutate)
			tn.put(b, &pb.Rule{Name: "bench", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 1 << 40, Period: durationpb.New(time.Second)})
			i := 0
			cpu := cpuNanos()
			runParallel(b, func(ctx context.Context) error {
				i++
				_, err := tn.token.AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: "bench", Key: keys[i%len(keys)]})
				return err
			})
			reportCPU(b, cpu)
		})
		b.Run(fmt.Sprintf("batch100/visibility=%v", on), func(b *testing.B) {
			tn := newTestNode(b, mutate)
			tn.put(b, &pb.Rule{Name: "bench", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 1 << 40, Period: durationpb.New(time.Second)})
			req := &pb.AcquireTokensRequest{Requests: make([]*pb.AcquireTokenRequest, 100)}
			i := 0
			cpu := cpuNanos()
			runParallel(b, func(ctx context.Context) error {
				i++
				for j := range req.Requests {
					req.Requests[j] = &pb.AcquireTokenRequest{Rule: "bench", Key: keys[(i*100+j)%len(keys)]}
				}
				_, err := tn.token.AcquireTokens(ctx, req)
				return err
			})
			reportCPU(b, cpu)
		})
		b.Run(fmt.Sprintf("decide/visibility=%v", on), func(b *testing.B) {
			tn := newTestNode(b, mutate)
			tn.put(b, &pb.Rule{Name: "bench", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 1 << 40, Period: durationpb.New(time.Second)})
			n := tn.node
			t := n.data.Table()
			var resp pb.AcquireTokenResponse
			reqs := make([]*pb.AcquireTokenRequest, len(keys))
			for i := range reqs {
				reqs[i] = &pb.AcquireTokenRequest{Rule: "bench", Key: keys[i]}
			}
			b.ReportAllocs()
			b.ResetTimer()
			cpu := cpuNanos()
			for i := range b.N {
				if _, err := n.decide(context.Background(), t, 1, reqs[i%len(reqs)], &resp); err != nil {
					b.Fatal(err)
				}
			}
			reportCPU(b, cpu)
		})
	}
}
