package client

// One server address: its connection, the entry point of its acquires, and
// the retry of calls that never reached it.

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tokenserver/tokenserver/internal/backoff"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// node is one server address: its connection, its dispatcher that coalesces
// acquires, and its circuit breaker.
type node struct {
	c    *Client
	addr string
	conn *grpc.ClientConn
	tc   pb.TokenServiceClient

	in       chan *call
	stop     chan struct{}
	stopOnce sync.Once
	dispOnce sync.Once

	breaker // fed by record; read by routing and the fallback mode
}

// newNode dials addr (lazily: grpc.NewClient connects on the first call).
func newNode(c *Client, addr string) (*node, error) {
	conn, err := grpc.NewClient(addr, c.dialOptions()...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	n := &node{c: c, addr: addr, conn: conn, tc: pb.NewTokenServiceClient(conn),
		in: make(chan *call, MaxBatch), stop: make(chan struct{})}
	n.breaker.env = breakerEnv{
		threshold: c.o.breakerFails,
		probeWait: backoff.Policy{Base: c.o.probeMin, Max: c.o.probeMax},
		probeMax:  n.probeMax,
		probe:     n.probeOnce,
		changed:   c.updateMode,
		spawn:     c.goTracked,
		stop:      n.stop,
		log:       c.log.With("addr", addr),
	}
	return n, nil
}

// stopDispatch stops the dispatcher; calls waiting in it fail.
func (n *node) stopDispatch() { n.stopOnce.Do(func() { close(n.stop) }) }

// acquire sends one acquire to the node: through the dispatcher when
// coalescing, else as its own RPC. ctx carries the call's deadline; avoid
// names the members the call must not be decided by.
func (n *node) acquire(ctx context.Context, req *pb.AcquireTokenRequest, avoid string) (*pb.AcquireTokenResponse, error) {
	if n.open.Load() {
		return nil, errBreakerOpen
	}
	if n.c.o.coalesceWindow <= 0 {
		var resp *pb.AcquireTokenResponse
		budget := n.budget(ctx)
		err := n.invoke(withAvoid(ctx, avoid), n.c.m.rpcAcquire, 0, func(ctx context.Context) (err error) {
			resp, err = n.tc.AcquireToken(ctx, req)
			return err
		})
		n.record(ctx, budget, err)
		return resp, err
	}
	n.dispOnce.Do(func() {
		if !n.c.goTracked(n.dispatch) {
			n.stopDispatch()
		}
	})
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(n.c.o.callTimeout)
	}
	cl := &call{req: req, deadline: dl, done: make(chan struct{})}
	if avoid != "" {
		a := avoid // only this branch allocates (&avoid would move the parameter to the heap on every call)
		cl.avoid = &a
	}
	select {
	case n.in <- cl:
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	case <-n.stop:
		return nil, status.Error(codes.Unavailable, errLeftMsg)
	}
	select {
	case <-cl.done:
		return cl.resp, cl.err
	case <-ctx.Done():
		if cl.state.CompareAndSwap(callWaiting, callAbandoned) {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		<-cl.done // being answered right now
		return cl.resp, cl.err
	}
}

// Retry policy for calls that never reached a server: at most maxRetries
// more attempts, with full-jitter waits from retryBackoff up to
// 4×retryBackoff.
const (
	maxRetries   = 2
	retryBackoff = 5 * time.Millisecond
)

// invoke runs rpc, retrying it (at most retries times, with jittered
// backoff, within ctx's deadline) only when it provably never reached the
// server: the connection could not be made. Acquires pass 0: the Limiter
// sends them to another member instead.
func (n *node) invoke(ctx context.Context, counter interface{ Inc() }, retries int, rpc func(context.Context) error) error {
	var bo *backoff.Backoff // only a retry needs one
	for attempt := 0; ; attempt++ {
		counter.Inc()
		err := rpc(ctx)
		if err == nil || attempt >= retries || !notSent(err) {
			return err
		}
		if bo == nil {
			bo = backoff.New(backoff.Policy{Base: retryBackoff, Max: 4 * retryBackoff})
		}
		if !bo.Sleep(ctx, time.Millisecond) {
			return err
		}
	}
}

// budget is the time left before ctx's deadline (the call timeout if none).
func (n *node) budget(ctx context.Context) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		return time.Until(dl)
	}
	return n.c.o.callTimeout
}
