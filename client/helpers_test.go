package client

import (
	"context"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/raftfsm"
	"github.com/tokenserver/tokenserver/internal/rule"
	"github.com/tokenserver/tokenserver/internal/server"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// toxiproxy (TestBlackholedServer's TCP proxy, a library) can leave
		// a link's pipe goroutine blocked on its send after Proxy.Stop: a
		// leak of the library, not of the SDK (seen once in 4 runs).
		goleak.IgnoreTopFunction("github.com/Shopify/toxiproxy/v2/toxics.(*NoopToxic).Pipe"))
}

// testServer is one tokenserver node (a standalone cluster over a
// one-node in-memory Raft store) on 127.0.0.1, served by a gRPC server of the test's own
// with an interceptor that can delay and fail calls, and that can be
// stopped hard and started again on the same address.
type testServer struct {
	t     testing.TB
	addr  string
	store *raftfsm.Node
	node  *server.Node
	old   []*server.Node // replaced by restarts

	delay, jitter atomic.Int64 // ns added to every unary call: delay ± jitter
	failPct       atomic.Int64 // percent of unary calls failed with Unavailable
	notReady      atomic.Int64 // acquires still to answer NOT_READY (-1: all)
	calls         atomic.Int64 // unary calls seen

	mu sync.Mutex
	gs *grpc.Server
	wg sync.WaitGroup
}

func newTestServer(t testing.TB) *testServer {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	store, err := raftfsm.NewInmem("solo", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	ts := &testServer{t: t, addr: lis.Addr().String(), store: store}
	ts.newNode()
	ts.serve(lis)
	t.Cleanup(func() {
		ts.stop()
		for _, n := range ts.old {
			n.Stop()
		}
		ts.node.Stop()
	})
	return ts
}

func (ts *testServer) newNode() {
	cfg := server.DefaultConfig()
	cfg.GRPCAddr, cfg.HTTPAddr = ts.addr, ""
	n, err := server.New(cfg, server.NewStandalone("solo", ts.addr, ts.store).Deps())
	if err != nil {
		ts.t.Fatal(err)
	}
	ts.node = n
}

func (ts *testServer) serve(lis net.Listener) {
	gs := grpc.NewServer(grpc.UnaryInterceptor(ts.intercept))
	ts.node.RegisterServices(gs)
	ts.mu.Lock()
	ts.gs = gs
	ts.mu.Unlock()
	ts.wg.Add(1)
	go func() { defer ts.wg.Done(); _ = gs.Serve(lis) }()
}

func (ts *testServer) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	ts.calls.Add(1)
	if d := ts.delay.Load(); d > 0 {
		j := ts.jitter.Load()
		if j > 0 {
			d += rand.Int64N(2*j) - j
		}
		t := time.NewTimer(time.Duration(d))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	if p := ts.failPct.Load(); p > 0 && rand.Int64N(100) < p {
		return nil, status.Error(codes.Unavailable, "injected failure")
	}
	if strings.Contains(info.FullMethod, "Acquire") {
		if left := ts.notReady.Load(); left < 0 || (left > 0 && ts.notReady.CompareAndSwap(left, left-1)) {
			st, _ := status.New(codes.Unavailable, "injected: not ready").WithDetails(&errdetails.ErrorInfo{Reason: pb.NotReadyReason})
			return nil, st.Err()
		}
	}
	return h(ctx, req)
}

// stop kills the server: every connection closes at once.
func (ts *testServer) stop() {
	ts.mu.Lock()
	gs := ts.gs
	ts.gs = nil
	ts.mu.Unlock()
	if gs != nil {
		gs.Stop()
	}
	ts.wg.Wait()
}

// restart serves again on the same address; fresh buckets when fresh.
func (ts *testServer) restart(fresh bool) {
	ts.t.Helper()
	var lis net.Listener
	var err error
	for i := 0; i < 100; i++ {
		if lis, err = net.Listen("tcp", ts.addr); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		ts.t.Fatalf("listen again on %s: %v", ts.addr, err)
	}
	if fresh {
		ts.old = append(ts.old, ts.node)
		ts.newNode()
	}
	ts.serve(lis)
}

func (ts *testServer) put(r *rule.Rule) {
	ts.t.Helper()
	if _, err := ts.store.Put(context.Background(), r, nil); err != nil {
		ts.t.Fatal(err)
	}
}

// remaining peeks at key's remaining permits on the server.
func (ts *testServer) remaining(ruleName, key string) int64 {
	ts.t.Helper()
	conn, err := grpc.NewClient(ts.addr, (&Client{}).dialOptions()...)
	if err != nil {
		ts.t.Fatal(err)
	}
	defer conn.Close()
	zero := int64(0)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := pb.NewTokenServiceClient(conn).AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: ruleName, Key: key, Permits: &zero})
	if err != nil {
		ts.t.Fatal(err)
	}
	return resp.GetRemaining()
}

func tokenBucket(name string, limit int64, period time.Duration, burst int64) *rule.Rule {
	return &rule.Rule{Name: name, Algorithm: bucket.TokenBucket, Limit: limit, Period: period, Burst: burst}
}

// newClient starts a client of seeds with a fresh registry, closed in
// t.Cleanup.
func newClient(t testing.TB, seeds []string, opts ...Option) (*Client, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := New(ctx, seeds, append([]Option{WithMetrics(reg)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, reg
}

// waitFor polls cond every 5ms for up to d.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > d {
			t.Fatalf("%s: not within %v", what, d)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}

// waitRule waits until the client's view has the rule at its latest
// version.
func waitRule(t testing.TB, c *Client, name string) {
	t.Helper()
	waitFor(t, 10*time.Second, "rule "+name+" in the view", func() bool { return c.state.Load().rules[name] != nil })
}

func rpcs(c *Client, method string) float64 {
	return testutil.ToFloat64(c.m.rpcs.WithLabelValues(method))
}

func acquireRPCs(c *Client) float64 { return rpcs(c, "AcquireToken") + rpcs(c, "AcquireTokens") }
