package client

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/tokenserver/tokenserver/internal/rule"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// Defaults of the Client's options.
const (
	// DefaultCallTimeout is the per-call deadline when the caller's context
	// has none or a later one.
	DefaultCallTimeout = 50 * time.Millisecond
	// DefaultCoalesceWindow is how long a node's dispatcher gathers calls
	// into one AcquireTokens RPC.
	DefaultCoalesceWindow = 200 * time.Microsecond
	// MaxBatch is the most items one AcquireTokens RPC carries (the
	// server's limit, pb.MaxBatch).
	MaxBatch = pb.MaxBatch
	// DefaultMaxLocalLimiters bounds the local fallback limiters (one per
	// rule and key), least recently used first out.
	DefaultMaxLocalLimiters = 10_000
	// DefaultMaxLeaseKeys bounds the keys a leasing Limiter tracks.
	DefaultMaxLeaseKeys = 10_000
	// DefaultWatchSilence is how long the client waits for a message on
	// its WatchClusterView stream (servers send one at least every second)
	// before it moves the stream to another member.
	DefaultWatchSilence = 2 * time.Second
)

// Option configures New.
type Option func(*options)

type options struct {
	callTimeout    time.Duration
	coalesceWindow time.Duration
	reg            prometheus.Registerer
	log            *slog.Logger
	dial           []grpc.DialOption
	maxLocal       int
	breakerFails   int
	probeMin       time.Duration
	probeMax       time.Duration
	probeLiveMax   time.Duration
	watchSilence   time.Duration
}

func defaultOptions() options {
	return options{
		callTimeout:    DefaultCallTimeout,
		coalesceWindow: DefaultCoalesceWindow,
		maxLocal:       DefaultMaxLocalLimiters,
		breakerFails:   3,
		probeMin:       50 * time.Millisecond,
		probeMax:       5 * time.Second,
		probeLiveMax:   250 * time.Millisecond,
		watchSilence:   DefaultWatchSilence,
	}
}

// WithCallTimeout sets the deadline of one call to the server when the
// caller's context has a later one or none (default 50ms). Past it the call
// is decided by the fallback policy.
func WithCallTimeout(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.callTimeout = d
		}
	}
}

// WithCoalesceWindow enables coalescing (default on, 200µs) and sets the
// longest a call waits for a batch already in flight before it is sent
// anyway; 0 sends every call alone. Coalescing adds no wait to a call that
// finds the node's dispatcher idle: calls travel together when they pile
// up behind RPCs in flight.
func WithCoalesceWindow(d time.Duration) Option {
	return func(o *options) {
		if d >= 0 {
			o.coalesceWindow = d
		}
	}
}

// WithMetrics registers the client's Prometheus metrics on reg. Without it
// the metrics are kept but not registered anywhere.
func WithMetrics(reg prometheus.Registerer) Option {
	return func(o *options) { o.reg = reg }
}

// WithLogger sets the logger; the default discards.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) { o.log = l }
}

// WithDialOptions adds gRPC dial options (credentials, interceptors) to
// every connection. Without transport credentials the client dials
// insecurely.
func WithDialOptions(opts ...grpc.DialOption) Option {
	return func(o *options) { o.dial = append(o.dial, opts...) }
}

// WithMaxLocalLimiters bounds the local fallback limiters kept at once (one
// per rule and key; default 10,000), least recently used first out.
func WithMaxLocalLimiters(n int) Option {
	return func(o *options) {
		if n > 0 {
			o.maxLocal = n
		}
	}
}

// withWatchSilence sets how long a silent watch stream is followed (tests).
func withWatchSilence(d time.Duration) Option {
	return func(o *options) { o.watchSilence = d }
}

// FallbackPolicy is what a Limiter does when the server cannot answer. The
// numbers are those of tokenserver.v1.FallbackPolicy.
type FallbackPolicy uint8

// The fallback policies.
const (
	// FallbackUnspecified says nothing: the next source decides (the
	// rule's policy, then the Limiter's option, then allow).
	FallbackUnspecified = FallbackPolicy(rule.FallbackUnspecified)
	// FallbackAllow admits every call.
	FallbackAllow = FallbackPolicy(rule.FallbackAllow)
	// FallbackDeny refuses every call with ErrUnavailable.
	FallbackDeny = FallbackPolicy(rule.FallbackDeny)
	// FallbackLocal throttles each key locally at a per-instance limit per
	// rule period.
	FallbackLocal = FallbackPolicy(rule.FallbackLocal)
)

// String returns the policy's name.
func (p FallbackPolicy) String() string { return rule.FallbackPolicy(p).String() }

// LimiterOption configures a Limiter.
type LimiterOption func(*limiterOptions)

type limiterOptions struct {
	fbPolicy FallbackPolicy
	fbLimit  int64
	leaseMax int64
	leaseTTL time.Duration
	leasing  bool
}

// String describes o for logs.
func (o limiterOptions) String() string {
	s := fmt.Sprintf("fallback=%s/%d", o.fbPolicy, o.fbLimit)
	if o.leasing {
		s += fmt.Sprintf(" lease=%d/%v", o.leaseMax, o.leaseTTL)
	}
	return s
}

// WithFallback sets the fallback policy used until the client has seen the
// rule in the cluster view (and when the rule sets none). For FallbackLocal,
// limit is what this client instance admits per key per rule period on its
// own (per second until the rule's period is known).
func WithFallback(policy FallbackPolicy, limit int64) LimiterOption {
	return func(o *limiterOptions) { o.fbPolicy, o.fbLimit = policy, limit }
}

// WithLease opts in to leasing for hot keys: batches of at most maxBatch
// tokens, held at most ttl, within the rule's own lease caps (the smaller
// wins; 0 takes the rule's). Only token bucket, fixed window and sliding
// window rules whose lease.max_batch is set lease.
func WithLease(maxBatch int64, ttl time.Duration) LimiterOption {
	return func(o *limiterOptions) { o.leasing, o.leaseMax, o.leaseTTL = true, max(maxBatch, 0), max(ttl, 0) }
}
