package shard

import (
	"strings"
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
)

func TestHitAndSweepIdle(t *testing.T) {
	sec := int64(time.Second)
	c := rule.Compile(&rule.Rule{Name: "envoy/fw/SECOND", Algorithm: bucket.FixedWindow, Limit: bucket.MaxLimit, Period: time.Second, Version: 1 << 62, Generation: 1})
	m := New(Config{})
	now := int64(1_700_000_000) * sec
	if r, err := m.Hit(c, "k", 0, now); err != nil || r.After != 0 || m.Live() != 0 {
		t.Fatalf("a read: %+v %v, live %d", r, err, m.Live())
	}
	for i := int64(1); i <= 5; i++ {
		r, err := m.Hit(c, "k", 2, now)
		if err != nil || r.Before != 2*(i-1) || r.After != 2*i {
			t.Fatalf("hit %d: %+v %v", i, r, err)
		}
	}
	// The rules' Sweep, on another clock, keeps it; SweepIdle on its own
	// clock drops it once its window has passed.
	m.Sweep(48*int64(time.Hour), rule.NewTable(1, nil, nil))
	if m.Live() != 1 {
		t.Fatalf("Sweep on the rules' clock dropped a live Envoy counter")
	}
	envoy := func(c *rule.Compiled) bool { return strings.HasPrefix(c.Rule.Name, "envoy/") }
	if n := m.SweepIdle(now, envoy); n != 0 {
		t.Fatalf("SweepIdle dropped %d live counters", n)
	}
	if r, _ := m.Hit(c, "k", 0, now+sec); r.After != 0 {
		t.Fatalf("next window: %+v", r)
	}
	if n := m.SweepIdle(now+sec, envoy); n != 1 || m.Live() != 0 {
		t.Fatalf("SweepIdle past the window dropped %d, live %d", n, m.Live())
	}
	tb := rule.Compile(&rule.Rule{Name: "tb", Algorithm: bucket.TokenBucket, Limit: 3, Period: time.Second})
	if _, err := m.Hit(tb, "k", 1, now); err == nil {
		t.Fatal("Hit on a token bucket")
	}
}
