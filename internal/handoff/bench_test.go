package handoff

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/cluster"
)

// BenchmarkHandoff100k hands 100,000 used buckets of a 100-per-day fixed
// window rule from one node to another over a loopback gRPC stream:
// export and freeze, send in batches, install. It reports the bytes on
// the wire per 100k buckets; ns/op is the handoff time.
func BenchmarkHandoff100k(b *testing.B) {
	const n = 100_000
	tbl, c := rules(b)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("user-%d", i)
	}
	b.ReportAllocs()
	var bytes int64
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		a, z := newNode(b, "a", tbl, 1e15, true), newNode(b, "z", tbl, 2e12, true)
		for _, k := range keys {
			if _, err := a.l.Buckets.Acquire(c, k, bucket.Request{Permits: 7}, a.l.Now()); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
		sent, by, err := Send(context.Background(), a.l, func(string, string) (cluster.Member, bool) {
			return cluster.Member{ID: "z", GRPCAddr: z.addr}, true
		}, dial(b), time.Millisecond)
		if err != nil || sent != n {
			b.Fatalf("sent %d of %d: %v", sent, n, err)
		}
		bytes = by
		b.StopTimer()
		if !z.l.Buckets.Has("q", keys[n-1]) {
			b.Fatal("the last bucket was not installed")
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(bytes), "bytes/100k-buckets")
	b.ReportMetric(float64(bytes)/n, "bytes/bucket")
}
