package server_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokenserver/tokenserver/internal/testcluster"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// BenchmarkPutRuleRules is PutRule through a real one-node Raft cluster
// (log, FSM, table) with 10 and with 10,000 rules stored: p50 and p99 of
// 200 writes of one rule. Run with -benchtime 1x; filling 10,000 rules
// takes a while.
func BenchmarkPutRuleRules(b *testing.B) {
	for _, n := range []int{10, 10_000} {
		b.Run(fmt.Sprintf("rules=%d", n), func(b *testing.B) {
			c := testcluster.New(b, 1)
			admin := c.Leader().Admin()
			ctx := context.Background()
			rule := func(i int, limit int64) *pb.Rule {
				return &pb.Rule{Name: fmt.Sprintf("rule-%05d", i), Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: limit, Period: durationpb.New(time.Second)}
			}
			var wg sync.WaitGroup
			for w := range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := w; i < n; i += 16 {
						if _, err := admin.PutRule(ctx, &pb.PutRuleRequest{Rule: rule(i, 10)}); err != nil {
							b.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				var lat []time.Duration
				for j := range 200 {
					start := time.Now()
					if _, err := admin.PutRule(ctx, &pb.PutRuleRequest{Rule: rule(n/2, int64(11+j%2))}); err != nil {
						b.Fatal(err)
					}
					lat = append(lat, time.Since(start))
				}
				slices.Sort(lat)
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
			}
		})
	}
}
