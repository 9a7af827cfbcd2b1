package client

// Routing: which node a key's call goes to, and which members the call
// names in the avoid header.

import (
	"context"
	"slices"
	"strings"

	"google.golang.org/grpc/metadata"

	"github.com/tokenserver/tokenserver/internal/cluster"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// pick returns the node to send key's call to, and the member ids to name
// in the avoid header (the members believed down, and those that left the
// view lately): the key's owner; while the owner's breaker is open,
// or it could not decide this call (skip), the key's next owner in
// rendezvous order among the members believed live, which is where the view
// moves the key if the owner leaves it; without a view, a seed (the server
// routes). When every member is down it returns the owner, whose open
// breaker sends the call to fallback.
func (c *Client) pick(st *viewState, key string, skip []*node) (*node, string) {
	if st.view.Len() == 0 {
		return c.seedNode(skip), ""
	}
	h := cluster.KeyHash(key)
	m, _ := st.view.OwnerOfHash(h)
	owner := st.byID[m.ID]
	if owner != nil && !owner.open.Load() && !slices.Contains(skip, owner) {
		return owner, st.recentlyDeparted(c)
	}
	down := func(id string) bool {
		n := st.byID[id]
		return n == nil || n.open.Load() || slices.Contains(skip, n)
	}
	next, ok := st.view.OwnerExcept(h, down)
	if !ok {
		return owner, st.recentlyDeparted(c)
	}
	var avoid []string
	if d := st.recentlyDeparted(c); d != "" {
		avoid = append(avoid, d)
	}
	for _, m := range st.view.Members() {
		if down(m.ID) {
			avoid = append(avoid, m.ID)
		}
	}
	return st.byID[next.ID], strings.Join(avoid, ",")
}

// seedNode is the first seed not in skip (the first seed if all are).
func (c *Client) seedNode(skip []*node) *node {
	var first *node
	for _, s := range c.seeds {
		n, err := c.nodeAt(s)
		if err != nil {
			continue
		}
		if !slices.Contains(skip, n) {
			return n
		}
		if first == nil {
			first = n
		}
	}
	return first
}

// isMember reports whether n is a member of the client's view.
func (c *Client) isMember(n *node) bool {
	for _, x := range c.state.Load().byID {
		if x == n {
			return true
		}
	}
	return false
}

// target returns the node for a call about key (refill, renew, release)
// and ctx with the avoid header it needs.
func (c *Client) target(ctx context.Context, key string) (*node, context.Context) {
	n, avoid := c.pick(c.state.Load(), key, nil)
	return n, withAvoid(ctx, avoid)
}

// withAvoid adds the avoid header (pb.AvoidHeader: member ids,
// comma-separated, the call must not be decided by) to ctx when avoid is
// set.
func withAvoid(ctx context.Context, avoid string) context.Context {
	if avoid == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, pb.AvoidHeader, avoid)
}
