package server

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tokenserver/tokenserver/internal/auth"
	"github.com/tokenserver/tokenserver/internal/raftfsm"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// unary is the one unary interceptor: it authorizes the call (when auth is
// on), drops a client's forwarded marker (see dropForeignForward), refuses
// the data plane on a node removed from the cluster (decides), turns a
// panic into an Internal error, a log line and tokenserver_panics_total
// (bad input never takes the node down), gives calls without a deadline
// the default one, times data-plane calls into the decision latency
// histogram and audits writes.
func (n *Node) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (resp any, err error) {
	badUTF8 := n.codec.take(req) // taken first, so that it is always forgotten
	if n.auth != nil {
		if ctx, err = n.authorize(ctx, info.FullMethod); err != nil {
			return nil, err
		}
	}
	ctx = n.dropForeignForward(ctx)
	if decides[info.FullMethod] && n.removed() {
		n.metrics.observeError(codes.FailedPrecondition)
		return nil, toError(errRemovedNode)
	}
	defer func() {
		if p := recover(); p != nil {
			err = n.panicked(info.FullMethod, p)
		}
	}()
	if badUTF8 != nil {
		n.metrics.observeError(codes.InvalidArgument)
		return nil, toError(badUTF8)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, n.cfg.DefaultDeadline)
		defer cancel()
	}
	obs, measured := n.metrics.methods[info.FullMethod]
	if !measured {
		resp, err = n.traceCall(ctx, info.FullMethod, req, h)
		if auth.IsWrite(info.FullMethod) {
			n.audit(ctx, info.FullMethod, err)
		}
		if c, admin := n.metrics.admin[info.FullMethod]; admin {
			c.observe(codeOf(err))
		}
		return resp, err
	}
	start := time.Now()
	resp, err = n.traceCall(ctx, info.FullMethod, req, h)
	obs.Observe(time.Since(start).Seconds())
	if err != nil {
		n.metrics.observeError(codeOf(err))
	}
	return resp, err
}

// decides lists the data-plane methods, those that decide or change a
// bucket: a node removed from the cluster refuses them at once, since its
// stale view would have it decide keys that now belong to another node.
var decides = map[string]bool{
	pb.TokenService_AcquireToken_FullMethodName:          true,
	pb.TokenService_AcquireTokens_FullMethodName:         true,
	pb.TokenService_RefillToken_FullMethodName:           true,
	pb.TokenService_RenewLease_FullMethodName:            true,
	pb.TokenService_CommitToken_FullMethodName:           true,
	rlpb.RateLimitService_ShouldRateLimit_FullMethodName: true,
}

// errRemovedNode is the answer of a removed node to a data-plane call.
var errRemovedNode = failf(raftfsm.ErrRemoved, "this node was removed from the cluster; it decides nothing: call another member (the SDK routes by the cluster view), and start this node with a fresh --data-dir and --join to add it again")

// removed reports whether this node learned that it was removed from the
// Raft configuration (raftfsm.Node.Removed); a node without Raft never
// is.
func (n *Node) removed() bool {
	r, ok := n.data.(interface{ Removed() bool })
	return ok && r.Removed()
}

// panicked logs and counts a panic in a handler and returns the Internal
// error its caller gets.
func (n *Node) panicked(method string, p any) error {
	n.metrics.panics.Inc()
	n.log.Error("panic in handler", "method", method, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
	return toError(failf(ErrInternal, "internal error in %s", method))
}

// recoverStream turns a panic in a stream handler into an Internal error,
// counted in tokenserver_panics_total, and answers a streamed request with
// invalid UTF-8 InvalidArgument.
func (n *Node) recoverStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = n.panicked(info.FullMethod, p)
		}
	}()
	return h(srv, utf8Stream{ServerStream: ss, codec: n.codec})
}

// secureStream authorizes a streaming call, drops a client's forwarded
// marker, ends the stream Unauthenticated once its principal is revoked
// (auth.Authenticator.Revocable: a token dropped from the token file, a
// denied certificate, a node that left the membership) and audits writes
// (SnapshotRestore).
func (n *Node) secureStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	ctx := ss.Context()
	var err error
	if n.auth != nil {
		if ctx, err = n.authorize(ctx, info.FullMethod); err != nil {
			return err
		}
		var stop func()
		ctx, stop = n.auth.Revocable(ctx)
		defer stop()
	}
	ctx = n.dropForeignForward(ctx)
	if ctx != ss.Context() {
		ss = &ctxStream{ServerStream: ss, ctx: ctx}
	}
	err = h(srv, ss)
	if err == nil && errors.Is(context.Cause(ctx), auth.ErrRevoked) {
		err = auth.ErrRevoked // a handler that ends quietly when its context does
	}
	err = auth.StreamError(ctx, err)
	if auth.IsWrite(info.FullMethod) {
		n.audit(ctx, info.FullMethod, err)
	}
	return err
}

// ctxStream is a server stream with another context.
type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *ctxStream) Context() context.Context { return s.ctx }

// MaxAuthorizationBytes bounds the authorization header a call may carry:
// a longer one is refused Unauthenticated before it is hashed or looked
// up (tokens that tokenctl makes are under 100 bytes).
const MaxAuthorizationBytes = 1024

// authorize is the interceptors' first step: the caller's principal in
// ctx, or the status error (auth's) that refuses the call. A refused write
// from an authenticated caller is logged; every refusal is counted in
// tokenserver_auth_failures_total.
func (n *Node) authorize(ctx context.Context, method string) (context.Context, error) {
	for _, v := range metadata.ValueFromIncomingContext(ctx, "authorization") {
		if len(v) > MaxAuthorizationBytes {
			n.metrics.authFailures.WithLabelValues(codes.Unauthenticated.String()).Inc()
			return ctx, toError(failf(ErrUnauthenticated, "the authorization header is %d bytes; a bearer token is at most %d", len(v), MaxAuthorizationBytes))
		}
	}
	ctx, err := n.auth.Authorize(ctx, method)
	if err != nil {
		code := codeOf(err)
		n.metrics.authFailures.WithLabelValues(code.String()).Inc()
		if code == codes.PermissionDenied && auth.IsWrite(method) {
			n.log.Warn("audit: write refused", "method", method, "err", toStatus(err).Message())
		}
	}
	return ctx, err
}

// audit logs a write (rule put and delete, membership, snapshot restore)
// with its principal: the real author, also when a peer forwarded it.
func (n *Node) audit(ctx context.Context, method string, err error) {
	p, _ := auth.FromContext(ctx)
	attrs := append([]any{"method", method}, p.AuditAttrs()...)
	n.log.Info("audit", append(attrs, "code", codeOf(err).String())...)
}

// actor is who to record as a write's author (Rule.UpdatedBy): the
// caller's principal, "" when auth is off.
func actor(ctx context.Context) string {
	if p, ok := auth.FromContext(ctx); ok {
		return p.Actor()
	}
	return ""
}

// dropForeignForward removes the forwarded marker from a call that does not
// come from a peer, when peers can be told apart (TLS or auth on): a
// client that sets it is routed like any other call, instead of being
// served where it lands (N nodes would each grant it the limit). It costs
// one header lookup and allocates only when it removes the marker.
func (n *Node) dropForeignForward(ctx context.Context) context.Context {
	if !n.peersOnly || !forwarded(ctx) || auth.IsPeer(ctx) {
		return ctx
	}
	md, _ := metadata.FromIncomingContext(ctx)
	delete(md, ForwardedHeader)
	delete(md, auth.PrincipalHeader)
	return metadata.NewIncomingContext(ctx, md)
}
