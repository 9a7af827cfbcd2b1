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
	// MaxRuleTableBytes caps the rule table's total size in bytes (the
	// leader's value travels in each rule write). 0 means
	// raftfsm.DefaultMaxRuleTableBytes.
	MaxRuleTableBytes int64
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
	// MaxConcurrentStreams caps the streams (calls) one client connection
	// has open at once, and so the handlers a rapid-reset flood (HEADERS
	// then RST_STREAM) can keep running: past it the connection's reader
	// waits (0: DefaultMaxConcurrentStreams).
	MaxConcurrentStreams uint32
	// MaxHeaderListSize caps a request's header block in bytes: bigger
	// headers are refused by the transport before any handler parses them
	// (0: DefaultMaxHeaderListSize).
	MaxHeaderListSize uint32
	// ConnectionTimeout bounds a new connection's TLS handshake and HTTP/2
	// preface (0: DefaultConnectionTimeout).
	ConnectionTimeout time.Duration
	// MaxConns caps the connections the gRPC port holds at once; past it a
	// new connection is closed at once (0: DefaultMaxConns).
	MaxConns int
	// MaxConnsPerIP caps the gRPC connections from one remote IP address
	// (0: DefaultMaxConnsPerIP).
	MaxConnsPerIP int
	// MaxHTTPConns and MaxHTTPConnsPerIP are the same caps for the HTTP
	// port (0: DefaultMaxHTTPConns, DefaultMaxHTTPConnsPerIP).
	MaxHTTPConns, MaxHTTPConnsPerIP int
	// MaxHealthWatches caps the health Watch streams served at once;
	// probes use Check, which is never capped (0: DefaultMaxHealthWatches).
	MaxHealthWatches int
	// MaxViewStreamsPerPrincipal caps the WatchClusterView streams of one
	// caller: one authenticated principal, or one remote IP address when
	// authentication is off (0: DefaultMaxViewStreamsPerPrincipal).
	MaxViewStreamsPerPrincipal int
	// ForwardTimeout bounds a forwarded data-plane call's first attempt
	// on the key's owner, after which the key's next owner decides; the
	// attempt also gets at most half of the caller's time left
	// (0: DefaultForwardTimeout).
	ForwardTimeout time.Duration
	// MetricsAuth protects /metrics: "" or "open" serves it to anyone,
	// "token" asks for a bearer token of --auth-tokens whose principal
	// has the viewer role (metrics name rules and show their traffic).
	MetricsAuth string
	// DrainLinger is how long a stopping node keeps answering after it
	// left the routing view, while clients hear of the new view.
	DrainLinger time.Duration
	// ReplicationInterval is the longest a changed bucket of a durable
	// rule waits before it is sent to its key's next owner (replica.go).
	ReplicationInterval time.Duration
	// CheckpointInterval is how often durable buckets are checkpointed to
	// CheckpointDir (when any changed): at most one fsync per interval.
	CheckpointInterval time.Duration
	// CheckpointDir is where durable buckets are checkpointed (the data
	// dir); empty turns checkpoints off.
	CheckpointDir string
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
	// Envoy configures Envoy's rate limit service (envoy.go).
	Envoy EnvoyConfig
}

// DefaultMaxViewStreams caps the WatchClusterView streams one node serves
// at once when Config.MaxViewStreams is 0; past it a new stream gets
// ResourceExhausted (the SDK then watches another member). Each idle
// stream costs a goroutine and one send per ViewHeartbeat.
const DefaultMaxViewStreams = 4096

// Defaults of the limits of Config. A node's port is open to the network,
// so every resource a caller can hold has a cap.
const (
	DefaultMaxConcurrentStreams       = 256
	DefaultMaxHeaderListSize          = 8 << 10
	DefaultConnectionTimeout          = 5 * time.Second
	DefaultMaxConns                   = 16384
	DefaultMaxConnsPerIP              = 2048
	DefaultMaxHTTPConns               = 512
	DefaultMaxHTTPConnsPerIP          = 64
	DefaultMaxHealthWatches           = 256
	DefaultMaxViewStreamsPerPrincipal = 256
	DefaultForwardTimeout             = time.Second
	DefaultReplicationInterval        = time.Second
	DefaultCheckpointInterval         = 5 * time.Second
)

// DefaultConfig returns the configuration of the no-flag single node.
func DefaultConfig() Config {
	return Config{
		GRPCAddr:            "127.0.0.1:7070",
		HTTPAddr:            "127.0.0.1:7072",
		PprofAddr:           "127.0.0.1:7073",
		MaxBucketMemory:     DefaultBucketMemory(),
		MaxRules:            rule.DefaultMaxRules,
		MaxRecvMsgSize:      4 << 20,
		DefaultDeadline:     10 * time.Second,
		SweepInterval:       time.Second,
		ShutdownGrace:       5 * time.Second,
		DrainLinger:         time.Second,
		ReplicationInterval: DefaultReplicationInterval,
		CheckpointInterval:  DefaultCheckpointInterval,
		Visibility:          true,
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
	case c.MaxRuleTableBytes < 0:
		return fmt.Errorf("MaxRuleTableBytes must be >= 0, got %d", c.MaxRuleTableBytes)
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
	case c.ForwardTimeout < 0:
		return fmt.Errorf("ForwardTimeout must be >= 0, got %v", c.ForwardTimeout)
	case c.ConnectionTimeout < 0:
		return fmt.Errorf("ConnectionTimeout must be >= 0, got %v", c.ConnectionTimeout)
	case c.MaxHeaderListSize != 0 && c.MaxHeaderListSize < 1<<10:
		return fmt.Errorf("MaxHeaderListSize must be at least 1 KiB, got %d", c.MaxHeaderListSize)
	case c.MaxConns < 0 || c.MaxConnsPerIP < 0 || c.MaxHTTPConns < 0 || c.MaxHTTPConnsPerIP < 0:
		return fmt.Errorf("MaxConns, MaxConnsPerIP, MaxHTTPConns and MaxHTTPConnsPerIP must be >= 0, got %d, %d, %d, %d", c.MaxConns, c.MaxConnsPerIP, c.MaxHTTPConns, c.MaxHTTPConnsPerIP)
	case c.MaxHealthWatches < 0:
		return fmt.Errorf("MaxHealthWatches must be >= 0, got %d", c.MaxHealthWatches)
	case c.MaxViewStreamsPerPrincipal < 0:
		return fmt.Errorf("MaxViewStreamsPerPrincipal must be >= 0, got %d", c.MaxViewStreamsPerPrincipal)
	case c.MetricsAuth != "" && c.MetricsAuth != "open" && c.MetricsAuth != "token":
		return fmt.Errorf("MetricsAuth must be open or token, got %q", c.MetricsAuth)
	case c.MetricsAuth == "token" && !c.Security.authOn():
		return errors.New("MetricsAuth token needs bearer tokens: set Security.Auth (--auth-tokens)")
	case c.TopKeysCapacity < 0 || c.TopKeysCapacity > topk.MaxCapacity:
		return fmt.Errorf("TopKeysCapacity must be between 0 and %d, got %d", topk.MaxCapacity, c.TopKeysCapacity)
	case c.VisibilityMaxRules < 0:
		return fmt.Errorf("VisibilityMaxRules must be >= 0, got %d", c.VisibilityMaxRules)
	case c.DrainLinger < 0:
		return fmt.Errorf("DrainLinger must be >= 0, got %v", c.DrainLinger)
	case c.ReplicationInterval < 0 || c.ReplicationInterval > time.Minute:
		return fmt.Errorf("ReplicationInterval must be between 0 (default) and 1m, got %v", c.ReplicationInterval)
	case c.CheckpointInterval < 0:
		return fmt.Errorf("CheckpointInterval must be >= 0, got %v", c.CheckpointInterval)
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
