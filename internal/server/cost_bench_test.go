package server

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// BenchmarkCost is the cost path through gRPC, interleaved: an acquire
// under the rule's limit (rule) against one carrying its own limit
// (inline, within 10%), and a 2-permit grant settled by RefillToken of 1
// (refill) against CommitToken at 1 (commit, which must cost no more),
// the acquire included in both. Keys have buckets. allocs/op is for the
// four together.
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
	must := func(err error) {
		if err != nil {
			b.Fatal(err)
		}
	}
	one := int64(1)
	interleave(b, []string{"rule", "inline", "refill", "commit"}, []func(i int){
		func(i int) { must(acquire(nil)(ctx, keys[i%len(keys)])) },
		func(i int) { must(acquire(limit)(ctx, keys[i%len(keys)])) },
		func(i int) {
			k := keys[i%len(keys)]
			a, err := tn.token.AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: "bench", Key: k, Permits: &two})
			must(err)
			_, err = tn.token.RefillToken(ctx, &pb.RefillTokenRequest{Rule: "bench", Key: k, GrantId: a.GetGrantId(), Permits: &one})
			must(err)
		},
		func(i int) {
			k := keys[i%len(keys)]
			a, err := tn.token.AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: "bench", Key: k, Permits: &two})
			must(err)
			_, err = tn.token.CommitToken(ctx, &pb.CommitTokenRequest{Rule: "bench", Key: k, GrantId: a.GetGrantId(), Used: 1})
			must(err)
		},
	})
}

// interleave runs the variants in turns of 16 operations each until every
// one ran b.N times, and reports each one's median ns per operation over
// its turns (as internal/shard's BenchmarkDecisionCosts): on a loaded
// machine the variants then see the same load. ns/op is reported as 0.
func interleave(b *testing.B, names []string, ops []func(i int)) {
	const turn = 16
	per := make([][]float64, len(ops))
	b.ReportAllocs()
	b.ResetTimer()
	for done := 0; done < b.N; done += turn {
		n := min(turn, b.N-done)
		for v, op := range ops {
			start := time.Now()
			for i := range n {
				op(done + i)
			}
			per[v] = append(per[v], float64(time.Since(start).Nanoseconds())/float64(n))
		}
	}
	b.StopTimer()
	for v, name := range names {
		slices.Sort(per[v])
		b.ReportMetric(per[v][len(per[v])/2], "ns/"+name)
	}
	b.ReportMetric(0, "ns/op")
}
