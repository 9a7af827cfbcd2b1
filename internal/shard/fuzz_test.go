package shard

import (
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// FuzzAcquire is the data plane's request validation: for any rule that
// validates and any request, CheckRequest refuses or the decision stays
// within the rule: granted never above what was asked or the capacity,
// remaining never negative nor above capacity.
func FuzzAcquire(f *testing.F) {
	f.Add(uint8(1), int64(10), int64(time.Second), int64(0), int64(1), false, int64(0), int64(100*sec))
	f.Add(uint8(2), int64(3), int64(time.Second), int64(5), int64(5), true, int64(time.Second), int64(-1))
	f.Add(uint8(5), int64(1), int64(1), int64(0), int64(-1), true, int64(-5), int64(1<<62))
	f.Add(uint8(4), int64(1<<53), int64(bucket.MaxDuration), int64(0), int64(1<<53), true, int64(bucket.MaxDuration), int64(0))
	f.Fuzz(func(t *testing.T, alg uint8, limit, period, burst, permits int64, partial bool, maxWait, now int64) {
		r := &rule.Rule{Name: "r", Algorithm: bucket.Algorithm(alg), Limit: limit, Period: time.Duration(period), Burst: burst, Penalty: time.Second}
		if r.Validate() != nil {
			return
		}
		c := rule.Compile(r)
		m := New(Config{MaxBytes: 1 << 20})
		req := bucket.Request{Permits: permits, Partial: partial, MaxWait: maxWait}
		capacity := c.Config.Capacity()
		for i := range 3 {
			d, err := m.Acquire(c, "k", req, now+int64(i))
			if err != nil {
				if CheckRequest(&c.Config, req) == nil {
					t.Fatalf("valid request %+v refused: %v", req, err)
				}
				return
			}
			if d.Granted < 0 || d.Granted > max(permits, 0) || d.Granted > capacity || d.Remaining < 0 || d.Remaining > capacity || d.RetryAfter < 0 {
				t.Fatalf("request %+v on %+v: %+v", req, c.Config, d.Result)
			}
		}
	})
}
