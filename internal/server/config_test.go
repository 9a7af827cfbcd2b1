package server

import (
	"strings"
	"testing"
	"time"
)

// TestConfigValidate: each bad field is named in the error; the default
// configuration is valid.
func TestConfigValidate(t *testing.T) {
	def := DefaultConfig()
	if err := def.Validate(); err != nil {
		t.Fatalf("DefaultConfig: %v", err)
	}
	for _, tc := range []struct {
		field  string
		mutate func(*Config)
	}{
		{"GRPCAddr", func(c *Config) { c.GRPCAddr = "" }},
		{"GRPCAddr", func(c *Config) { c.GRPCAddr = "no-port" }},
		{"HTTPAddr", func(c *Config) { c.HTTPAddr = "no-port" }},
		{"MaxBuckets", func(c *Config) { c.MaxBuckets = -1 }},
		{"MaxBucketMemory", func(c *Config) { c.MaxBucketMemory = -1 }},
		{"MaxBucketMemory", func(c *Config) { c.MaxBucketMemory = 1 << 10 }},
		{"MaxRules", func(c *Config) { c.MaxRules = -1 }},
		{"Shards", func(c *Config) { c.Shards = 1<<16 + 1 }},
		{"MaxRecvMsgSize", func(c *Config) { c.MaxRecvMsgSize = 1 << 10 }},
		{"DefaultDeadline", func(c *Config) { c.DefaultDeadline = 0 }},
		{"SweepInterval", func(c *Config) { c.SweepInterval = 0 }},
		{"ShutdownGrace", func(c *Config) { c.ShutdownGrace = -time.Second }},
		{"MaxViewStreams", func(c *Config) { c.MaxViewStreams = -1 }},
		{"DrainLinger", func(c *Config) { c.DrainLinger = -time.Second }},
	} {
		c := DefaultConfig()
		tc.mutate(&c)
		err := c.Validate()
		if err == nil || !strings.HasPrefix(err.Error(), tc.field+" ") {
			t.Errorf("%s: Validate() = %v, want an error naming the field", tc.field, err)
		}
	}
}

// TestMaxViewStreamsDefault: a zero cap is DefaultMaxViewStreams.
func TestMaxViewStreamsDefault(t *testing.T) {
	for _, tc := range []struct{ set, want int }{{0, DefaultMaxViewStreams}, {2, 2}} {
		c := Config{MaxViewStreams: tc.set}
		if got := c.maxViewStreams(); got != tc.want {
			t.Errorf("MaxViewStreams %d: cap %d, want %d", tc.set, got, tc.want)
		}
	}
}

// TestRaftHooksCaughtUpNeverBlocks: the Raft node may call CaughtUp any
// number of times before the node reads it.
func TestRaftHooksCaughtUpNeverBlocks(t *testing.T) {
	h := NewRaftHooks()
	for range 3 {
		h.CaughtUp()
	}
	select {
	case <-h.caughtUp:
	default:
		t.Fatal("CaughtUp left no signal")
	}
}
