package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
)

// Retries are gRPC's own (as grpc-go's examples/features/retry): every
// method waits for the connection to be ready (waitForReady) and retries
// UNAVAILABLE answers with exponential backoff and jitter (retryPolicy),
// both bounded by the call's deadline, --timeout. Attempts are capped high
// (maxCallAttempts) so that the deadline, not a count, ends the retries, as
// the hand-written loop this replaces did. Rule writes with
// expected_version are retried too, as they always were: a retried write
// whose first attempt did commit answers FailedPrecondition.
const (
	retryInitial = 50 * time.Millisecond
	retryMax     = 2 * time.Second
	// maxCallAttempts is far more attempts than --timeout leaves room for.
	maxCallAttempts = 1000
	// retryBufferBytes keeps calls up to this size retryable (gRPC stops
	// retrying a call whose messages outgrow its retry buffer); a rule is
	// at most 1 MiB.
	retryBufferBytes = 4 << 20
)

var serviceConfig = fmt.Sprintf(`{
  "methodConfig": [{
    "name": [{}],
    "waitForReady": true,
    "retryPolicy": {
      "maxAttempts": %d,
      "initialBackoff": "%gs",
      "maxBackoff": "%gs",
      "backoffMultiplier": 2,
      "retryableStatusCodes": ["UNAVAILABLE"]
    }
  }]
}`, maxCallAttempts, retryInitial.Seconds(), retryMax.Seconds())

// retryDialOptions are the dial options of every connection but bench's
// load: the service config, reconnection with the same backoff, and the
// interceptors and stats handler that report waiting and retries.
func (a *app) retryDialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithDefaultServiceConfig(serviceConfig),
		grpc.WithMaxCallAttempts(maxCallAttempts),
		grpc.WithDefaultCallOptions(grpc.MaxRetryRPCBufferSize(retryBufferBytes)),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: backoff.Config{BaseDelay: retryInitial, Multiplier: 1.6, Jitter: 0.2, MaxDelay: retryMax},
			// gRPC's default; left zero, a connection attempt would get
			// only the backoff delay.
			MinConnectTimeout: 20 * time.Second,
		}),
		grpc.WithChainUnaryInterceptor(a.unaryInterceptor),
		grpc.WithChainStreamInterceptor(a.streamInterceptor),
		grpc.WithStatsHandler(&attemptLog{a: a}),
	}
}

// unaryInterceptor logs while the connection is down and turns the end of
// a call that never got an answer into Unavailable naming the server.
func (a *app) unaryInterceptor(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	ctx, rec := withAttempts(ctx)
	defer a.watchConn(ctx, cc)()
	return a.unreachable(cc, rec, invoker(ctx, method, req, reply, cc, opts...))
}

// streamInterceptor is unaryInterceptor for streams: a stream waits for
// the connection, and is retried, when it is created.
func (a *app) streamInterceptor(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	ctx, rec := withAttempts(ctx)
	defer a.watchConn(ctx, cc)()
	s, err := streamer(ctx, desc, cc, method, opts...)
	return s, a.unreachable(cc, rec, err)
}

// watchConn logs each time cc fails to connect until ctx ends or the
// returned stop is called (which waits for the watcher to end).
func (a *app) watchConn(ctx context.Context, cc *grpc.ClientConn) (stop func()) {
	if cc.GetState() == connectivity.Ready {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		for s := cc.GetState(); s != connectivity.Ready && s != connectivity.Shutdown; s = cc.GetState() {
			if s == connectivity.TransientFailure {
				a.logf("%s is unavailable, retrying until --timeout %v", a.server, a.timeout)
			}
			if !cc.WaitForStateChange(ctx, s) {
				return
			}
		}
	})
	return func() { cancel(); wg.Wait() }
}

// unreachable turns the DeadlineExceeded of a call that got no answer but
// Unavailable (or never reached the server: its connection is not ready)
// into Unavailable naming the server, as the caller of a call that ran out
// of retries wants to read it. rec may be nil.
func (a *app) unreachable(cc *grpc.ClientConn, rec *attempts, err error) error {
	if status.Code(err) != codes.DeadlineExceeded {
		return err
	}
	if n, last := rec.unavailable(); n > 0 {
		return status.Errorf(codes.Unavailable, "server %s did not answer within --timeout %v (%d attempts): %s", a.server, a.timeout, n, last)
	}
	if cc.GetState() == connectivity.Ready {
		return err
	}
	return status.Errorf(codes.Unavailable, "server %s did not answer within --timeout %v: %s", a.server, a.timeout, status.Convert(err).Message())
}

// attempts counts a call's attempts that ended Unavailable; attemptLog
// fills it from gRPC's per-attempt stats.
type attempts struct {
	mu   sync.Mutex
	n    int
	last string
}

type attemptsKey struct{}

func withAttempts(ctx context.Context) (context.Context, *attempts) {
	rec := new(attempts)
	return context.WithValue(ctx, attemptsKey{}, rec), rec
}

func (r *attempts) add(msg string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.n++
	r.last = msg
	return r.n
}

func (r *attempts) unavailable() (int, string) {
	if r == nil {
		return 0, ""
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n, r.last
}

// attemptLog is a stats.Handler that logs and counts the attempts that end
// Unavailable, which gRPC retries.
type attemptLog struct{ a *app }

func (l *attemptLog) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

func (l *attemptLog) HandleRPC(ctx context.Context, s stats.RPCStats) {
	end, ok := s.(*stats.End)
	if !ok || status.Code(end.Error) != codes.Unavailable {
		return
	}
	msg := status.Convert(end.Error).Message()
	n := 0
	if rec, ok := ctx.Value(attemptsKey{}).(*attempts); ok {
		n = rec.add(msg)
	}
	l.a.logf("%s is unavailable (attempt %d), retrying until --timeout %v: %s", l.a.server, n, l.a.timeout, msg)
}

func (l *attemptLog) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

func (l *attemptLog) HandleConn(context.Context, stats.ConnStats) {}

// rpcError is a failed call: what tokenctl was doing and the gRPC status.
type rpcError struct {
	what string
	st   *status.Status
}

func (e *rpcError) Error() string {
	return fmt.Sprintf("%s: %s: %s", e.what, e.st.Code(), e.st.Message())
}

// GRPCStatus lets status.Code and status.FromError see the status.
func (e *rpcError) GRPCStatus() *status.Status { return e.st }

// call runs f with a deadline of at most --timeout; gRPC retries what is
// retryable (see serviceConfig). what names the operation in errors.
func (a *app) call(ctx context.Context, what string, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	if err := f(ctx); err != nil {
		return a.wrap(what, err)
	}
	return nil
}

// wrap turns a call's error into an rpcError naming what failed.
func (a *app) wrap(what string, err error) error {
	st := status.Convert(err)
	if st.Code() == codes.Canceled || errors.Is(err, context.Canceled) {
		return fmt.Errorf("%s: interrupted", what)
	}
	if st.Code() == codes.DeadlineExceeded {
		st = status.Newf(codes.DeadlineExceeded, "no answer from %s within --timeout %v: %s", a.server, a.timeout, st.Message())
	}
	return &rpcError{what: what, st: st}
}
