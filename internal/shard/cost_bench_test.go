package shard

import (
	"fmt"
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// benchKeys are 10k keys: a tenth of them with an exact runtime override
// (when the rule has overrides), a tenth under the prefix override
// "premium-", the rest under the rule's default.
func benchKeys() []string {
	keys := make([]string, 10_000)
	for i := range keys {
		switch i % 10 {
		case 0:
			keys[i] = fmt.Sprintf("tenant-%d", i)
		case 1:
			keys[i] = fmt.Sprintf("premium-%d", i)
		default:
			keys[i] = fmt.Sprintf("user-%d", i)
		}
	}
	return keys
}

// benchRule is a token bucket that does not run out within a benchmark,
// with an inline policy, and n runtime overrides (plus one prefix) when
// n > 0.
func benchRule(b *testing.B, n int) *rule.Compiled {
	r := tb("api", 1<<40)
	r.Period = time.Hour
	r.Inline = rule.InlinePolicy{MaxLimit: 1 << 41, MaxPeriod: time.Hour}
	c := compiled(b, r)
	if n > 0 {
		rt := &rule.Runtime{}
		for i := range n {
			rt.Put(rule.RuntimeOverride{Rule: "api", Key: fmt.Sprintf("tenant-%d", i), Limit: 1 << 40})
		}
		rt.Put(rule.RuntimeOverride{Rule: "api", Key: "premium-*", Limit: 1 << 40})
		c.Attach(rt)
	}
	return c
}

// BenchmarkAcquireOverrides: the decision path on 10k keys that have
// buckets, with no runtime overrides and with 100,000 (their difference
// is what the override lookup adds to a decision), and with a limit in
// the request instead of the rule's (within 10% of the rule's).
func BenchmarkAcquireOverrides(b *testing.B) {
	keys := benchKeys()
	for _, tc := range []struct {
		name      string
		overrides int
		inline    bool
	}{{"rule/overrides=0", 0, false}, {"rule/overrides=100000", 100_000, false}, {"inline/overrides=0", 0, true}} {
		b.Run(tc.name, func(b *testing.B) {
			c := benchRule(b, tc.overrides)
			m := New(Config{})
			l := rule.InlineLimit{Limit: 1 << 40, Period: time.Hour}
			acq := func(k string, now int64) error {
				var err error
				if tc.inline {
					_, err = m.AcquireInline(c, k, l, bucket.Request{Permits: 1}, now)
				} else {
					_, err = m.Acquire(c, k, bucket.Request{Permits: 1}, now)
				}
				return err
			}
			for _, k := range keys {
				if err := acq(k, sec); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				if err := acq(keys[i%len(keys)], 2*sec); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkCommitVsRefill: settling a grant by CommitToken (at its
// estimate less one) against giving it back by RefillToken (one permit):
// a commit must cost no more. Each iteration acquires a grant on one of
// 10k keys and settles it.
func BenchmarkCommitVsRefill(b *testing.B) {
	keys := benchKeys()
	for _, op := range []string{"refill", "commit", "acquire-only"} {
		b.Run(op, func(b *testing.B) {
			c := benchRule(b, 0)
			m := New(Config{})
			for _, k := range keys {
				if _, err := m.Acquire(c, k, bucket.Request{Permits: 1}, sec); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				k := keys[i%len(keys)]
				d, err := m.Acquire(c, k, bucket.Request{Permits: 2}, 2*sec)
				if err != nil {
					b.Fatal(err)
				}
				switch op {
				case "refill":
					_, _, err = m.Refill(c, k, d.Grant.String(), 1, 2*sec)
				case "commit":
					_, err = m.Commit(c, k, d.Grant.String(), 1, 2*sec)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
