package rule

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
)

// BenchmarkPut is the cost of one rule write (validate, store, publish a new
// table) with 10 and with 10,000 rules in the store, each with 100
// overrides: a write compiles only the rule it changes.
func BenchmarkPut(b *testing.B) {
	for _, n := range []int{10, 10_000} {
		b.Run(fmt.Sprintf("rules=%d", n), func(b *testing.B) {
			s := NewMemStore()
			ctx := context.Background()
			mk := func(i int) *Rule {
				r := &Rule{Name: fmt.Sprintf("rule-%05d", i), Algorithm: bucket.TokenBucket, Limit: 10, Period: time.Second}
				for j := range 100 {
					r.Overrides = append(r.Overrides, Override{Key: fmt.Sprint("vip-", j), Limit: 20})
				}
				return r
			}
			for i := range n {
				if _, err := s.Put(ctx, mk(i), nil); err != nil {
					b.Fatal(err)
				}
			}
			r := mk(n / 2)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				r.Limit = int64(10 + i%2)
				if _, err := s.Put(ctx, r, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
