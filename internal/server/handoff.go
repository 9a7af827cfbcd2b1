package server

import (
	"context"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/tokenserver/tokenserver/internal/auth"
	"github.com/tokenserver/tokenserver/internal/cluster"
	"github.com/tokenserver/tokenserver/internal/handoff"
	peerv1 "github.com/tokenserver/tokenserver/proto/tokenserver/peer/v1"
)

// Bucket handoff (internal/handoff): on a planned move of keys (this node
// drains, another joins or comes back) the old owner sends the moved
// buckets to their new owners, which hold decisions on those keys back
// until the state has come (at most handoff.DefaultWait).

// handoffRetry is the pause between attempts to hand buckets over.
const handoffRetry = 200 * time.Millisecond

// handoffLocal is this node as package handoff sees it.
func (n *Node) handoffLocal() handoff.Local {
	return handoff.Local{ID: n.data.ID(), Buckets: n.buckets, Table: n.data.Table, Now: func() int64 { return n.now() }}
}

// newHandoff builds the node's handoff receiver and registers its
// peer-only service.
func (n *Node) newHandoff() func(grpc.ServiceRegistrar) {
	n.handoff = handoff.NewReceiver(n.handoffLocal(), func(ctx context.Context) bool { return !n.peersOnly || auth.IsPeer(ctx) }, n.data.View)
	n.metrics.reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tokenserver_handoff_sent_buckets_total", Help: "Buckets this node handed over to new owners of their keys."},
			func() float64 { return float64(n.handoff.SentBuckets.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tokenserver_handoff_sent_bytes_total", Help: "Bytes of bucket state this node handed over."},
			func() float64 { return float64(n.handoff.SentBytes.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tokenserver_handoff_installed_buckets_total", Help: "Buckets handed over to this node and installed."},
			func() float64 { return float64(n.handoff.Installed.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tokenserver_handoff_expired_waits_total", Help: "Decisions whose wait for a handed-over bucket ran out (the key may start fresh)."},
			func() float64 { return float64(n.handoff.Expired.Load()) }),
		&exposureCollector{n: n},
	)
	return func(s grpc.ServiceRegistrar) { peerv1.RegisterHandoffServiceServer(s, n.handoff) }
}

// exposureDesc is tokenserver_overadmission_bound_permits.
var exposureDesc = prometheus.NewDesc("tokenserver_overadmission_bound_permits",
	"Per rule, the over-admission this node's own actions currently expose, in permits: keys it started fresh after an unplanned move or a handoff that did not come, times the key's capacity, for one period of the rule. See docs/operations.md.",
	[]string{"rule"}, nil)

// exposureCollector reports exposureDesc on every scrape.
type exposureCollector struct{ n *Node }

func (c *exposureCollector) Describe(ch chan<- *prometheus.Desc) { ch <- exposureDesc }

func (c *exposureCollector) Collect(ch chan<- prometheus.Metric) {
	t := c.n.data.Table()
	for _, r := range t.Rules() {
		ch <- prometheus.MustNewConstMetric(exposureDesc, prometheus.GaugeValue, float64(c.n.handoff.Exposure(t.Get(r.Name), time.Now())), r.Name)
	}
}

// dialPeer opens (or reuses) the connection to a peer.
func (n *Node) dialPeer(addr string) (grpc.ClientConnInterface, error) { return n.peers.conn(addr) }

// prepareHandoff tells the members that take this node's keys once it
// leaves the view to hold those keys back until they arrive.
func (n *Node) prepareHandoff(ctx context.Context) {
	self := n.data.ID()
	for _, m := range n.data.View().Members() {
		if m.ID == self {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		if err := handoff.Prepare(cctx, n.handoffLocal(), m, n.dialPeer, handoff.DefaultWait); err != nil {
			n.log.Warn("handoff: could not announce the drain", "member", m.ID, "err", err)
		}
		cancel()
	}
}

// handOver sends the buckets this node no longer owns in the current view
// to their owners, until done or ctx ends.
func (n *Node) handOver(ctx context.Context, why string) {
	start := time.Now()
	self := n.data.ID()
	moved := func(_, key string) (cluster.Member, bool) {
		m, ok := n.data.View().Owner(key)
		return m, ok && m.ID != self
	}
	buckets, bytes, err := handoff.Send(ctx, n.handoffLocal(), moved, n.dialPeer, handoffRetry)
	n.handoff.SentBuckets.Add(buckets)
	n.handoff.SentBytes.Add(bytes)
	if err != nil {
		n.log.Warn("handoff: buckets not handed over; their keys start fresh on their new owners", "why", why, "buckets_sent", buckets, "err", err)
		return
	}
	if buckets > 0 {
		n.log.Info("handoff: buckets handed over", "why", why, "buckets", buckets, "bytes", bytes, "took", time.Since(start))
	}
}

// watchMoves hands buckets over when the view moves keys away from this
// node while it stays a member (a member joins or comes back), and, when
// this node enters the view, holds keys back until the members that held
// them have handed them over. A drain is Stop's (prepareHandoff,
// handOver).
func (n *Node) watchMoves() {
	defer n.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-n.done; cancel() }()
	self := n.data.ID()
	in := func(v *cluster.View) bool {
		return slices.ContainsFunc(v.Members(), func(m cluster.Member) bool { return m.ID == self })
	}
	old, ch := n.data.View(), n.data.ViewChanged()
	for {
		select {
		case <-n.done:
			return
		case <-ch:
		}
		cur, next := n.data.View(), n.data.ViewChanged()
		if in(cur) {
			// Members gone without announcing a drain failed: their keys
			// start fresh here, which the exposure metric counts.
			for _, m := range old.Members() {
				if _, still := cur.Member(m.ID); !still && m.ID != self {
					n.handoff.Unplanned(m.ID, old)
				}
			}
		}
		switch {
		case n.draining.Load():
		case in(old) && in(cur) && !old.Equal(cur):
			n.wg.Add(1)
			go func() {
				defer n.wg.Done()
				hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				defer cancel()
				n.handOver(hctx, "view change")
			}()
		case !in(old) && in(cur):
			for _, m := range old.Members() {
				if _, still := cur.Member(m.ID); still && m.ID != self {
					n.handoff.Expect(m.ID, old, handoff.DefaultWait)
				}
			}
		}
		old, ch = cur, next
	}
}
