package envoyrls

import (
	"context"
	"fmt"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkShouldRateLimit measures the Service alone (matching, key
// building, metrics and the answer) over the in-memory decider, with one
// and ten descriptors of one configured key, as the server's
// BenchmarkEnvoyRLS sends them.
func BenchmarkShouldRateLimit(b *testing.B) {
	d, err := ParseDomain("bench.yaml", []byte("domain: bench\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 4000000000}\n"), Meta{})
	if err != nil {
		b.Fatal(err)
	}
	c, err := NewConfig(d)
	if err != nil {
		b.Fatal(err)
	}
	m, err := NewMetrics(prometheus.NewRegistry(), 0)
	if err != nil {
		b.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	s := NewService(func() *Config { return c }, NewMemDecider(), Options{Metrics: m, Now: func() time.Time { return now }})
	for _, n := range []int{1, 10} {
		b.Run(fmt.Sprint("descriptors=", n), func(b *testing.B) {
			reqs := make([]*rlpb.RateLimitRequest, 1000)
			for i := range reqs {
				reqs[i] = &rlpb.RateLimitRequest{Domain: "bench"}
				for j := 0; j < n; j++ {
					reqs[i].Descriptors = append(reqs[i].Descriptors, &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
						{Key: "remote_address", Value: fmt.Sprintf("10.%d.%d.%d", j, i/256, i%256)}}})
				}
			}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				resp, err := s.ShouldRateLimit(ctx, reqs[i%len(reqs)])
				if err != nil || resp.GetOverallCode() != rlpb.RateLimitResponse_OK {
					b.Fatalf("answer %v, %v", resp, err)
				}
			}
		})
	}
}
