// Package server wires a tokenserver node: the gRPC TokenService and
// AdminService over the shard map and the cluster, health and reflection,
// the HTTP endpoints, and the mapping of errors to gRPC codes.
//
// Layout (after etcd's v3rpc): node.go builds and runs a Node (New, Serve,
// Stop); grpc.go builds its gRPC server; token.go, view.go, admin.go,
// membership.go and snapshot.go are the services; routing.go forwards a
// key to its owner and fails over; peers.go holds the node-to-node
// connections and peer health; health.go, http.go and metrics.go report;
// interceptors.go and security.go guard every call; errors.go is the one
// place where errors become gRPC codes. utf8codec.go is hand-written
// because proto3 strings cannot opt out of UTF-8 validation with the
// protoc this project pins (see there).
package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"

	"github.com/tokenserver/tokenserver/internal/auth"
	"github.com/tokenserver/tokenserver/internal/cluster"
	"github.com/tokenserver/tokenserver/internal/handoff"
	"github.com/tokenserver/tokenserver/internal/overadmit"
	"github.com/tokenserver/tokenserver/internal/replica"
	"github.com/tokenserver/tokenserver/internal/shard"
)

// Deps are what a Node is built over besides its Config.
type Deps struct {
	// Data is the cluster as the data plane reads it (required).
	Data DataPlane
	// Control is the cluster as the admin service and the node's
	// lifecycle change it (required).
	Control ControlPlane
	// Peers are the connections to other nodes; nil: New makes them from
	// Config.Security. OpenRaft shares them with the Raft node.
	Peers *Peers
	// Hooks are the Raft node's callbacks into this node; nil: New makes
	// its own (a node without Raft observes no applies).
	Hooks *RaftHooks
	// Join, when set, runs once Serve starts, with a context that ends
	// when the node stops (asking members to add this node).
	Join func(ctx context.Context) error
	// Services register more gRPC services on the node's server, behind
	// the same interceptors (authorization, deadlines, panics).
	Services []func(grpc.ServiceRegistrar)
}

// Node is one tokenserver: its gRPC server, buckets and cluster. Build it
// with New, run it with Serve, stop it by ending Serve's context (or
// Stop).
type Node struct {
	cfg       Config
	log       *slog.Logger
	data      DataPlane
	control   ControlPlane
	peers     *Peers
	hooks     *RaftHooks
	join      func(context.Context) error
	buckets   *shard.Map
	decisions *decisions
	vis       *visibility  // nil: off (visibility.go)
	tracer    trace.Tracer // nil: off (tracing.go)
	codec     *utf8Codec
	now       func() int64
	grpc      *grpc.Server
	health    *health.Server
	// ready mirrors the health status: the cluster node is ready (caught
	// up, in the view) and this node is serving and not draining.
	ready         atomic.Bool
	memberHealthy atomic.Bool
	healthSet     atomic.Bool // the statuses were set once
	serving       atomic.Bool
	draining      atomic.Bool
	metrics       *metrics
	envoy         *envoy              // Envoy's rate limit service (envoy*.go)
	handoff       *handoff.Receiver   // handoff.go
	replica       *replica.Replicator // replica.go
	// bound is tokenserver_overadmission_bound_permits: parts register
	// with bound.Add (handoff.go).
	bound overadmit.Bound
	seen  viewSeen // the last view observeView handled (handoff.go)
	views viewCaster
	done  chan struct{}
	// auth authorizes calls (nil when auth is off); peersOnly says that the
	// forwarded marker counts only from peers (TLS or auth is on).
	auth      *auth.Authenticator
	peersOnly bool
	// confirms holds a slot per leader read of an unknown rule in flight
	// (confirmRule).
	confirms chan struct{}
	// refusedGRPC and refusedHTTP count connections closed at a cap.
	refusedGRPC, refusedHTTP atomic.Int64

	mu       sync.Mutex
	lis      Listeners
	httpSrv  *http.Server
	pprofSrv *http.Server
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// New builds a node over deps. Run it with Serve; a node built and never
// served must still be stopped with Stop (its gRPC server's stream workers
// start here).
func New(cfg Config, deps Deps) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("server config: %w", err)
	}
	if deps.Data == nil || deps.Control == nil {
		return nil, errors.New("server deps: Data and Control are required")
	}
	n := &Node{
		cfg:       cfg,
		log:       cmp.Or(cfg.Logger, slog.Default()),
		data:      deps.Data,
		control:   deps.Control,
		peers:     deps.Peers,
		hooks:     deps.Hooks,
		join:      deps.Join,
		buckets:   shard.New(shard.Config{Shards: cfg.Shards, MaxBuckets: cfg.MaxBuckets, MaxBytes: cmp.Or(cfg.MaxBucketMemory, DefaultBucketMemory())}),
		decisions: newDecisions(),
		codec:     newUTF8Codec(),
		now:       cfg.Clock,
		health:    health.NewServer(),
		done:      make(chan struct{}),
		confirms:  make(chan struct{}, maxRuleConfirms),
	}
	sec := &cfg.Security
	if n.peers == nil {
		_, peerClient := sec.peerTLS()
		n.peers = NewPeers(peerClient)
		n.peers.expectIDs(sec)
	}
	if n.hooks == nil {
		n.hooks = NewRaftHooks()
	}
	n.metrics = newMetrics(n)
	deps.Services = append(deps.Services, n.newHandoff(), n.newReplica())
	if n.now == nil {
		start := time.Now()
		// Unix nanoseconds as of start, advanced by the monotonic clock:
		// calendar windows need wall time (see package bucket), and the
		// clock still never steps.
		n.now = func() int64 { return start.UnixNano() + int64(time.Since(start)) }
	}
	n.vis = newVisibility(&cfg, n.now)
	n.tracer = newTracer(cfg.TracerProvider)
	n.decisions.vis = n.vis
	if sec.authOn() {
		n.auth = sec.Auth
	}
	n.peersOnly = sec.tlsOn() || sec.authOn()
	var err error
	if n.envoy, err = newEnvoy(n, cfg.Envoy, deps.Control); err != nil {
		return nil, err
	}
	if n.grpc, err = n.newGRPCServer(deps.Services); err != nil {
		return nil, fmt.Errorf("server config: %w", err)
	}
	n.updateHealth()
	return n, nil
}

// Buckets exposes the node's bucket map (for metrics and tests).
func (n *Node) Buckets() *shard.Map { return n.buckets }

// GRPCAddr is the address the gRPC server listens on, once it serves.
func (n *Node) GRPCAddr() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.lis.GRPC == nil {
		return ""
	}
	return n.lis.GRPC.Addr().String()
}

// HTTPAddr is the address the HTTP server listens on, once it serves.
func (n *Node) HTTPAddr() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.lis.HTTP == nil {
		return ""
	}
	return n.lis.HTTP.Addr().String()
}

// Serve runs the node on lis until ctx ends, then stops it gracefully
// (Stop). It closes the listeners.
func (n *Node) Serve(ctx context.Context, lis Listeners) error {
	if lis.GRPC == nil {
		return errors.New("serve: no gRPC listener")
	}
	hcfg, err := n.cfg.Security.httpTLS()
	if err != nil {
		lis.Close()
		return fmt.Errorf("http tls: %w", err)
	}
	lis.GRPC = newLimitListener(lis.GRPC, cmp.Or(n.cfg.MaxConns, DefaultMaxConns), cmp.Or(n.cfg.MaxConnsPerIP, DefaultMaxConnsPerIP), &n.refusedGRPC, n.acceptRetry("grpc"))
	if lis.HTTP != nil {
		lis.HTTP = newLimitListener(lis.HTTP, cmp.Or(n.cfg.MaxHTTPConns, DefaultMaxHTTPConns), cmp.Or(n.cfg.MaxHTTPConnsPerIP, DefaultMaxHTTPConnsPerIP), &n.refusedHTTP, n.acceptRetry("http"))
	}
	n.mu.Lock()
	n.lis = lis
	n.mu.Unlock()
	errc := make(chan error, 3)
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		if err := n.grpc.Serve(lis.GRPC); err != nil {
			errc <- fmt.Errorf("grpc server: %w", err)
		}
	}()
	if lis.HTTP != nil {
		srv := newHTTPServer(n.httpHandler())
		srv.TLSConfig = hcfg
		n.mu.Lock()
		n.httpSrv = srv
		n.mu.Unlock()
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			var err error
			if hcfg != nil {
				err = srv.ServeTLS(lis.HTTP, "", "") // certificates from TLSConfig
			} else {
				err = srv.Serve(lis.HTTP)
			}
			if err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("http server: %w", err)
			}
		}()
	}
	if lis.Pprof != nil {
		srv := newHTTPServer(pprofHandler())
		n.mu.Lock()
		n.pprofSrv = srv
		n.mu.Unlock()
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			if err := srv.Serve(lis.Pprof); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("pprof server: %w", err)
			}
		}()
	}
	if n.cfg.Security.tlsOn() && !n.cfg.Security.authOn() && n.insecure() {
		n.log.Warn("TLS without caller authentication: the calls are encrypted, but anyone who reaches the gRPC port can call every method; add --auth-tokens or --tls-client-ca", "node", n.data.ID())
	} else if n.cfg.Security.Insecure {
		n.log.Warn("--insecure: serving without the protection of TLS or authentication on addresses other hosts reach; anyone who reaches them can rewrite the rules and the cluster", "node", n.data.ID())
	}
	n.warnExpiring(time.Now())
	n.wg.Add(4)
	go n.expireOverrides()
	go n.sweep()
	go n.watchReadiness()
	go n.watchAuth()
	n.wg.Add(1)
	go n.watchMoves() // handoff.go
	n.wg.Add(1)
	go n.replicate()
	n.wg.Add(1)
	go func() { defer n.wg.Done(); n.envoy.run(n.done) }()
	if n.join != nil {
		n.wg.Add(1)
		go n.runJoin()
	}
	n.serving.Store(true)
	n.updateHealth()
	n.log.Info("tokenserver serving", "node", n.data.ID(), "grpc", n.GRPCAddr(), "http", n.HTTPAddr(), "max_buckets", n.cfg.MaxBuckets,
		"tls", n.cfg.Security.tlsOn(), "auth", n.auth != nil)
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	n.Stop()
	return err
}

// acceptRetry logs a temporary accept error of the port named port (out
// of file descriptors), which its listener retries after delay.
func (n *Node) acceptRetry(port string) func(error, time.Duration) {
	return func(err error, delay time.Duration) {
		n.log.Warn("accept failed; retrying", "port", port, "err", err, "retry_in", delay.String())
	}
}

// runJoin asks members to add this node until it succeeds, fails or the
// node stops.
func (n *Node) runJoin() {
	defer n.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-n.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := n.join(ctx); err != nil {
		n.log.Error("could not join the cluster", "err", err)
	}
}

// Stop stops the node without dropping a caller: it reports not ready
// (health NOT_SERVING), leaves the routing view through the leader so that
// its keys move to their next owners and clients re-route, keeps answering
// (and forwarding) for DrainLinger while clients hear of the new view, lets
// calls in flight finish, hands over leadership if it leads, and closes
// everything. It is safe to call twice.
//
// Stop returns within ShutdownGrace (at least minStopClose) whatever the
// network does: leaving the view, the linger and the calls in flight end
// stopCloseReserve before it, and every closing step after them (Raft and
// its transport, the HTTP server, the node's goroutines, the peer
// connections) is waited for only until it; a step still blocked then (a
// write to a frozen peer, a leadership transfer to no one) is abandoned,
// logged, and left to the process's exit.
func (n *Node) Stop() {
	n.stopOnce.Do(func() {
		start := time.Now()
		closeBy := start.Add(max(n.cfg.ShutdownGrace, minStopClose))
		gracefulBy := start.Add(n.cfg.ShutdownGrace - stopCloseReserve(n.cfg.ShutdownGrace))
		n.log.Info("tokenserver stopping: leaving the routing view first", "node", n.data.ID())
		n.draining.Store(true)
		n.updateHealth()
		ctx, cancel := context.WithDeadline(context.Background(), gracefulBy)
		n.prepareHandoff(ctx)
		if err := n.control.Drain(ctx); err != nil {
			n.log.Warn("could not leave the routing view; clients fall back until the view drops this node", "err", err)
		} else if n.handOver(ctx, "drain", n.ownCopies()); n.cfg.DrainLinger > 0 && !slices.ContainsFunc(n.data.View().Members(), func(m cluster.Member) bool { return m.ID == n.data.ID() }) {
			// Keys moved: keep answering while clients hear of it. (The
			// only owner keeps its keys: there is nothing to wait for.)
			select {
			case <-ctx.Done():
			case <-time.After(n.cfg.DrainLinger):
			}
		}
		cancel()
		close(n.done)
		stopped := make(chan struct{})
		go func() { n.grpc.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-time.After(time.Until(gracefulBy)):
			n.grpc.Stop()
		}
		// Leave Raft last (a leader hands over leadership first), so that
		// calls in flight could still be forwarded and rules still read,
		// and before the peer connections close (the leader's member
		// health checks use them). The steps after it run at once, so a
		// Raft shutdown that takes the grace leaves them their share.
		n.within(closeBy.Add(-stopTail(time.Until(closeBy))), "leave the cluster (raft and its transport)", func() {
			if err := n.control.Close(); err != nil {
				n.log.Warn("leaving the cluster", "err", err)
			}
		})
		n.mu.Lock()
		hs, ps := n.httpSrv, n.pprofSrv
		n.mu.Unlock()
		hctx, hcancel := context.WithDeadline(context.Background(), closeBy)
		defer hcancel()
		var wg sync.WaitGroup
		for what, step := range map[string]func(){
			"stop the HTTP server": func() {
				if hs != nil {
					_ = hs.Shutdown(hctx)
				}
			},
			"stop the pprof server": func() {
				if ps != nil {
					_ = ps.Close()
				}
			},
			"end the node's background work": n.wg.Wait,
			"close the peer connections":     n.peers.close,
		} {
			wg.Go(func() { n.within(closeBy, what, step) })
		}
		wg.Wait()
	})
}

// stopTail is the part of the time left for closing that Stop keeps for
// the steps after Raft's: a quarter, at most 250 ms.
func stopTail(left time.Duration) time.Duration {
	return min(max(left, 0)/4, 250*time.Millisecond)
}

// minStopClose is the least time Stop gives its closing steps: with a
// ShutdownGrace below it, Stop may take this long.
const minStopClose = 500 * time.Millisecond

// stopCloseReserve is the part of ShutdownGrace kept for the closing
// steps after the calls in flight: a quarter, at most 2 s.
func stopCloseReserve(grace time.Duration) time.Duration {
	return min(grace/4, 2*time.Second)
}

// within runs step and waits for it until by; a step still running then
// is abandoned (it goes on in the background) and logged, so that a
// socket that never answers cannot hold the node's exit.
func (n *Node) within(by time.Time, what string, step func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		step()
	}()
	t := time.NewTimer(time.Until(by))
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		n.log.Warn("shutdown step abandoned: it did not end within --shutdown-grace", "step", what)
	}
}

// sweep evicts idle buckets, and forgets the decision counts of rule
// generations that are gone, every SweepInterval until the node stops.
func (n *Node) sweep() {
	defer n.wg.Done()
	t := time.NewTicker(n.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-n.done:
			return
		case <-t.C:
			tbl := n.data.Table()
			n.buckets.Sweep(n.now(), tbl)
			n.decisions.prune(tbl)
		}
	}
}
