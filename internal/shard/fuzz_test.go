package shard

import (
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// FuzzParseGrant: the grant id parser never panics, what it accepts
// encodes back to the same id, and no id a client makes up gives anything
// back or renews a lease.
func FuzzParseGrant(f *testing.F) {
	_, get := store(f, tb("api", 10), &rule.Rule{Name: "c", Algorithm: bucket.Concurrency, Limit: 3, Period: time.Minute})
	m := New(Config{})
	d, err := m.Acquire(get("api"), "k", bucket.Request{Permits: 3}, 100*sec)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(d.Grant.String())
	f.Add("")
	f.Add("AQAAABeEEbIBAAAAF4QRsgAAAAAAAAAAASnhWZCpg06R")
	f.Add(string(make([]byte, GrantIDLen)))
	real := d.Grant.String()
	f.Fuzz(func(t *testing.T, id string) {
		g, err := ParseGrant(id)
		if err != nil {
			return
		}
		if back := g.String(); back != id && !g.IsZero() {
			t.Fatalf("ParseGrant(%q) encodes back as %q", id, back)
		}
		if id == real {
			return
		}
		if n, _, err := m.Refill(get("api"), "k", id, -1, 100*sec); err != nil || n != 0 {
			t.Fatalf("made-up id %q refilled %d (%v)", id, n, err)
		}
		if ok, _ := m.Renew(get("c"), "k", id, 100*sec); ok {
			t.Fatalf("made-up id %q renewed a lease", id)
		}
	})
}

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
		c := rule.Compile(r, nil)
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
