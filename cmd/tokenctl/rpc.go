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
// whose first attempt did commit answers FailedPrecondition, which
// reconcileWrite (reconcile.go) recognizes by reading the rule back.
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
// interceptors and stats handler that report waiting and retries and end
// a call whose connection failed for good (failfast.go, through probe).
func (a *app) retryDialOptions(probe *connProbe) []grpc.DialOption {
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
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			ctx, rec := withAttempts(ctx)
			ctx, cancel := context.WithCancelCause(ctx)
			defer cancel(nil)
			stop := a.watchConn(ctx, cc, probe, cancel)
			err := invoker(ctx, method, req, reply, cc, opts...)
			stop()
			if err = a.unreachable(ctx, cc, rec, err); err != nil {
				// A write retried after Unavailable may have committed
				// (reconcile.go).
				err = a.reconcileWrite(ctx, cc, method, req, reply, rec, err)
			}
			return err
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			// A stream waits for the connection, and is retried, when it
			// is created; the stream keeps ctx, so it is not cancelled
			// once created.
			ctx, rec := withAttempts(ctx)
			sctx, cancel := context.WithCancelCause(ctx)
			stop := a.watchConn(sctx, cc, probe, cancel)
			s, err := streamer(sctx, desc, cc, method, opts...)
			stop()
			if err != nil {
				defer cancel(nil)
				return nil, a.unreachable(sctx, cc, rec, err)
			}
			return &cancelOnEnd{ClientStream: s, cancel: func() { cancel(nil) }}, nil
		}),
		grpc.WithStatsHandler(&attemptLog{a: a}),
	}
}

// cancelOnEnd is a client stream that releases its context when it ends.
type cancelOnEnd struct {
	grpc.ClientStream
	cancel func()
}

func (s *cancelOnEnd) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err != nil {
		s.cancel()
	}
	return err
}

// watchConn logs each time cc fails to connect, and ends the call through
// cancel when probe finds the failure permanent, until ctx ends or the
// returned stop is called (which waits for the watcher to end).
func (a *app) watchConn(ctx context.Context, cc *grpc.ClientConn, probe *connProbe, cancel context.CancelCauseFunc) (stop func()) {
	if cc.GetState() == connectivity.Ready {
		return func() {}
	}
	ctx, stopWatch := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		logged := false
		for s := cc.GetState(); s != connectivity.Ready && s != connectivity.Shutdown; s = cc.GetState() {
			if s == connectivity.TransientFailure {
				if err := probe.permanent(ctx); err != nil {
					cancel(err)
					return
				}
				if !logged {
					a.logf("%s is unavailable, retrying until --timeout %v", a.server, a.timeout)
				}
				logged = true
				// The channel stays in TRANSIENT_FAILURE while it
				// reconnects (pick_first's sticky failure), so probe
				// again after a while even without a state change.
				wait, cancelWait := context.WithTimeout(ctx, probeInterval)
				cc.WaitForStateChange(wait, s)
				cancelWait()
				if ctx.Err() != nil {
					return
				}
				continue
			}
			logged = false
			if !cc.WaitForStateChange(ctx, s) {
				return
			}
		}
	})
	return func() { stopWatch(); wg.Wait() }
}

// unreachable turns the DeadlineExceeded of a call that got no answer but
// Unavailable (or never reached the server: its connection is not ready)
// into Unavailable naming the server, as the caller of a call that ran out
// of retries wants to read it, and a call ended by a permanent connection
// failure into Unavailable saying why. rec may be nil.
func (a *app) unreachable(ctx context.Context, cc *grpc.ClientConn, rec *attempts, err error) error {
	var perm *permanentError
	if err != nil && errors.As(context.Cause(ctx), &perm) {
		return status.Error(codes.Unavailable, perm.Error())
	}
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
