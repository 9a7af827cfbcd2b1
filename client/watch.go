package client

// Following the cluster view: one WatchClusterView stream at a time, moved
// to another member when it ends or falls silent.

import (
	"context"
	"slices"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/tokenserver/tokenserver/internal/backoff"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// watch follows WatchClusterView on a member (or a seed) until Close. A
// stream that ends is reconnected with full-jitter backoff; one on which no
// ready view arrives for watchSilence (servers send one at least every
// second) is moved at once to another member: its node froze, or cannot
// speak for the cluster yet.
func (c *Client) watch() {
	defer c.wg.Done()
	bo := backoff.New(backoff.Policy{Base: 50 * time.Millisecond, Max: 2 * time.Second})
	avoid := ""
	for i := 0; c.ctx.Err() == nil; i++ {
		addr := c.watchAddr(i, avoid)
		heard, silent := false, false
		if n, err := c.nodeAt(addr); err == nil {
			heard, silent = c.follow(n)
		}
		if c.ctx.Err() != nil {
			return
		}
		avoid = addr
		if heard {
			bo.Reset()
		}
		if silent {
			c.log.Warn("tokenserver client: no ready view on the watch stream; following another member", "addr", addr, "after", c.o.watchSilence)
			continue
		}
		wait, stop := bo.After()
		select {
		case <-c.ctx.Done():
			stop()
			return
		case <-c.watchNow:
			stop()
		case <-wait:
		}
	}
}

// follow applies the views of one WatchClusterView stream on n until it
// ends, or until no ready view has come for watchSilence (silent).
func (c *Client) follow(n *node) (heard, silent bool) {
	ctx, cancel := context.WithCancel(c.ctx)
	defer cancel()
	var quiet atomic.Bool
	t := time.AfterFunc(c.o.watchSilence, func() { quiet.Store(true); cancel() })
	defer t.Stop()
	c.m.rpcWatch.Inc()
	// Small heartbeats: the whole view (~1 MB at 5,000 rules) only when it
	// changed.
	wctx := metadata.AppendToOutgoingContext(ctx, pb.ViewHeartbeatHeader, "1")
	stream, err := n.tc.WatchClusterView(wctx, &pb.GetClusterViewRequest{})
	if err != nil {
		return false, quiet.Load()
	}
	for {
		v, err := stream.Recv()
		if err != nil {
			return heard, quiet.Load()
		}
		if !isHeartbeat(v) {
			c.applyView(v, true)
		}
		if v.GetReady() {
			heard = true
			t.Reset(c.o.watchSilence)
		}
	}
}

// watchAddrs lists where the watcher may connect: the view's members
// whose calls do not fail, then the seeds; the i-th is chosen, skipping
// avoid (the last one followed) when there is another.
func (c *Client) watchAddr(i int, avoid string) string {
	st := c.state.Load()
	var out []string
	for _, m := range st.view.Members() {
		if n := st.byID[m.ID]; n != nil && !n.failing.Load() {
			out = append(out, m.GRPCAddr)
		}
	}
	for _, s := range c.seeds {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	if len(out) > 1 {
		out = slices.DeleteFunc(out, func(a string) bool { return a == avoid })
	}
	return out[i%len(out)]
}
