package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Backoff between retries of calls that fail with Unavailable.
const (
	retryInitial = 50 * time.Millisecond
	retryMax     = 2 * time.Second
	// retryMargin is the least time left for which one more attempt is made.
	retryMargin = 20 * time.Millisecond
)

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

// call runs f, retrying it while it fails with Unavailable, with exponential
// backoff and full jitter, until ctx ends. what names the operation in
// errors and logs. When ctx ends during the retries the error says the
// server was unreachable and why.
func (a *app) call(ctx context.Context, what string, f func(context.Context) error) error {
	backoff := retryInitial
	var last error // the last Unavailable
	for attempt := 1; ; attempt++ {
		err := f(ctx)
		if err == nil {
			return nil
		}
		code := status.Code(err)
		if code != codes.Unavailable {
			if last != nil && (code == codes.DeadlineExceeded || ctx.Err() != nil) {
				return a.unreachable(what, attempt-1, last)
			}
			return a.wrap(what, err)
		}
		last = err
		sleep := backoff/2 + rand.N(backoff/2+1)
		if dl, ok := ctx.Deadline(); ok {
			// Use what is left of the deadline for a last attempt.
			left := time.Until(dl) - retryMargin
			if left <= 0 {
				return a.unreachable(what, attempt, last)
			}
			sleep = min(sleep, left)
		}
		a.logf("%s: %s is unavailable (attempt %d), retrying in %v: %s", what, a.server, attempt, sleep.Round(time.Millisecond), status.Convert(err).Message())
		t := time.NewTimer(sleep)
		select {
		case <-ctx.Done():
			t.Stop()
			return a.unreachable(what, attempt, last)
		case <-t.C:
		}
		backoff = min(2*backoff, retryMax)
	}
}

// unreachable is the error of a call that was Unavailable until --timeout.
func (a *app) unreachable(what string, attempts int, last error) error {
	st := status.Convert(last)
	return &rpcError{what: what, st: status.Newf(codes.Unavailable,
		"server %s did not answer within --timeout %v (%d attempts): %s", a.server, a.timeout, attempts, st.Message())}
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
