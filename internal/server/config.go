package server

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/tokenserver/tokenserver/internal/rule"
	"github.com/tokenserver/tokenserver/internal/topk"
)

// Config configures a Node. Start from DefaultConfig; Validate names the
// field of the first problem.
type Config struct {
	// GRPCAddr is where TokenService and AdminService listen (Listen).
	GRPCAddr string
	// HTTPAddr is where /metrics, /healthz and /readyz listen (Listen);
	// empty disables HTTP.
	HTTPAddr string
	// AdvertiseGRPC is the gRPC address other nodes and clients dial; empty
	// means the listen address.
	AdvertiseGRPC string
	// MaxBuckets caps live buckets on the node (0: no cap).
	MaxBuckets int64
	// MaxBucketMemory is the node's bucket memory budget in bytes (keys,
	// index entries and algorithm state, see shard.Config.MaxBytes); a new
	// key past it gets ResourceExhausted. 0 means DefaultBucketMemory().
	MaxBucketMemory int64
	// MaxRules caps the rules of the cluster (every node must use the same
	// value). 0 means rule.DefaultMaxRules.
	MaxRules int
	// Shards is the number of bucket index shards (0: shard.DefaultShards).
	Shards int
	// MaxRecvMsgSize is the largest request the server reads, in bytes.
	MaxRecvMsgSize int
	// DefaultDeadline bounds calls that carry no deadline.
	DefaultDeadline time.Duration
	// SweepInterval is how often idle buckets are evicted.
	SweepInterval time.Duration
	// ShutdownGrace bounds a graceful stop: leaving the view, the linger
	// and the calls in flight.
	ShutdownGrace time.Duration
	// MaxViewStreams caps the WatchClusterView streams the node serves at
	// once (0: DefaultMaxViewStreams).
	MaxViewStreams int
	// DrainLinger is how long a stopping node keeps answering after it
	// left the routing view, while clients hear of the new view.
	DrainLinger time.Duration
	// Pprof serves net/http/pprof under /debug/pprof/ on PprofAddr.
	Pprof bool
	// PprofAddr is the listen address of /debug/pprof/ (plain HTTP, its
	// own listener; keep it on loopback).
	PprofAddr string
	// Security is TLS and authentication; the zero value is plain TCP with
	// every call allowed.
	Security Security
	// Visibility keeps a top-keys sketch and a one-hour series per rule
	// with traffic (TopKeys, RuleSeries, the console; visibility.go has
	// the memory figures). DefaultConfig turns it on.
	Visibility bool
	// TopKeysCapacity is the keys each top-keys bucket monitors per side
	// (0: DefaultTopKeysCapacity; at most topk.MaxCapacity).
	TopKeysCapacity int
	// VisibilityMaxRules caps the rules with a sketch and a series on the
	// node (0: DefaultVisibilityMaxRules).
	VisibilityMaxRules int
	// TracerProvider, when set, gets an OpenTelemetry span per decision
	// call and rule write (tracing.go); nil turns tracing off.
	TracerProvider trace.TracerProvider
	// Logger receives the node's logs; nil means slog.Default().
	Logger *slog.Logger
	// Clock returns monotonic nanoseconds; nil means the process clock.
	// Tests pass a fake.
	Clock func() int64
}

// DefaultMaxViewStreams caps the WatchClusterView streams one node serves
// at once when Config.MaxViewStreams is 0; past it a new stream gets
// ResourceExhausted (the SDK then watches another member). Each idle
// stream costs a goroutine and one send per ViewHeartbeat.
const DefaultMaxViewStreams = 4096

// DefaultConfig returns the configuration of the no-flag single node.
func DefaultConfig() Config {
	return Config{
		GRPCAddr:        "127.0.0.1:7070",
		HTTPAddr:        "127.0.0.1:7072",
		PprofAddr:       "127.0.0.1:7073",
		MaxBucketMemory: DefaultBucketMemory(),
		MaxRules:        rule.DefaultMaxRules,
		MaxRecvMsgSize:  4 << 20,
		DefaultDeadline: 10 * time.Second,
		SweepInterval:   time.Second,
		ShutdownGrace:   5 * time.Second,
		DrainLinger:     time.Second,
		Visibility:      true,
	}
}

// Validate reports the first problem with c, naming the field, its bound
// and the value it got (as hashicorp/raft's ValidateConfig does).
func (c *Config) Validate() error {
	switch {
	case c.GRPCAddr == "":
		return errors.New("GRPCAddr is empty")
	case c.MaxBuckets < 0:
		return fmt.Errorf("MaxBuckets must be >= 0, got %d", c.MaxBuckets)
	case c.MaxBucketMemory < 0:
		return fmt.Errorf("MaxBucketMemory must be >= 0, got %d", c.MaxBucketMemory)
	case c.MaxBucketMemory > 0 && c.MaxBucketMemory < 1<<20:
		return fmt.Errorf("MaxBucketMemory must be at least 1 MiB, got %d bytes", c.MaxBucketMemory)
	case c.MaxRules < 0:
		return fmt.Errorf("MaxRules must be >= 0, got %d", c.MaxRules)
	case c.Shards < 0 || c.Shards > 1<<16:
		return fmt.Errorf("Shards must be between 0 and 65536, got %d", c.Shards)
	case c.MaxRecvMsgSize < 1<<16:
		return fmt.Errorf("MaxRecvMsgSize must be at least 64 KiB, got %d", c.MaxRecvMsgSize)
	case c.DefaultDeadline <= 0:
		return fmt.Errorf("DefaultDeadline must be > 0, got %v", c.DefaultDeadline)
	case c.SweepInterval <= 0:
		return fmt.Errorf("SweepInterval must be > 0, got %v", c.SweepInterval)
	case c.ShutdownGrace < 0:
		return fmt.Errorf("ShutdownGrace must be >= 0, got %v", c.ShutdownGrace)
	case c.MaxViewStreams < 0:
		return fmt.Errorf("MaxViewStreams must be >= 0, got %d", c.MaxViewStreams)
	case c.TopKeysCapacity < 0 || c.TopKeysCapacity > topk.MaxCapacity:
		return fmt.Errorf("TopKeysCapacity must be between 0 and %d, got %d", topk.MaxCapacity, c.TopKeysCapacity)
	case c.VisibilityMaxRules < 0:
		return fmt.Errorf("VisibilityMaxRules must be >= 0, got %d", c.VisibilityMaxRules)
	case c.DrainLinger < 0:
		return fmt.Errorf("DrainLinger must be >= 0, got %v", c.DrainLinger)
	}
	if _, _, err := net.SplitHostPort(c.GRPCAddr); err != nil {
		return fmt.Errorf("GRPCAddr %q: %w", c.GRPCAddr, err)
	}
	if c.HTTPAddr != "" {
		if _, _, err := net.SplitHostPort(c.HTTPAddr); err != nil {
			return fmt.Errorf("HTTPAddr %q: %w", c.HTTPAddr, err)
		}
	}
	return nil
}

// maxViewStreams is the cap on WatchClusterView streams c sets.
func (c *Config) maxViewStreams() int {
	if c.MaxViewStreams > 0 {
		return c.MaxViewStreams
	}
	return DefaultMaxViewStreams
}
