package rule

import (
	"fmt"
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
)

func runtimeRule(n int) *Compiled {
	r := &Rule{Name: "api", Algorithm: bucket.TokenBucket, Limit: 10, Period: time.Second, Version: 1, Generation: 1}
	c := Compile(r)
	if n > 0 {
		rt := &Runtime{}
		for i := range n {
			rt.Put(RuntimeOverride{Rule: "api", Key: fmt.Sprintf("tenant-%d", i), Limit: 5})
		}
		rt.Put(RuntimeOverride{Rule: "api", Key: "premium-*", Limit: 9})
		c.Attach(rt)
	}
	return c
}

// TestRuntimePrecedence: exact beats prefix, the longest prefix wins.
func TestRuntimePrecedence(t *testing.T) {
	c := runtimeRule(0)
	rt := &Runtime{}
	for _, o := range []RuntimeOverride{{Key: "a*", Limit: 1}, {Key: "ab*", Limit: 2}, {Key: "abc", Limit: 3}, {Key: "*", Limit: 4}} {
		rt.Put(o)
	}
	c.Attach(rt)
	for key, want := range map[string]int64{"abc": 3, "abd": 2, "ax": 1, "zzz": 4, "abcd": 2} {
		if got := c.ConfigFor(key).Limit; got != want {
			t.Errorf("%s: limit %d, want %d", key, got, want)
		}
	}
	rt.Delete("*")
	if got := c.ConfigFor("zzz").Limit; got != 10 {
		t.Errorf("after deleting *: %d, want the rule's 10", got)
	}
}

// BenchmarkConfigFor: the cost of the override lookup in a decision, with
// no runtime overrides and with 100,000 (plus one prefix).
func BenchmarkConfigFor(b *testing.B) {
	for _, n := range []int{0, 100_000} {
		c := runtimeRule(n)
		for _, key := range []string{"tenant-777", "premium-1", "nobody"} {
			b.Run(fmt.Sprintf("overrides=%d/%s", n, key), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					_ = c.ConfigFor(key)
				}
			})
		}
	}
}
