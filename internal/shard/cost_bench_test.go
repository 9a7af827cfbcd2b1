package shard

import (
	"fmt"
	"slices"
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

// interleave runs the variants in turns of 64 operations each until
// every one ran b.N times, and reports each one's median ns per operation
// over its turns: on a loaded machine, turns this short see the same
// load, and the median drops the turns a descheduling or a GC hit, so the
// variants compare where separate benchmarks, run minutes apart, would
// not. ns/op is not meaningful and is reported as 0.
func interleave(b *testing.B, names []string, ops []func(i int)) {
	const turn = 64
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

// BenchmarkDecisionCosts interleaves the decision path on 10k keys with
// buckets: under the rule with no runtime overrides (rule), with 100,000
// (overrides, the difference is what the lookup adds), and with a limit
// in the request (inline); and the settlement of a 2-permit grant by
// Refill of 1 (refill) against Commit at 1 (commit), the acquire
// included in both. allocs/op is for all five together.
func BenchmarkDecisionCosts(b *testing.B) {
	keys := benchKeys()
	c0, c100k, cs := benchRule(b, 0), benchRule(b, 100_000), benchRule(b, 0)
	m0, m100k, mi, ms := New(Config{}), New(Config{}), New(Config{}), New(Config{})
	l := rule.InlineLimit{Limit: 1 << 40, Period: time.Hour}
	for _, k := range keys {
		_, e1 := m0.Acquire(c0, k, bucket.Request{Permits: 1}, sec)
		_, e2 := m100k.Acquire(c100k, k, bucket.Request{Permits: 1}, sec)
		_, e3 := mi.AcquireInline(c0, k, l, bucket.Request{Permits: 1}, sec)
		_, e4 := ms.Acquire(cs, k, bucket.Request{Permits: 1}, sec)
		if e1 != nil || e2 != nil || e3 != nil || e4 != nil {
			b.Fatal(e1, e2, e3, e4)
		}
	}
	must := func(err error) {
		if err != nil {
			b.Fatal(err)
		}
	}
	settle := func(commit bool) func(i int) {
		return func(i int) {
			k := keys[i%len(keys)]
			d, err := ms.Acquire(cs, k, bucket.Request{Permits: 2}, 2*sec)
			must(err)
			if commit {
				_, err = ms.Commit(cs, k, d.Grant.String(), 1, 2*sec)
			} else {
				_, _, err = ms.Refill(cs, k, d.Grant.String(), 1, 2*sec)
			}
			must(err)
		}
	}
	interleave(b, []string{"rule", "overrides", "inline", "refill", "commit"}, []func(i int){
		func(i int) { _, err := m0.Acquire(c0, keys[i%len(keys)], bucket.Request{Permits: 1}, 2*sec); must(err) },
		func(i int) {
			_, err := m100k.Acquire(c100k, keys[i%len(keys)], bucket.Request{Permits: 1}, 2*sec)
			must(err)
		},
		func(i int) {
			_, err := mi.AcquireInline(c0, keys[i%len(keys)], l, bucket.Request{Permits: 1}, 2*sec)
			must(err)
		},
		settle(false),
		settle(true),
	})
}
