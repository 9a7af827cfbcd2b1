package server

import (
	"cmp"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// newGRPCServer builds the node's gRPC server: its options and
// interceptors, TokenService, AdminService, health, reflection and the
// extra services of Deps.Services.
func (n *Node) newGRPCServer(extra []func(grpc.ServiceRegistrar)) (*grpc.Server, error) {
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(n.cfg.MaxRecvMsgSize),
		// Limits for callers who mean harm: streams per connection (grpc-go
		// runs at most this many handlers per connection, its rapid-reset
		// mitigation), the header block's size (read before any handler,
		// so a huge avoid header or bearer token is refused by the
		// transport), and seconds, not gRPC's two minutes, for a new
		// connection's handshake and preface.
		grpc.MaxConcurrentStreams(cmp.Or(n.cfg.MaxConcurrentStreams, DefaultMaxConcurrentStreams)),
		grpc.MaxHeaderListSize(cmp.Or(n.cfg.MaxHeaderListSize, DefaultMaxHeaderListSize)),
		grpc.ConnectionTimeout(cmp.Or(n.cfg.ConnectionTimeout, DefaultConnectionTimeout)),
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
		grpc.ForceServerCodecV2(n.codec),
		grpc.ChainStreamInterceptor(n.recoverStream, n.secureStream),
	}
	creds, err := n.cfg.Security.serverOption()
	if err != nil {
		return nil, err
	}
	if creds != nil {
		opts = append(opts, creds)
	}
	s := grpc.NewServer(opts...)
	n.RegisterServices(s)
	healthpb.RegisterHealthServer(s, &healthService{Server: n.health, limit: int64(cmp.Or(n.cfg.MaxHealthWatches, DefaultMaxHealthWatches))})
	reflection.Register(s)
	for _, register := range extra {
		register(s)
	}
	return s, nil
}

// RegisterServices registers the node's TokenService and AdminService on
// s. The node's own server has them already; this mounts them on another
// server too, as tests do that put a fault injector in front of the
// handlers. It does not run the node: Serve does.
func (n *Node) RegisterServices(s grpc.ServiceRegistrar) {
	pb.RegisterTokenServiceServer(s, &tokenService{n: n})
	pb.RegisterAdminServiceServer(s, &adminService{n: n})
	rlpb.RegisterRateLimitServiceServer(s, n.envoy)
}
