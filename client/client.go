package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"

	"github.com/tokenserver/tokenserver/internal/cluster"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// Client talks to a tokenserver cluster. Create it with New, take a Limiter
// per rule, and Close it when done. It is safe for simultaneous use by
// multiple goroutines.
type Client struct {
	o     options
	log   *slog.Logger
	m     *metrics
	seeds []string
	base  time.Time // origin of now()

	ctx    context.Context // ends at Close
	cancel context.CancelFunc

	state    atomic.Pointer[viewState]
	viewMu   sync.Mutex // serializes applyView (the watcher, probes, New)
	inFb     atomic.Bool
	fb       *localLimiters
	watchNow chan struct{} // nudges the watcher to reconnect at once

	closing atomic.Bool // Close has begun: calls decide locally

	mu       sync.Mutex // guards the fields below
	closed   bool
	nodes    map[string]*node // by gRPC address: members and seeds
	limiters map[string]*Limiter
	handles  map[*Handle]struct{}
	wg       sync.WaitGroup // every goroutine the client starts
}

// viewState is one immutable cluster view as the client uses it.
type viewState struct {
	view  *cluster.View
	rules map[string]*ruleInfo
	byID  map[string]*node
	// departed names (avoidHeader) the members that left the view within
	// departedFor before departedUntil (client ns): a server whose view
	// still lists them sends their keys where this view does, instead of
	// to a member that may be frozen.
	departed      string
	departedUntil int64
}

// departedFor is how long members that left the view are named in the
// avoid header: longer than a view change takes to reach every server.
const departedFor = 5 * time.Second

// recentlyDeparted is st.departed while it is recent, else "".
func (st *viewState) recentlyDeparted(c *Client) string {
	if st.departed == "" || c.now() >= st.departedUntil {
		return ""
	}
	return st.departed
}

// ruleInfo is a rule's client-facing fields.
type ruleInfo struct {
	name      string
	algorithm pb.Algorithm
	limit     int64
	period    time.Duration
	burst     int64
	fbPolicy  FallbackPolicy
	fbLimit   int64
	leaseMax  int64
	leaseTTL  time.Duration
	version   uint64
}

// New returns a client of the cluster reachable through any of seeds
// (gRPC addresses). It waits, bounded by ctx, for the first cluster view
// from a seed that answers; when none answers it still returns a working
// client, which decides by the fallback policies and keeps trying in the
// background. It fails only for bad arguments.
func New(ctx context.Context, seeds []string, opts ...Option) (*Client, error) {
	if len(seeds) == 0 {
		return nil, fmt.Errorf("tokenserver client: no seed addresses: %w", ErrInvalid)
	}
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	c := &Client{
		o:        o,
		log:      o.log,
		m:        newMetrics(o.reg),
		seeds:    append([]string(nil), seeds...),
		base:     time.Now(),
		nodes:    map[string]*node{},
		limiters: map[string]*Limiter{},
		handles:  map[*Handle]struct{}{},
		watchNow: make(chan struct{}, 1),
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	c.fb = newLocalLimiters(o.maxLocal)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.state.Store(&viewState{view: cluster.NewView(0, nil), rules: map[string]*ruleInfo{}, byID: map[string]*node{}})
	c.updateMode()
	for _, s := range c.seeds {
		if _, err := c.nodeAt(s); err != nil {
			c.Close()
			return nil, fmt.Errorf("tokenserver client: seed %q: %w", s, err)
		}
	}
	c.firstView(ctx)
	c.wg.Add(1)
	go c.watch()
	return c, nil
}

// firstView asks the seeds, one after another, for the cluster view until
// a ready one answers or ctx ends. A view from a seed that is not ready yet
// is used for routing, but the next seed is asked too.
func (c *Client) firstView(ctx context.Context) {
	for _, s := range c.seeds {
		if ctx.Err() != nil {
			return
		}
		n, err := c.nodeAt(s)
		if err != nil {
			continue
		}
		cctx, cancel := ctx, context.CancelFunc(func() {})
		if _, ok := ctx.Deadline(); !ok {
			cctx, cancel = context.WithTimeout(ctx, 2*time.Second)
		}
		c.m.rpcView.Inc()
		v, err := n.tc.GetClusterView(cctx, &pb.GetClusterViewRequest{})
		cancel()
		if err != nil {
			c.log.Warn("tokenserver seed did not answer", "seed", s, "err", err)
			continue
		}
		c.applyView(v, true)
		if v.GetReady() {
			return
		}
	}
}

// nodeAt returns the node of a gRPC address, dialing it (lazily) the first
// time.
func (c *Client) nodeAt(addr string) (*node, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	if n := c.nodes[addr]; n != nil {
		return n, nil
	}
	n, err := newNode(c, addr)
	if err != nil {
		return nil, err
	}
	c.nodes[addr] = n
	return n, nil
}

func (c *Client) dialOptions() []grpc.DialOption {
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		// Reconnect quickly after a node comes back: gRPC's default backoff
		// grows to 2 minutes. (ClientConn.ResetConnectBackoff would be the
		// tool for probes, but in grpc-go v1.85 it iterates the subchannel
		// map outside its lock, racing with reconnects.)
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: time.Second,
		}),
		// Fail fast: a call to a node that cannot be reached must not wait
		// for it to come back.
		grpc.WithDefaultCallOptions(grpc.WaitForReady(false)),
		// Find connections that died silently (a frozen or unplugged
		// node). Servers accept a ping every 10 s; the watch stream's 1 s
		// heartbeat finds a frozen node sooner.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 3 * time.Second, PermitWithoutStream: true}),
		// Fixed flow-control windows turn off gRPC's bandwidth-delay
		// estimation, which answers every received message with a PING
		// the server must acknowledge: for the watch stream's heartbeat
		// that doubled the server's writes (1,000 idle streams on 1,000
		// connections: 6.9% of a core with it, 4.1% without). Our
		// messages are small; 1 MiB is far above what one carries.
		grpc.WithInitialWindowSize(1 << 20), grpc.WithInitialConnWindowSize(1 << 20),
	}
	return append(opts, c.o.dial...)
}

// applyView takes what a server's view teaches: its members when its epoch
// is newer than the client's (epochs only grow), and its rules when the
// node that answered is ready. Never looser than the rules: a view from a
// node that is not ready changes no rule (it may not have replayed its
// log); a ready node's view from the followed stream (authoritative)
// replaces the rules, deletions included; one fetched by a probe only adds
// rules and newer versions. Nodes are dialed for new members, and closed
// when they leave (seeds stay).
func (c *Client) applyView(pv *pb.ClusterView, authoritative bool) {
	c.viewMu.Lock()
	defer c.viewMu.Unlock()
	old := c.state.Load()
	view := old.view
	if pv.GetEpoch() > old.view.Epoch || (old.view.Len() == 0 && len(pv.GetMembers()) > 0) {
		members := make([]cluster.Member, 0, len(pv.GetMembers()))
		for _, m := range pv.GetMembers() {
			members = append(members, cluster.Member{ID: m.GetId(), GRPCAddr: m.GetGrpcAddr(), RaftAddr: m.GetRaftAddr(), Voter: m.GetVoter()})
		}
		if nv := cluster.NewView(pv.GetEpoch(), members); nv.Len() > 0 {
			view = nv
		}
	}
	rules := old.rules
	if pv.GetReady() {
		rules = mergeRules(old.rules, pv.GetRules(), authoritative)
	}
	if view == old.view && sameRules(rules, old.rules) {
		return
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	byID := old.byID
	departed, departedUntil := old.departed, old.departedUntil
	var gone []*node
	if view != old.view {
		var left []string
		for _, m := range old.view.Members() {
			if _, ok := view.Member(m.ID); !ok {
				left = append(left, m.ID)
			}
		}
		if prev := old.recentlyDeparted(c); prev != "" {
			for _, id := range strings.Split(prev, ",") {
				if _, ok := view.Member(id); !ok && !slices.Contains(left, id) {
					left = append(left, id)
				}
			}
		}
		departed, departedUntil = strings.Join(left, ","), c.now()+int64(departedFor)
		byID = make(map[string]*node, view.Len())
		keep := make(map[string]bool, view.Len()+len(c.seeds))
		for _, s := range c.seeds {
			keep[s] = true
		}
		for _, m := range view.Members() {
			n := c.nodes[m.GRPCAddr]
			if n == nil {
				var err error
				if n, err = newNode(c, m.GRPCAddr); err != nil {
					c.log.Error("tokenserver: cannot dial member", "member", m.ID, "addr", m.GRPCAddr, "err", err)
					continue
				}
				c.nodes[m.GRPCAddr] = n
			}
			byID[m.ID] = n
			keep[m.GRPCAddr] = true
		}
		for addr, n := range c.nodes {
			if !keep[addr] {
				delete(c.nodes, addr)
				gone = append(gone, n)
			}
		}
	}
	c.state.Store(&viewState{view: view, rules: rules, byID: byID, departed: departed, departedUntil: departedUntil})
	c.mu.Unlock()
	c.m.viewEpoch.Set(float64(view.Epoch))
	c.m.viewMembers.Set(float64(view.Len()))
	for _, n := range gone {
		n.close()
	}
	c.updateMode()
}

// mergeRules returns old updated by a ready node's rules: replaced when
// authoritative, else only added to and moved to newer versions. It
// returns old itself, without allocating, when nothing changes (the
// heartbeat views of an idle cluster).
func mergeRules(old map[string]*ruleInfo, in []*pb.ClientRule, authoritative bool) map[string]*ruleInfo {
	same := !authoritative || len(in) == len(old)
	for _, r := range in {
		if !same {
			break
		}
		o := old[r.GetName()]
		same = o != nil && (*o == toRuleInfo(r) || (!authoritative && o.version >= r.GetVersion()))
	}
	if same {
		return old
	}
	out := make(map[string]*ruleInfo, max(len(old), len(in)))
	if !authoritative {
		for k, v := range old {
			out[k] = v
		}
	}
	for _, r := range in {
		ri := toRuleInfo(r)
		if o := old[ri.name]; o != nil && (*o == ri || (!authoritative && o.version >= ri.version)) {
			out[ri.name] = o
			continue
		}
		out[ri.name] = &ri
	}
	if sameRules(out, old) {
		return old
	}
	return out
}

// toRuleInfo is a view rule's client-facing fields.
func toRuleInfo(r *pb.ClientRule) ruleInfo {
	return ruleInfo{
		name: r.GetName(), algorithm: r.GetAlgorithm(), limit: r.GetLimit(), period: r.GetPeriod().AsDuration(),
		burst: r.GetBurst(), fbPolicy: FallbackPolicy(r.GetFallback().GetPolicy()), fbLimit: r.GetFallback().GetLimit(),
		leaseMax: r.GetLease().GetMaxBatch(), leaseTTL: r.GetLease().GetTtl().AsDuration(), version: r.GetVersion(),
	}
}

// sameRules reports whether a and b hold the same ruleInfo pointers.
func sameRules(a, b map[string]*ruleInfo) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// watch follows WatchClusterView on a member (or a seed) until Close. A
// stream that ends is reconnected with full-jitter backoff; one on which no
// ready view arrives for watchSilence (servers send one at least every
// second) is moved at once to another member: its node froze, or cannot
// speak for the cluster yet.
func (c *Client) watch() {
	defer c.wg.Done()
	attempt := 0
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
			attempt = 0
		}
		if silent {
			c.log.Warn("tokenserver client: no ready view on the watch stream; following another member", "addr", addr, "after", c.o.watchSilence)
			continue
		}
		t := time.NewTimer(fullJitter(attempt, 50*time.Millisecond, 2*time.Second))
		attempt++
		select {
		case <-c.ctx.Done():
			t.Stop()
			return
		case <-c.watchNow:
			t.Stop()
		case <-t.C:
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
	stream, err := n.tc.WatchClusterView(ctx, &pb.GetClusterViewRequest{})
	if err != nil {
		return false, quiet.Load()
	}
	for {
		v, err := stream.Recv()
		if err != nil {
			return heard, quiet.Load()
		}
		c.applyView(v, true)
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

// fullJitter is a random duration in [0, min(max, base × 2^attempt)).
func fullJitter(attempt int, base, maxD time.Duration) time.Duration {
	d := maxD
	if attempt < 30 && base<<attempt < maxD {
		d = base << attempt
	}
	return time.Duration(rand.Int64N(int64(d)) + 1)
}

// now is monotonic nanoseconds since the client started.
func (c *Client) now() int64 { return int64(time.Since(c.base)) }

// InFallback reports whether the client decides calls locally now: it has
// no cluster view yet, or every member of its view is failing (a key whose
// owner fails while another member answers goes to that member instead).
func (c *Client) InFallback() bool { return c.inFb.Load() }

// updateMode recomputes InFallback and its gauge.
func (c *Client) updateMode() {
	st := c.state.Load()
	fb := st.view.Len() == 0
	if !fb && len(st.byID) > 0 {
		fb = true
		for _, n := range st.byID {
			if !n.failing.Load() {
				fb = false
				break
			}
		}
	}
	if c.inFb.Swap(fb) != fb {
		if fb {
			c.log.Warn("tokenserver client: entering fallback")
		} else {
			c.log.Info("tokenserver client: back on the server")
		}
	}
	if fb {
		c.m.fallback.Set(1)
	} else {
		c.m.fallback.Set(0)
	}
}

// owner returns the node that owns key in the current view, or nil.
func (st *viewState) owner(key string) *node {
	m, ok := st.view.Owner(key)
	if !ok {
		return nil
	}
	return st.byID[m.ID]
}

// target returns the node for a call about key (refill, renew, release)
// and ctx with the avoid header it needs.
func (c *Client) target(ctx context.Context, key string) (*node, context.Context) {
	n, avoid := c.pick(c.state.Load(), key, nil)
	return n, withAvoid(ctx, avoid)
}

// enter joins the goroutines Close waits for; false once closed.
func (c *Client) enter() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.wg.Add(1)
	return true
}

// exit leaves what enter joined.
func (c *Client) exit() { c.wg.Done() }

// goTracked runs f on a new goroutine that Close waits for; false (f not
// run) once the client is closing.
func (c *Client) goTracked(f func()) bool {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return false
	}
	c.wg.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.wg.Done()
		f()
	}()
	return true
}

// Close gives unused leased tokens back and releases held concurrency
// handles (best effort, bounded to about a second), then stops every
// goroutine and closes the connections. Calls after Close decide by the
// fallback policy and return ErrClosed. Close is idempotent.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed || c.closing.Swap(true) {
		c.mu.Unlock()
		return nil
	}
	lims := make([]*Limiter, 0, len(c.limiters))
	for _, l := range c.limiters {
		lims = append(lims, l)
	}
	hs := make([]*Handle, 0, len(c.handles))
	for h := range c.handles {
		hs = append(hs, h)
	}
	c.mu.Unlock()

	// Give back while the connections still work, bounded in time.
	ctx, cancel := context.WithTimeout(context.Background(), max(time.Second, 4*c.o.callTimeout))
	var wg sync.WaitGroup
	for _, l := range lims {
		wg.Add(1)
		go func() { defer wg.Done(); l.endLeases(ctx) }()
	}
	for _, h := range hs {
		wg.Add(1)
		go func() { defer wg.Done(); _ = h.release(ctx) }()
	}
	wg.Wait()
	cancel()

	c.mu.Lock()
	c.closed = true
	nodes := make([]*node, 0, len(c.nodes))
	for _, n := range c.nodes {
		nodes = append(nodes, n)
	}
	c.nodes = map[string]*node{}
	c.mu.Unlock()
	c.cancel()
	for _, n := range nodes {
		n.stopDispatch()
	}
	c.wg.Wait()
	var errs []error
	for _, n := range nodes {
		if err := n.conn.Close(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
