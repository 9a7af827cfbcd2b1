package client

// The circuit breaker of one node.

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tokenserver/tokenserver/internal/backoff"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// errBreakerOpen is the cause of a fallback decision while a node's breaker
// is open.
var errBreakerOpen = status.Error(codes.Unavailable, "circuit breaker open")

// breaker is a node's circuit breaker, written here rather than taken from
// a library because its half-open trial is not a caller's call but a probe
// that also teaches the client the cluster view, and because routing reads
// its state on every call without a lock.
//
//   - Closed: calls go to the node. A failure marks the node failing (the
//     watcher and the fallback mode stop counting on it) and starts the
//     probe; a success clears the count.
//   - Open, after threshold failures in a row: calls do not wait for the
//     node; they go to the key's next owner, or to the fallback policy.
//   - Half-open, from the first failure until the node answers: the probe
//     asks the node for its view, after full-jitter exponential waits
//     (probeWait, capped lower by probeMax while the cluster calls the
//     node live). A probe that finds the node ready, or any call that
//     succeeds meanwhile, closes the breaker and ends the probe.
//
// failing and open are read without the lock; mu serializes the changes.
type breaker struct {
	failing atomic.Bool // the last call or probe failed
	open    atomic.Bool // calls go straight to fallback
	mu      sync.Mutex  // guards fails and probing, and changes to failing and open
	fails   int         // failures in a row
	probing bool        // a probe goroutine runs
	env     breakerEnv
}

// breakerEnv is what a breaker needs from its node and client, passed in
// so that a breaker runs alone in tests.
type breakerEnv struct {
	threshold int                  // failures in a row that open the breaker
	probeWait backoff.Policy       // the waits before probes
	probeMax  func() time.Duration // the cap of the next wait (lower while the node is a member)
	probe     func() bool          // asks the node once; true when it answered as a ready node
	changed   func()               // called after failing changed
	spawn     func(func()) bool    // runs the probe on a goroutine Close waits for; false once closing
	stop      <-chan struct{}      // closed when the node stops: the probe ends
	log       *slog.Logger         // warns when the breaker opens
	backoff   []backoff.Option     // tests: the probe waits' clock and randomness
}

// success closes the breaker.
func (b *breaker) success() {
	if !b.failing.Load() && !b.open.Load() {
		b.mu.Lock()
		b.fails = 0
		b.mu.Unlock()
		return
	}
	b.mu.Lock()
	b.fails = 0
	b.open.Store(false)
	changed := b.failing.Swap(false)
	b.mu.Unlock()
	if changed {
		b.env.changed()
	}
}

// failure counts a failure; the breaker opens after threshold in a row. A
// failing node is probed until it answers.
func (b *breaker) failure() {
	b.mu.Lock()
	b.fails++
	if b.fails >= b.env.threshold && !b.open.Load() {
		b.open.Store(true)
		b.env.log.Warn("tokenserver client: circuit breaker open", "failures", b.fails)
	}
	changed := !b.failing.Swap(true)
	startProbe := !b.probing
	b.probing = true
	b.mu.Unlock()
	if changed {
		b.env.changed()
	}
	if startProbe && !b.env.spawn(b.probeLoop) {
		b.mu.Lock()
		b.probing = false
		b.mu.Unlock()
	}
}

// probeLoop probes the node until it answers as a ready node (then closes
// the breaker), a call succeeds meanwhile, or the node stops.
func (b *breaker) probeLoop() {
	bo := backoff.New(b.env.probeWait, b.env.backoff...)
	for {
		b.mu.Lock()
		if !b.failing.Load() { // a call or probe succeeded
			b.probing = false
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		wait, stop := bo.AfterMax(b.env.probeMax())
		select {
		case <-b.env.stop:
			stop()
			b.mu.Lock()
			b.probing = false
			b.mu.Unlock()
			return
		case <-wait:
		}
		if b.env.probe() {
			b.success()
		}
	}
}

// probeMax is the cap of the next probe wait: probeMax, but only
// probeLiveMax while the node is a member of the client's view (a node the
// cluster says is live is used again as soon as it answers).
func (n *node) probeMax() time.Duration {
	if n.c.isMember(n) {
		return min(n.c.o.probeMax, n.c.o.probeLiveMax)
	}
	return n.c.o.probeMax
}

// probeOnce asks the node for its view within the call timeout, and
// applies what it answers (adding rules, never removing them); true when
// the node answered as a ready node.
func (n *node) probeOnce() bool {
	ctx, cancel := context.WithTimeout(n.c.ctx, max(n.c.o.callTimeout, 100*time.Millisecond))
	n.c.m.rpcView.Inc()
	v, err := n.tc.GetClusterView(ctx, &pb.GetClusterViewRequest{})
	cancel()
	if err != nil {
		return false
	}
	n.c.applyView(v, false)
	if !v.GetReady() {
		return false
	}
	n.c.log.Info("tokenserver client: node answers again", "addr", n.addr)
	return true
}

// record feeds the outcome of an RPC made with ctx, started with budget
// time left, to the breaker. A timeout of a call given less than half the
// call timeout does not count (the caller's deadline was short, not the
// node slow), nor does a call canceled by its caller or by Close.
func (n *node) record(ctx context.Context, budget time.Duration, err error) {
	if isNotReady(err) {
		return // reachable, but not deciding yet: neither up nor down
	}
	if err == nil || !isNodeFailure(err) {
		n.success()
		return
	}
	if n.c.ctx.Err() != nil || errors.Is(ctx.Err(), context.Canceled) {
		return
	}
	if status.Code(err) == codes.DeadlineExceeded && budget < n.c.o.callTimeout/2 {
		return
	}
	n.failure()
}
