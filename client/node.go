package client

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// errBreakerOpen is the cause of a fallback decision while a node's breaker
// is open.
var errBreakerOpen = status.Error(codes.Unavailable, "circuit breaker open")

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

	failing atomic.Bool // the last call or probe failed
	open    atomic.Bool // breaker open: calls go straight to fallback
	mu      sync.Mutex  // guards fails and probing
	fails   int
	probing bool
}

func newNode(c *Client, addr string) (*node, error) {
	conn, err := grpc.NewClient(addr, c.dialOptions()...)
	if err != nil {
		return nil, err
	}
	return &node{c: c, addr: addr, conn: conn, tc: pb.NewTokenServiceClient(conn),
		in: make(chan *call, MaxBatch), stop: make(chan struct{})}, nil
}

// stopDispatch stops the dispatcher; calls waiting in it fail.
func (n *node) stopDispatch() { n.stopOnce.Do(func() { close(n.stop) }) }

// close stops the node after it left the view.
func (n *node) close() {
	n.stopDispatch()
	_ = n.conn.Close()
}

// call is one acquire waiting for its answer.
type call struct {
	req      *pb.AcquireTokenRequest
	avoid    *string // member ids the call must not be decided by (avoidHeader); nil for none, keeping call in its 80-byte size class
	deadline time.Time
	resp     *pb.AcquireTokenResponse
	err      error
	done     chan struct{}
	state    atomic.Int32 // callWaiting, callAnswered, callAbandoned
}

const (
	callWaiting int32 = iota
	callAnswered
	callAbandoned
)

// avoidHeader is the server's AvoidHeader: member ids, comma-separated,
// that the client cannot reach; the server sends their keys to their next
// owners.
const avoidHeader = "x-tokenserver-avoid"

// withAvoid adds the avoid header to ctx when avoid is set.
func withAvoid(ctx context.Context, avoid string) context.Context {
	if avoid == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, avoidHeader, avoid)
}

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
		return nil, status.Error(codes.Unavailable, "node left the view or client closed")
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

// maxInFlight is how many batch RPCs one node's dispatcher keeps in flight
// before further calls wait to travel together.
const maxInFlight = 2

// dispatch coalesces calls like a group commit, until the node stops: a
// call that finds fewer than maxInFlight batches in flight leaves at once,
// with every call already queued; calls that arrive while maxInFlight
// batches are out wait until one returns, or at most the coalescing
// window, and then leave together. So an idle client adds no latency (no
// timer: Go's timers are coarse when the process is idle), and a busy one
// sends one RPC per round trip per node with everything that piled up.
func (n *node) dispatch() {
	var (
		batch  []*call
		timer  *time.Timer
		timerC <-chan time.Time
		free   = make(chan struct{}, maxInFlight) // a batch came back
	)
	inFlight := 0
	for {
		forced := false
		select {
		case cl := <-n.in:
			batch = append(batch, cl)
		case <-free:
			inFlight--
		case <-timerC:
			timerC, forced = nil, true
		case <-n.stop:
			if timer != nil {
				timer.Stop()
			}
			n.drain(batch)
			return
		}
	gather: // whatever is queued already goes too
		for len(batch) < MaxBatch {
			select {
			case cl := <-n.in:
				batch = append(batch, cl)
			default:
				break gather
			}
		}
		if len(batch) == 0 {
			continue
		}
		if inFlight >= maxInFlight && !forced && len(batch) < MaxBatch {
			if timerC == nil {
				if timer == nil {
					timer = time.NewTimer(n.c.o.coalesceWindow)
				} else {
					timer.Reset(n.c.o.coalesceWindow)
				}
				timerC = timer.C
			}
			continue
		}
		if timerC != nil {
			timer.Stop()
			timerC = nil
		}
		b := batch
		batch = make([]*call, 0, len(b))
		inFlight++
		if !n.c.goTracked(func() {
			n.send(b)
			select {
			case free <- struct{}{}:
			case <-n.stop:
			}
		}) {
			n.drain(b)
			return
		}
	}
}

// drain fails the calls of a batch that will not be sent, and those still
// queued.
func (n *node) drain(batch []*call) {
	err := status.Error(codes.Unavailable, "node left the view or client closed")
	for _, cl := range batch {
		cl.answer(nil, err)
	}
	for {
		select {
		case cl := <-n.in:
			cl.answer(nil, err)
		default:
			return
		}
	}
}

// answer delivers resp or err to the caller; a caller that gave up gets
// nothing, and tokens granted to it go back to the server.
func (cl *call) answer(resp *pb.AcquireTokenResponse, err error) (abandoned bool) {
	if !cl.state.CompareAndSwap(callWaiting, callAnswered) {
		return true
	}
	cl.resp, cl.err = resp, err
	close(cl.done)
	return false
}

// send sends one batch as one RPC (AcquireToken for a single call) with
// the latest deadline of its calls.
func (n *node) send(batch []*call) {
	dl := batch[0].deadline
	for _, cl := range batch[1:] {
		if cl.deadline.After(dl) {
			dl = cl.deadline
		}
	}
	ctx, cancel := context.WithDeadline(n.c.ctx, dl)
	defer cancel()
	ctx = withAvoid(ctx, batchAvoid(batch))
	budget := time.Until(dl)
	n.c.m.batch.Observe(float64(len(batch)))
	var lost []*call // abandoned calls that got a grant
	if len(batch) == 1 {
		var resp *pb.AcquireTokenResponse
		err := n.invoke(ctx, n.c.m.rpcAcquire, 0, func(ctx context.Context) (err error) {
			resp, err = n.tc.AcquireToken(ctx, batch[0].req)
			return err
		})
		n.record(ctx, budget, err)
		if batch[0].answer(resp, err) && resp.GetGrantId() != "" {
			lost = batch
			batch[0].resp = resp
		}
	} else {
		req := &pb.AcquireTokensRequest{Requests: make([]*pb.AcquireTokenRequest, len(batch))}
		for i, cl := range batch {
			req.Requests[i] = cl.req
		}
		var resp *pb.AcquireTokensResponse
		err := n.invoke(ctx, n.c.m.rpcAcquireBatch, 0, func(ctx context.Context) (err error) {
			resp, err = n.tc.AcquireTokens(ctx, req)
			return err
		})
		if err == nil && len(resp.GetResults()) != len(batch) {
			err = status.Errorf(codes.Internal, "server answered %d items for %d", len(resp.GetResults()), len(batch))
		}
		n.record(ctx, budget, err)
		for i, cl := range batch {
			var r *pb.AcquireTokenResponse
			e := err
			if err == nil {
				res := resp.GetResults()[i]
				if st := res.GetStatus(); st != nil && codes.Code(st.GetCode()) != codes.OK {
					e = status.ErrorProto(st)
				} else {
					r = res.GetResponse()
				}
			}
			if cl.answer(r, e) && r.GetGrantId() != "" {
				cl.resp = r
				lost = append(lost, cl)
			}
		}
	}
	// Tokens granted to callers that gave up go back (best effort).
	for _, cl := range lost {
		rctx, rcancel := context.WithTimeout(n.c.ctx, n.c.o.callTimeout)
		n.c.m.rpcRefill.Inc()
		_, _ = n.tc.RefillToken(rctx, &pb.RefillTokenRequest{Rule: cl.req.GetRule(), Key: cl.req.GetKey(), GrantId: cl.resp.GetGrantId()})
		rcancel()
	}
}

// batchAvoid is the union of the avoid lists of a batch's calls. Naming a
// member for a call that did not is harmless: the server only reroutes the
// keys of the named members, and a call reaches a node that is not its
// key's owner only when the owner is named.
func batchAvoid(batch []*call) string {
	out := ""
	for _, cl := range batch {
		if cl.avoid == nil {
			continue
		}
		if a := *cl.avoid; a != out && !strings.Contains(","+out+",", ","+a+",") {
			if out != "" {
				out += ","
			}
			out += a
		}
	}
	return out
}

// Retry policy for calls that never reached a server.
const (
	maxRetries   = 2
	retryBackoff = 5 * time.Millisecond
)

// invoke runs rpc, retrying it (at most retries times, with jittered
// backoff, within ctx's deadline) only when it provably never reached the
// server: the connection could not be made. Acquires pass 0: the Limiter
// sends them to another member instead.
func (n *node) invoke(ctx context.Context, counter interface{ Inc() }, retries int, rpc func(context.Context) error) error {
	for attempt := 0; ; attempt++ {
		counter.Inc()
		err := rpc(ctx)
		if err == nil || attempt >= retries || !notSent(err) {
			return err
		}
		wait := fullJitter(attempt, retryBackoff, 4*retryBackoff)
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < wait+time.Millisecond {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// notSent reports whether err proves that the call never reached a server:
// gRPC failed it while picking a connection, because dialing failed
// (connection refused, no route) or there was no address. A call that was
// written to a connection that later broke, or that timed out, is not
// retried: it may have spent tokens.
func notSent(err error) bool {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unavailable {
		return false
	}
	msg := st.Message()
	return strings.Contains(msg, "Error while dialing") ||
		strings.Contains(msg, "connection refused") ||
		strings.Contains(msg, "produced zero addresses") ||
		// The connection closed before the server's preface: it never
		// became ready, so no call was written to it (the picker failed
		// the call with the connection's last error).
		strings.Contains(msg, "error reading server preface") ||
		strings.Contains(msg, "failed to write client preface")
}

// notReadyReason is the server's NotReadyReason.
const notReadyReason = "NOT_READY"

// isNotReady reports whether err is a node's answer that it cannot decide
// yet (no routing view, or its Raft log not replayed): the node was
// reached and decided nothing, so the call may go again, to it or to
// another member. Servers before the reason existed said "no routing view".
func isNotReady(err error) bool {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unavailable {
		return false
	}
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.GetReason() == notReadyReason {
			return true
		}
	}
	return strings.Contains(st.Message(), "no routing view")
}

// isNodeFailure reports whether err says the node could not answer (as
// opposed to an answer that is an error, like NotFound or
// ResourceExhausted).
func isNodeFailure(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Internal, codes.Unknown:
		return true
	}
	return false
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

// budget is the time left before ctx's deadline (the call timeout if none).
func (n *node) budget(ctx context.Context) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		return time.Until(dl)
	}
	return n.c.o.callTimeout
}

// success closes the breaker.
func (n *node) success() {
	if !n.failing.Load() && !n.open.Load() {
		n.mu.Lock()
		n.fails = 0
		n.mu.Unlock()
		return
	}
	n.mu.Lock()
	n.fails = 0
	n.open.Store(false)
	changed := n.failing.Swap(false)
	n.mu.Unlock()
	if changed {
		n.c.updateMode()
	}
}

// failure counts a failure; the breaker opens after breakerFails in a row.
// A failing node is probed until it answers.
func (n *node) failure() {
	n.mu.Lock()
	n.fails++
	if n.fails >= n.c.o.breakerFails && !n.open.Load() {
		n.open.Store(true)
		n.c.log.Warn("tokenserver client: circuit breaker open", "addr", n.addr, "failures", n.fails)
	}
	changed := !n.failing.Swap(true)
	startProbe := !n.probing
	n.probing = true
	n.mu.Unlock()
	if changed {
		n.c.updateMode()
	}
	if startProbe && !n.c.goTracked(n.probe) {
		n.mu.Lock()
		n.probing = false
		n.mu.Unlock()
	}
}

// probe asks the node for its view with full-jitter exponential backoff
// until it answers within the call timeout as a ready node, then closes the
// breaker and applies the view it answered. The backoff grows to probeMax,
// but only to probeLiveMax while the node is a member of the client's view:
// a node the cluster says is live is used again as soon as it answers.
func (n *node) probe() {
	for attempt := 0; ; attempt++ {
		n.mu.Lock()
		if !n.failing.Load() { // a call or probe succeeded
			n.probing = false
			n.mu.Unlock()
			return
		}
		n.mu.Unlock()
		maxD := n.c.o.probeMax
		if n.c.isMember(n) {
			maxD = min(maxD, n.c.o.probeLiveMax)
		}
		t := time.NewTimer(fullJitter(attempt, n.c.o.probeMin, maxD))
		select {
		case <-n.stop:
			t.Stop()
			n.mu.Lock()
			n.probing = false
			n.mu.Unlock()
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(n.c.ctx, max(n.c.o.callTimeout, 100*time.Millisecond))
		n.c.m.rpcView.Inc()
		v, err := n.tc.GetClusterView(ctx, &pb.GetClusterViewRequest{})
		cancel()
		if err != nil {
			continue
		}
		n.c.applyView(v, false)
		if v.GetReady() {
			n.c.log.Info("tokenserver client: node answers again", "addr", n.addr)
			n.success()
		}
	}
}
