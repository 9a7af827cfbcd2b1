package client

// Coalescing: a node's dispatcher gathers the acquires bound for it into
// AcquireTokens batches, group-commit style.

import (
	"context"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// call is one acquire waiting for its answer.
type call struct {
	req      *pb.AcquireTokenRequest
	avoid    *string // member ids the call must not be decided by (pb.AvoidHeader); nil for none, keeping call in its 80-byte size class
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
	err := status.Error(codes.Unavailable, errLeftMsg)
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
