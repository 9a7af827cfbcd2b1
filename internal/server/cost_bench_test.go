package server

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// BenchmarkCost is the cost path through gRPC (an in-memory connection):
// an acquire under the rule's limit against one carrying its own limit
// (within 10%), and a grant settled by CommitToken against one given
// back by RefillToken (a commit must cost no more). Keys have buckets.
func BenchmarkCost(b *testing.B) {
	tn := newTestNode(b, nil)
	tn.put(b, &pb.Rule{Name: "bench", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 1 << 40, Period: durationpb.New(time.Hour),
		Inline: &pb.InlinePolicy{MaxLimit: 1 << 41, MaxPeriod: durationpb.New(time.Hour)}})
	keys := make([]string, 10000)
	for i := range keys {
		keys[i] = fmt.Sprint("user-", i)
	}
	limit := &pb.InlineLimit{Limit: 1 << 40, PeriodNs: int64(time.Hour)}
	two := int64(2)
	ctx := context.Background()
	for _, k := range keys {
		for _, l := range []*pb.InlineLimit{nil, limit} {
			if _, err := tn.token.AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: "bench", Key: k, Limit: l}); err != nil {
				b.Fatal(err)
			}
		}
	}
	acquire := func(l *pb.InlineLimit) func(ctx context.Context, k string) error {
		return func(ctx context.Context, k string) error {
			_, err := tn.token.AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: "bench", Key: k, Limit: l})
			return err
		}
	}
	for _, bc := range []struct {
		name string
		call func(ctx context.Context, k string) error
	}{
		{"acquire/rule", acquire(nil)},
		{"acquire/inline", acquire(limit)},
		{"settle/refill", func(ctx context.Context, k string) error {
			a, err := tn.token.AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: "bench", Key: k, Permits: &two})
			if err == nil {
				one := int64(1)
				_, err = tn.token.RefillToken(ctx, &pb.RefillTokenRequest{Rule: "bench", Key: k, GrantId: a.GetGrantId(), Permits: &one})
			}
			return err
		}},
		{"settle/commit", func(ctx context.Context, k string) error {
			a, err := tn.token.AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: "bench", Key: k, Permits: &two})
			if err == nil {
				_, err = tn.token.CommitToken(ctx, &pb.CommitTokenRequest{Rule: "bench", Key: k, GrantId: a.GetGrantId(), Used: 1})
			}
			return err
		}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			i := 0
			runParallel(b, func(ctx context.Context) error {
				i++
				return bc.call(ctx, keys[i%len(keys)])
			})
		})
	}
}
