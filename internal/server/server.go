// Package server wires a tokenserver node: the gRPC TokenService and
// AdminService over the shard map and the rule store, health and
// reflection, the HTTP endpoints, and the mapping of errors to gRPC codes.
package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"

	"github.com/tokenserver/tokenserver/internal/auth"
	"github.com/tokenserver/tokenserver/internal/cluster"
	"github.com/tokenserver/tokenserver/internal/rule"
	"github.com/tokenserver/tokenserver/internal/shard"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// Config configures a Node. Start from DefaultConfig.
type Config struct {
	// GRPCAddr is where TokenService and AdminService listen.
	GRPCAddr string
	// HTTPAddr is where /healthz and /readyz listen; empty disables HTTP.
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
	// MaxRules caps the rules of the cluster (rule.SetMaxRules; every node
	// must use the same value). 0 means rule.DefaultMaxRules.
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
	// Logger receives the node's logs; nil means slog.Default().
	Logger *slog.Logger
	// Clock returns monotonic nanoseconds; nil means the process clock.
	// Tests pass a fake.
	Clock func() int64
}

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
	}
}

// Validate reports the first problem with c, naming the field.
func (c *Config) Validate() error {
	switch {
	case c.GRPCAddr == "":
		return errors.New("grpc address is empty")
	case c.MaxBuckets < 0:
		return fmt.Errorf("max buckets must be >= 0, got %d", c.MaxBuckets)
	case c.MaxBucketMemory < 0:
		return fmt.Errorf("max bucket memory must be >= 0, got %d", c.MaxBucketMemory)
	case c.MaxBucketMemory > 0 && c.MaxBucketMemory < 1<<20:
		return fmt.Errorf("max bucket memory must be at least 1 MiB, got %d bytes", c.MaxBucketMemory)
	case c.MaxRules < 0:
		return fmt.Errorf("max rules must be >= 0, got %d", c.MaxRules)
	case c.Shards < 0 || c.Shards > 1<<16:
		return fmt.Errorf("shards must be between 0 and 65536, got %d", c.Shards)
	case c.MaxRecvMsgSize < 1<<16:
		return fmt.Errorf("max message size must be at least 64 KiB, got %d", c.MaxRecvMsgSize)
	case c.DefaultDeadline <= 0:
		return fmt.Errorf("default deadline must be > 0, got %v", c.DefaultDeadline)
	case c.SweepInterval <= 0:
		return fmt.Errorf("sweep interval must be > 0, got %v", c.SweepInterval)
	case c.ShutdownGrace < 0:
		return fmt.Errorf("shutdown grace must be >= 0, got %v", c.ShutdownGrace)
	case c.MaxViewStreams < 0:
		return fmt.Errorf("max view streams must be >= 0, got %d", c.MaxViewStreams)
	case c.DrainLinger < 0:
		return fmt.Errorf("drain linger must be >= 0, got %v", c.DrainLinger)
	}
	if _, _, err := net.SplitHostPort(c.GRPCAddr); err != nil {
		return fmt.Errorf("grpc address %q: %w", c.GRPCAddr, err)
	}
	if c.HTTPAddr != "" {
		if _, _, err := net.SplitHostPort(c.HTTPAddr); err != nil {
			return fmt.Errorf("http address %q: %w", c.HTTPAddr, err)
		}
	}
	return nil
}

// Node is one tokenserver: its gRPC server, buckets and rule store.
type Node struct {
	cfg     Config
	log     *slog.Logger
	cluster Cluster
	peers   *peers
	buckets *shard.Map
	now     func() int64
	grpc    *grpc.Server
	health  *health.Server
	// ready mirrors the health status: the cluster node is ready (caught
	// up, in the view) and this node is serving and not draining.
	ready         atomic.Bool
	memberHealthy atomic.Bool
	healthSet     atomic.Bool // the statuses were set once
	serving       atomic.Bool
	draining      atomic.Bool
	metrics       *metrics
	done          chan struct{}
	// auth authorizes calls (nil when auth is off); peersOnly says that the
	// forwarded marker counts only from peers (TLS or auth is on).
	auth      *auth.Authenticator
	peersOnly bool

	mu       sync.Mutex
	grpcLis  net.Listener
	httpLis  net.Listener
	httpSrv  *http.Server
	pprofSrv *http.Server
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// New builds a node over c. Call Serve to run it; Stop releases it (the
// gRPC server's stream workers start here, so a node that is built but
// only used through RegisterServices must be stopped too).
func New(cfg Config, c Cluster) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("server config: %w", err)
	}
	n := &Node{
		cfg:     cfg,
		log:     cfg.Logger,
		cluster: c,
		buckets: shard.New(shard.Config{Shards: cfg.Shards, MaxBuckets: cfg.MaxBuckets, MaxBytes: cmp.Or(cfg.MaxBucketMemory, DefaultBucketMemory())}),
		now:     cfg.Clock,
		health:  health.NewServer(),
		done:    make(chan struct{}),
	}
	if n.log == nil {
		n.log = slog.Default()
	}
	rule.SetMaxRules(cfg.MaxRules)
	n.metrics = newMetrics(n)
	if n.now == nil {
		start := time.Now()
		// Offset by a day so that window arithmetic never sees time near 0.
		n.now = func() int64 { return int64(time.Since(start)) + int64(24*time.Hour) }
	}
	sec := &cfg.Security
	if sec.authOn() {
		n.auth = sec.Auth
	}
	n.peersOnly = sec.tlsOn() || sec.authOn()
	_, peerClient := sec.peerTLS()
	n.peers = newPeers(peerClient)
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(cfg.MaxRecvMsgSize),
		// Serve calls on a pool of goroutines whose stacks have already
		// grown, rather than a new goroutine per call: growing a fresh
		// stack through gRPC's receive path was a fifth of the server's
		// CPU per AcquireToken in profiles; the pool cuts server CPU per
		// call by about 13% (beyond 32 busy workers gRPC starts goroutines
		// as before).
		grpc.NumStreamWorkers(32),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		// One interceptor (not a chain of three): gRPC allocates a closure
		// per chained interceptor per call.
		grpc.UnaryInterceptor(n.unary),
		// Invalid UTF-8 in a request is InvalidArgument naming the field,
		// not gRPC's INTERNAL decoding error (see utf8Codec).
		grpc.ForceServerCodecV2(newUTF8Codec()),
		grpc.ChainStreamInterceptor(n.recoverStream, n.secureStream),
	}
	creds, err := sec.serverOption()
	if err != nil {
		return nil, fmt.Errorf("server config: %w", err)
	}
	if creds != nil {
		opts = append(opts, creds)
	}
	n.grpc = grpc.NewServer(opts...)
	pb.RegisterTokenServiceServer(n.grpc, &tokenService{n: n})
	pb.RegisterAdminServiceServer(n.grpc, &adminService{n: n})
	healthpb.RegisterHealthServer(n.grpc, n.health)
	reflection.Register(n.grpc)
	n.updateHealth()
	return n, nil
}

// Buckets exposes the node's bucket map (for metrics and tests).
func (n *Node) Buckets() *shard.Map { return n.buckets }

// Cluster returns the node's cluster (rules and membership).
func (n *Node) Cluster() Cluster { return n.cluster }

// advertiseGRPC is the address others dial.
func (n *Node) advertiseGRPC() string {
	if n.cfg.AdvertiseGRPC != "" {
		return n.cfg.AdvertiseGRPC
	}
	if a := n.GRPCAddr(); a != "" {
		return a
	}
	return n.cfg.GRPCAddr
}

// GRPCAddr is the address the gRPC server listens on, once it does.
func (n *Node) GRPCAddr() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.grpcLis == nil {
		return ""
	}
	return n.grpcLis.Addr().String()
}

// HTTPAddr is the address the HTTP server listens on, once it does.
func (n *Node) HTTPAddr() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.httpLis == nil {
		return ""
	}
	return n.httpLis.Addr().String()
}

// updateHealth sets the health statuses from the node's state: the
// overall status and the services' are SERVING while the node serves, is
// ready and is not draining; MemberHealthService while it serves, has
// caught up with the log and is not draining. It reports readiness.
func (n *Node) updateHealth() bool {
	up := n.serving.Load() && !n.draining.Load()
	ready := up && n.cluster.Ready()
	member := up && n.cluster.CaughtUp()
	if n.ready.Swap(ready) != ready || n.memberHealthy.Swap(member) != member || !n.healthSet.Swap(true) {
		n.health.SetServingStatus("", servingStatus(ready))
		n.health.SetServingStatus(pb.TokenService_ServiceDesc.ServiceName, servingStatus(ready))
		n.health.SetServingStatus(pb.AdminService_ServiceDesc.ServiceName, servingStatus(ready))
		n.health.SetServingStatus(MemberHealthService, servingStatus(member))
	}
	return ready
}

func servingStatus(ok bool) healthpb.HealthCheckResponse_ServingStatus {
	if ok {
		return healthpb.HealthCheckResponse_SERVING
	}
	return healthpb.HealthCheckResponse_NOT_SERVING
}

// watchReadiness keeps the health statuses current until the node stops:
// readiness comes from the Raft node (catching up, the view) and changes
// without a signal of its own, so it is polled.
func (n *Node) watchReadiness() {
	defer n.wg.Done()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	logged := false
	for {
		if n.updateHealth() && !logged {
			logged = true
			n.log.Info("ready: serving the keys this node owns", "node", n.cluster.ID())
		}
		select {
		case <-n.done:
			return
		case <-t.C:
		}
	}
}

// Listen opens the gRPC and HTTP listeners, so that their addresses are
// known (":0" picks a free port) before Serve.
func (n *Node) Listen() error {
	gl, err := net.Listen("tcp", n.cfg.GRPCAddr)
	if err != nil {
		return fmt.Errorf("listen grpc %s: %w", n.cfg.GRPCAddr, err)
	}
	var hl net.Listener
	if n.cfg.HTTPAddr != "" {
		if hl, err = net.Listen("tcp", n.cfg.HTTPAddr); err != nil {
			gl.Close()
			return fmt.Errorf("listen http %s: %w", n.cfg.HTTPAddr, err)
		}
	}
	n.mu.Lock()
	n.grpcLis, n.httpLis = gl, hl
	n.mu.Unlock()
	return nil
}

// ServeOn runs the node with its gRPC server on lis (tests pass a bufconn
// listener) and its HTTP server, if any, on a new listener.
func (n *Node) ServeOn(ctx context.Context, lis net.Listener) error {
	n.mu.Lock()
	n.grpcLis = lis
	n.mu.Unlock()
	if n.cfg.HTTPAddr != "" && n.HTTPAddr() == "" {
		hl, err := net.Listen("tcp", n.cfg.HTTPAddr)
		if err != nil {
			return fmt.Errorf("listen http %s: %w", n.cfg.HTTPAddr, err)
		}
		n.mu.Lock()
		n.httpLis = hl
		n.mu.Unlock()
	}
	return n.Serve(ctx)
}

// Serve runs the node on the listeners Listen opened (it calls Listen when
// none is open) until ctx ends, then stops gracefully.
func (n *Node) Serve(ctx context.Context) error {
	if n.GRPCAddr() == "" {
		if err := n.Listen(); err != nil {
			return err
		}
	}
	hcfg, err := n.cfg.Security.httpTLS()
	if err != nil {
		return fmt.Errorf("http tls: %w", err)
	}
	var pl net.Listener
	if n.cfg.Pprof && n.cfg.PprofAddr != "" {
		if pl, err = net.Listen("tcp", n.cfg.PprofAddr); err != nil {
			return fmt.Errorf("listen pprof %s: %w", n.cfg.PprofAddr, err)
		}
	}
	errc := make(chan error, 3)
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		if err := n.grpc.Serve(n.grpcLis); err != nil {
			errc <- fmt.Errorf("grpc server: %w", err)
		}
	}()
	if n.httpLis != nil {
		n.httpSrv = newHTTPServer(n.httpHandler())
		n.httpSrv.TLSConfig = hcfg
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			var err error
			if hcfg != nil {
				err = n.httpSrv.ServeTLS(n.httpLis, "", "") // certificates from TLSConfig
			} else {
				err = n.httpSrv.Serve(n.httpLis)
			}
			if err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("http server: %w", err)
			}
		}()
	}
	if pl != nil {
		n.mu.Lock()
		n.pprofSrv = newHTTPServer(pprofHandler())
		n.mu.Unlock()
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			if err := n.pprofSrv.Serve(pl); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("pprof server: %w", err)
			}
		}()
	}
	if n.cfg.Security.Insecure {
		n.log.Warn("--insecure: serving without the protection of TLS or authentication on addresses other hosts reach; anyone who reaches them can rewrite the rules and the cluster", "node", n.cluster.ID())
	}
	n.wg.Add(2)
	go n.sweep()
	go n.watchReadiness()
	n.serving.Store(true)
	n.updateHealth()
	n.log.Info("tokenserver serving", "node", n.cluster.ID(), "grpc", n.GRPCAddr(), "http", n.HTTPAddr(), "max_buckets", n.cfg.MaxBuckets,
		"tls", n.cfg.Security.tlsOn(), "auth", n.auth != nil)
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	n.Stop()
	return err
}

// Stop stops the node without dropping a caller: it reports not ready
// (health NOT_SERVING), leaves the routing view through the leader so that
// its keys move to their next owners and clients re-route, keeps answering
// (and forwarding) for DrainLinger while clients hear of the new view, lets
// calls in flight finish for up to ShutdownGrace, hands over leadership if
// it leads, and closes everything. It is safe to call twice.
func (n *Node) Stop() {
	n.stopOnce.Do(func() {
		start := time.Now()
		n.log.Info("tokenserver stopping: leaving the routing view first", "node", n.cluster.ID())
		n.draining.Store(true)
		n.updateHealth()
		ctx, cancel := context.WithTimeout(context.Background(), n.cfg.ShutdownGrace)
		if err := n.cluster.Drain(ctx); err != nil {
			n.log.Warn("could not leave the routing view; clients fall back until the view drops this node", "err", err)
		} else if n.cfg.DrainLinger > 0 && !slices.ContainsFunc(n.cluster.View().Members(), func(m cluster.Member) bool { return m.ID == n.cluster.ID() }) {
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
		case <-time.After(max(0, n.cfg.ShutdownGrace-time.Since(start))):
			n.grpc.Stop()
		}
		// Leave Raft last (a leader hands over leadership first), so that
		// calls in flight could still be forwarded and rules still read.
		if err := n.cluster.Close(); err != nil {
			n.log.Warn("leaving the cluster", "err", err)
		}
		if n.httpSrv != nil {
			ctx, cancel := context.WithTimeout(context.Background(), n.cfg.ShutdownGrace)
			_ = n.httpSrv.Shutdown(ctx)
			cancel()
		}
		n.mu.Lock()
		ps := n.pprofSrv
		n.mu.Unlock()
		if ps != nil {
			_ = ps.Close()
		}
		n.wg.Wait()
		n.peers.close()
	})
}

// sweep evicts idle buckets every SweepInterval until the node stops.
func (n *Node) sweep() {
	defer n.wg.Done()
	t := time.NewTicker(n.cfg.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-n.done:
			return
		case <-t.C:
			n.buckets.Sweep(n.now(), n.cluster.Table())
		}
	}
}

// httpHandler serves /healthz (the process is up) and /readyz (the node
// answers requests).
func (n *Node) httpHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.Handle("GET /metrics", n.metrics.handler())
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		switch {
		case n.ready.Load():
			fmt.Fprintln(w, "ready")
		case n.draining.Load():
			http.Error(w, "not ready: draining (shutting down)", http.StatusServiceUnavailable)
		case !n.serving.Load():
			http.Error(w, "not ready: not serving yet", http.StatusServiceUnavailable)
		case !n.cluster.CaughtUp():
			http.Error(w, "not ready: catching up with the Raft log", http.StatusServiceUnavailable)
		default:
			http.Error(w, "not ready: not in the routing view yet", http.StatusServiceUnavailable)
		}
	})
	return mux
}

// newHTTPServer is an HTTP server with timeouts on reading a request and
// on idle connections (no write timeout: a CPU profile takes 30 s).
func newHTTPServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
}

// pprofHandler serves Go's profiles under /debug/pprof/.
func pprofHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// unary is the one unary interceptor: it authorizes the call (when auth is
// on), drops a client's forwarded marker (see dropForeignForward), turns a
// panic into an Internal error, a log line and tokenserver_panics_total
// (bad input never takes the node down), gives calls without a deadline
// the default one, times data-plane calls into the decision latency
// histogram and audits writes.
func (n *Node) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
	badUTF8 := takeBadUTF8(req) // taken first, so that it is always forgotten
	if n.auth != nil {
		if ctx, err = n.authorize(ctx, info.FullMethod); err != nil {
			return nil, err
		}
	}
	ctx = n.dropForeignForward(ctx)
	defer func() {
		if p := recover(); p != nil {
			n.metrics.panics.Inc()
			n.log.Error("panic in handler", "method", info.FullMethod, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			err = status.Errorf(codes.Internal, "internal error in %s", info.FullMethod)
		}
	}()
	if badUTF8 != nil {
		n.metrics.observeError(codes.InvalidArgument)
		return nil, badUTF8
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, n.cfg.DefaultDeadline)
		defer cancel()
	}
	obs, measured := n.metrics.methods[info.FullMethod]
	if !measured {
		resp, err = h(ctx, req)
		if auth.IsWrite(info.FullMethod) {
			n.audit(ctx, info.FullMethod, err)
		}
		return resp, err
	}
	start := time.Now()
	resp, err = h(ctx, req)
	obs.Observe(time.Since(start).Seconds())
	if err != nil {
		n.metrics.observeError(status.Code(err))
	}
	return resp, err
}

// recoverStream turns a panic in a stream handler into an Internal error,
// counted in tokenserver_panics_total.
func (n *Node) recoverStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
	defer func() {
		if p := recover(); p != nil {
			n.metrics.panics.Inc()
			n.log.Error("panic in handler", "method", info.FullMethod, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			err = status.Errorf(codes.Internal, "internal error in %s", info.FullMethod)
		}
	}()
	return h(srv, utf8Stream{ss})
}

// RegisterServices registers the node's services on another gRPC server
// (tests use a bufconn server).
func (n *Node) RegisterServices(s grpc.ServiceRegistrar) {
	pb.RegisterTokenServiceServer(s, &tokenService{n: n})
	pb.RegisterAdminServiceServer(s, &adminService{n: n})
}
