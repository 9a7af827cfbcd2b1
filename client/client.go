package client

// The Client's lifecycle: New, the connections it dials, the goroutines it
// tracks, and Close.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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

	state      atomic.Pointer[viewState]
	viewMu     sync.Mutex // serializes applyView (the watcher, probes, New)
	inFb       atomic.Bool
	started    atomic.Bool // New has returned
	hadServer  atomic.Bool // the client has decided by a server at least once
	authLogged atomic.Bool // a refusal of the credentials was logged
	fb         *localLimiters
	watchNow   chan struct{} // nudges the watcher to reconnect at once

	closing atomic.Bool // Close has begun: calls decide locally

	mu       sync.Mutex // guards the fields below
	closed   bool
	nodes    map[string]*node // by gRPC address: members and seeds
	limiters map[string]*Limiter
	handles  map[*Handle]struct{}
	// retiring are nodes that left the view, whose connections close
	// once the calls already on them have had their time (retire).
	retiring map[*node]*time.Timer
	wg       sync.WaitGroup // every goroutine the client starts
}

// New returns a client of the cluster reachable through any of seeds
// (gRPC addresses). It waits, bounded by ctx, for the first cluster view
// from a seed that answers; when none answers it still returns a working
// client, which decides by the fallback policies and keeps trying in the
// background (and says so at warn). It fails for bad arguments, and with
// an *AuthError (ErrAuth) when the seeds that answered refused the
// client's credentials and none gave a view: a wrong token, a token
// without the client role, a certificate the TLS settings do not verify.
// Such a client would otherwise decide every call by its fallback.
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
		retiring: map[*node]*time.Timer{},
		watchNow: make(chan struct{}, 1),
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	c.fb = newLocalLimiters(o.maxLocal)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.state.Store(&viewState{view: cluster.NewView(0, nil), rules: map[string]*ruleInfo{}, byID: map[string]*node{}})
	c.inFb.Store(true) // no view yet: said at warn only if the start-up wait ends so
	c.m.fallback.Set(1)
	for _, s := range c.seeds {
		if _, err := c.nodeAt(s); err != nil {
			c.Close()
			return nil, fmt.Errorf("tokenserver client: seed %q: %w", s, err)
		}
	}
	if authErr := c.firstView(ctx); authErr != nil && c.state.Load().view.Len() == 0 {
		c.Close()
		return nil, fmt.Errorf("tokenserver client: %w", &AuthError{Err: authErr})
	}
	if c.InFallback() {
		c.log.Warn("tokenserver client: no seed gave a cluster view within the start-up wait; entering fallback", "seeds", c.seeds)
	}
	c.started.Store(true)
	c.wg.Add(1)
	go c.watch()
	return c, nil
}

// firstView asks the seeds, one after another, for the cluster view until
// a ready one answers or ctx ends. A view from a seed that is not ready yet
// is used for routing, but the next seed is asked too. It returns the
// last refusal of the client's credentials, if any seed refused them.
func (c *Client) firstView(ctx context.Context) (authErr error) {
	for _, s := range c.seeds {
		if ctx.Err() != nil {
			return authErr
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
			if isAuthError(err) {
				authErr = err
				c.authRefused(err)
				continue
			}
			c.log.Warn("tokenserver seed did not answer", "seed", s, "err", err)
			continue
		}
		c.applyView(v, true)
		if v.GetReady() {
			return authErr
		}
	}
	return authErr
}

// authRefused counts and logs (at error: a misconfiguration) a refusal of
// the client's credentials.
func (c *Client) authRefused(err error) {
	c.m.authRefused.Inc()
	if c.authLogged.Swap(true) {
		return // once per client: a misconfiguration fails every call
	}
	c.log.Error("tokenserver client: the server refused this client's credentials; calls fail with ErrAuth", "err", err)
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
		switch {
		case fb:
			// Only after having had a server: New says it when its wait
			// ends without one.
			c.log.Warn("tokenserver client: entering fallback")
		case c.started.Load() || c.hadServer.Load():
			c.log.Info("tokenserver client: back on the server")
		}
		if !fb {
			c.hadServer.Store(true)
		}
	}
	if fb {
		c.m.fallback.Set(1)
	} else {
		c.m.fallback.Set(0)
	}
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
	for n, t := range c.retiring {
		t.Stop()
		nodes = append(nodes, n)
	}
	c.retiring = map[*node]*time.Timer{}
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

// retire stops sending new calls to n, a node that left the view, and
// closes its connection only once the calls already on it have had their
// time (the longest a call, a give-back or a release is given): a member
// that leaves its view still answers while it drains, and closing at once
// failed such calls with "the client connection is closing" after the
// server may have decided them (a lease granted that the caller never
// learned of, a release made but reported failed).
func (c *Client) retire(n *node) {
	n.stopDispatch()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		_ = n.conn.Close()
		return
	}
	c.retiring[n] = time.AfterFunc(max(time.Second, 4*c.o.callTimeout), func() {
		c.mu.Lock()
		_, ok := c.retiring[n]
		delete(c.retiring, n)
		c.mu.Unlock()
		if ok {
			_ = n.conn.Close()
		}
	})
}
