package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
	"github.com/tokenserver/tokenserver/internal/testcluster"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// Every acquire goes to the key's owner: a client-side interceptor records
// the address each AcquireToken was sent to.
func TestRoutingAcrossThreeNodes(t *testing.T) {
	tc := testcluster.New(t, 3)
	ctx := context.Background()
	// An hour's period: a bucket refilled back to full is evicted by the
	// sweeper, and a 1000/s bucket was, before the count below (a flake).
	_, err := tc.Leader().Admin().PutRule(ctx, &pb.PutRuleRequest{Rule: &pb.Rule{
		Name: "r", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 1000, Period: durationpb.New(time.Hour)}})
	if err != nil {
		t.Fatal(err)
	}
	tc.WaitForRule("r")
	var mu sync.Mutex
	sentTo := map[string][]string{} // key → addresses
	rec := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if r, ok := req.(*pb.AcquireTokenRequest); ok {
			mu.Lock()
			sentTo[r.GetKey()] = append(sentTo[r.GetKey()], cc.Target())
			mu.Unlock()
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	})
	c, _ := newClient(t, []string{tc.Nodes[1].GRPCAddr}, WithCoalesceWindow(0), WithDialOptions(rec), WithCallTimeout(time.Second))
	waitFor(t, 10*time.Second, "3 members and the rule", func() bool {
		st := c.state.Load()
		return st.view.Len() == 3 && st.rules["r"] != nil
	})
	lim := c.Limiter("r")
	var keys []string
	for _, n := range tc.Nodes {
		for i := 0; i < 5; i++ {
			keys = append(keys, tc.KeyOwnedBy(n.ID, fmt.Sprintf("u%d", i)))
		}
	}
	for _, k := range keys {
		for i := 0; i < 3; i++ {
			if d, err := lim.AllowN(ctx, k, 1); err != nil || !d.Allowed || d.Source != SourceServer {
				t.Fatalf("key %s: %+v, %v", k, d, err)
			}
		}
	}
	for _, k := range keys {
		want := tc.OwnerOf(k).GRPCAddr
		for _, got := range sentTo[k] {
			if got != want {
				t.Errorf("key %s went to %s, its owner is %s", k, got, want)
			}
		}
		if len(sentTo[k]) != 3 {
			t.Errorf("key %s: %d calls, want 3", k, len(sentTo[k]))
		}
	}
	for i, n := range tc.Nodes {
		if live := n.Buckets().Live(); live != 5 {
			t.Errorf("node %d holds %d buckets, want its own 5", i, live)
		}
	}
}

// Concurrent calls travel as far fewer RPCs, and each caller gets its own
// answer: with a limit of 2, exactly 2 of 3 concurrent calls per key pass.
func TestCoalescingCutsRPCs(t *testing.T) {
	ts := newTestServer(t)
	ts.put(tokenBucket("c", 2, time.Minute, 2))
	run := func(window time.Duration) float64 {
		c, _ := newClient(t, []string{ts.addr}, WithCoalesceWindow(window), WithCallTimeout(2*time.Second))
		waitRule(t, c, "c")
		lim := c.Limiter("c")
		const keys, per = 100, 3
		var allowed [keys]atomic.Int64
		var wg sync.WaitGroup
		start := make(chan struct{})
		for k := 0; k < keys; k++ {
			for j := 0; j < per; j++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					d, err := lim.AllowN(context.Background(), fmt.Sprintf("w%v-k%d", window, k), 1)
					if err != nil || d.Source != SourceServer {
						t.Errorf("%+v %v", d, err)
					}
					if d.Allowed {
						allowed[k].Add(1)
					}
				}()
			}
		}
		close(start)
		wg.Wait()
		for k := range allowed {
			if got := allowed[k].Load(); got != 2 {
				t.Errorf("window %v key %d: %d allowed, want 2", window, k, got)
			}
		}
		return acquireRPCs(c)
	}
	alone := run(0)
	together := run(2 * time.Millisecond)
	t.Logf("300 concurrent calls: %v RPCs uncoalesced, %v coalesced", alone, together)
	if alone != 300 {
		t.Errorf("uncoalesced: %v RPCs, want 300", alone)
	}
	if together > 60 {
		t.Errorf("coalesced: %v RPCs, want far fewer than 300", together)
	}
}

// 8 clients hammer one key with leases on: admissions in every window stay
// within burst + rate × T, and most of what the rule allows is admitted.
func TestLeasesEightClientsStayWithinTheRule(t *testing.T) {
	ts := newTestServer(t)
	r := tokenBucket("hot", 1000, time.Second, 100)
	r.Lease = rule.Lease{MaxBatch: 50, TTL: 50 * time.Millisecond}
	ts.put(r)
	const clients, workers = 8, 3
	const dur = 1200 * time.Millisecond
	var mu sync.Mutex
	// Each admission is known to have happened between the call and its
	// return: a window's true length is at most the last return minus the
	// earliest call in it, so the check below cannot fail for a descheduled
	// goroutine (timestamps after the return alone did, on a loaded machine).
	type admission struct{ called, returned time.Duration }
	var log []admission
	var lease, server atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	var cs []*Client
	for i := 0; i < clients; i++ {
		c, _ := newClient(t, []string{ts.addr}, WithCallTimeout(time.Second))
		waitRule(t, c, "hot")
		cs = append(cs, c)
	}
	start = time.Now()
	for _, c := range cs {
		lim := c.Limiter("hot", WithLease(0, 0))
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var mine []admission
				for time.Since(start) < dur {
					called := time.Since(start)
					d, err := lim.AllowN(context.Background(), "k", 1)
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						mine = append(mine, admission{called, time.Since(start)})
						if d.Source == SourceLease {
							lease.Add(1)
						} else {
							server.Add(1)
						}
					} else if d.RetryAfter > 0 {
						time.Sleep(min(d.RetryAfter, time.Millisecond))
					}
				}
				mu.Lock()
				log = append(log, mine...)
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	slices.SortFunc(log, func(a, b admission) int { return int(a.returned - b.returned) })
	// The stated bound (client/doc.go): burst + rate × (T + L), L the
	// longest a lease lives (its TTL, 50ms). Under saturation leases are
	// short and windows stay within burst + rate × T (the worst excess over
	// that is logged); on a loaded machine a lease can outlive its batch's
	// demand and that tighter form was exceeded by ~10 in a 17ms window
	// (also before the SDK's failover work): the test checks the stated one.
	const burst, rate, leaseLife = 100.0, 1000.0, 0.050 // per second; seconds
	worst := -1e9
	for i := range log {
		earliest := log[i].called
		for j := i; j < len(log); j++ {
			earliest = min(earliest, log[j].called)
			n := float64(j - i + 1)
			tight := burst + rate*(log[j].returned-earliest).Seconds()
			worst = max(worst, n-tight)
			if bound := tight + rate*leaseLife; n > bound {
				t.Fatalf("%v admitted between %v and %v, the rule allows %.0f with leases living up to 50ms", n, earliest, log[j].returned, bound)
			}
		}
	}
	allowedByRule := burst + rate*elapsed.Seconds()
	if float64(len(log)) > allowedByRule {
		t.Fatalf("admitted %d in %v, the rule allows %.0f", len(log), elapsed, allowedByRule)
	}
	t.Logf("8 clients × %d workers, %v: admitted %d (lease %d, server %d) of %.0f the rule allows (%.1f%%); worst window excess over burst+rate×T: %.1f",
		workers, elapsed.Round(time.Millisecond), len(log), lease.Load(), server.Load(), allowedByRule, 100*float64(len(log))/allowedByRule, worst)
	// The share admitted is a throughput figure (logged above), not a
	// bound: 24 workers under -race on a shared 2-core machine reached
	// 21-41% at load averages of 12-20, and 60% was asserted before. What
	// this guards is starvation (a lease that blocks its key): that admits
	// almost nothing, far below 10%.
	if float64(len(log)) < 0.1*allowedByRule {
		t.Errorf("admitted share %.1f%%: the clients starve", 100*float64(len(log))/allowedByRule)
	}
	if lease.Load() == 0 {
		t.Error("nothing served from leases")
	}
}

// Unused leased tokens go back to the server on Close.
func TestLeaseRefilledOnClose(t *testing.T) {
	ts := newTestServer(t)
	r := tokenBucket("rf", 100, time.Minute, 100)
	r.Lease = rule.Lease{MaxBatch: 50, TTL: 30 * time.Second}
	ts.put(r)
	c, _ := newClient(t, []string{ts.addr}, WithCallTimeout(time.Second))
	waitRule(t, c, "rf")
	lim := c.Limiter("rf", WithLease(0, 0))
	for i := 0; i < 10; i++ {
		if !lim.Allow(context.Background(), "k") {
			t.Fatalf("call %d denied", i)
		}
	}
	held := ts.remaining("rf", "k")
	if held > 90-10 {
		t.Fatalf("remaining %d: no lease taken", held)
	}
	c.Close()
	after := ts.remaining("rf", "k")
	t.Logf("server remaining: %d while leased, %d after Close (10 used)", held, after)
	if after != 90 {
		t.Errorf("remaining after Close = %d, want 90 (100 - 10 used)", after)
	}
	if got := testutil.ToFloat64(c.m.leaseTokens.WithLabelValues("rf", "refilled")); got <= 0 {
		t.Errorf("refilled metric = %v", got)
	}
}

// With the server killed every call returns within its deadline plus slack,
// the LOCAL policy holds, and the client goes back to the server once it
// returns.
func TestServerDownFallbackAndRecovery(t *testing.T) {
	ts := newTestServer(t)
	r := tokenBucket("fb", 1000, time.Second, 1000)
	r.Fallback = rule.Fallback{Policy: rule.FallbackLocal, Limit: 20}
	ts.put(r)
	c, _ := newClient(t, []string{ts.addr})
	waitRule(t, c, "fb")
	lim := c.Limiter("fb")
	if d, err := lim.AllowN(context.Background(), "k", 1); err != nil || d.Source != SourceServer {
		t.Fatalf("before: %+v %v", d, err)
	}
	ts.stop()
	const slack = 250 * time.Millisecond
	start := time.Now()
	var admitted int
	var worst time.Duration
	for time.Since(start) < time.Second {
		t0 := time.Now()
		d, err := lim.AllowN(context.Background(), "k", 1)
		took := time.Since(t0)
		worst = max(worst, took)
		if took > DefaultCallTimeout+slack {
			t.Errorf("a call took %v with the server down", took)
		}
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
		}
		time.Sleep(time.Millisecond)
	}
	elapsed := time.Since(start)
	if !c.InFallback() || testutil.ToFloat64(c.m.fallback) != 1 {
		t.Error("not in fallback with the server down")
	}
	// LOCAL: 20 per second per instance, burst 20.
	bound := 20 + 20*elapsed.Seconds()
	t.Logf("server down %v: %d admitted locally (bound %.0f), slowest call %v", elapsed.Round(time.Millisecond), admitted, bound, worst)
	if float64(admitted) > bound+1 {
		t.Errorf("admitted %d locally, LOCAL allows %.0f", admitted, bound)
	}
	if admitted == 0 {
		t.Error("LOCAL admitted nothing")
	}
	ts.restart(false)
	back := waitFor(t, 10*time.Second, "back on the server", func() bool {
		lim.Allow(context.Background(), "k")
		return !c.InFallback()
	})
	t.Logf("back on the server %v after it returned", back)
	if d, err := lim.AllowN(context.Background(), "k", 1); err != nil || d.Source != SourceServer {
		t.Errorf("after: %+v %v", d, err)
	}
	if testutil.ToFloat64(c.m.fallback) != 0 {
		t.Error("fallback gauge still 1")
	}
}

// A client whose seeds all refuse starts at once, in fallback, under the
// limiter's policy, and counts default allows.
func TestNoServerStartsInFallback(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	start := time.Now()
	c, _ := newClient(t, []string{addr})
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("New took %v with no server", took)
	}
	if !c.InFallback() {
		t.Fatal("not in fallback without a server")
	}
	ctx := context.Background()
	if d, err := c.Limiter("any").AllowN(ctx, "k", 1); err != nil || !d.Allowed || !d.FromFallback() {
		t.Errorf("default: %+v %v", d, err)
	}
	if got := testutil.ToFloat64(c.m.defaultAllow); got != 1 {
		t.Errorf("default allows = %v, want 1", got)
	}
	if _, err := c.Limiter("deny", WithFallback(FallbackDeny, 0)).AllowN(ctx, "k", 1); !errors.Is(err, ErrUnavailable) {
		t.Errorf("deny: %v", err)
	}
	local := c.Limiter("local", WithFallback(FallbackLocal, 3))
	n := 0
	for i := 0; i < 10; i++ {
		if local.Allow(ctx, "k") {
			n++
		}
	}
	if n != 3 {
		t.Errorf("local admitted %d of 10, want 3", n)
	}
	if _, err := c.Limiter("x").AllowN(ctx, "", 1); !errors.Is(err, ErrInvalid) {
		t.Errorf("empty key: %v", err)
	}
}

// Server errors map to sentinels; a denial is not an error.
func TestErrorsAndDenials(t *testing.T) {
	ts := newTestServer(t)
	ts.put(tokenBucket("one", 1, time.Minute, 1))
	c, _ := newClient(t, []string{ts.addr})
	waitRule(t, c, "one")
	ctx := context.Background()
	lim := c.Limiter("one")
	if d, err := lim.AllowN(ctx, "k", 1); err != nil || !d.Allowed {
		t.Fatalf("%+v %v", d, err)
	}
	d, err := lim.AllowN(ctx, "k", 1)
	if err != nil || d.Allowed || d.RetryAfter <= 0 || d.Source != SourceServer {
		t.Fatalf("second: %+v %v", d, err)
	}
	if _, err := lim.AllowN(ctx, "k", 5); !errors.Is(err, ErrInvalid) {
		t.Errorf("above capacity: %v", err)
	}
	if _, err := c.Limiter("missing", WithFallback(FallbackDeny, 0)).AllowN(ctx, "k", 1); !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrUnavailable) {
		t.Errorf("unknown rule: %v", err)
	}
	wctx, wcancel := context.WithTimeout(ctx, time.Second)
	defer wcancel()
	if err := lim.Wait(wctx, "k"); !errors.Is(err, ErrDenied) {
		t.Errorf("Wait for a token a minute away with a second left: %v", err)
	} else {
		var de *DeniedError
		if !errors.As(err, &de) || de.RetryAfter <= 0 {
			t.Errorf("not a DeniedError with retry-after: %v", err)
		}
	}
}

// Wait blocks for the shaped slot (Guava's acquire): 1 per 50ms with burst
// 1 takes about 100ms for three.
func TestWaitShapes(t *testing.T) {
	ts := newTestServer(t)
	ts.put(tokenBucket("w", 20, time.Second, 1))
	c, _ := newClient(t, []string{ts.addr}, WithCallTimeout(time.Second))
	waitRule(t, c, "w")
	lim := c.Limiter("w", WithFallback(FallbackDeny, 0))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	for i := 0; i < 3; i++ {
		if err := lim.Wait(ctx, "k"); err != nil {
			t.Fatal(err)
		}
	}
	took := time.Since(start)
	if took < 90*time.Millisecond || took > 2*time.Second {
		t.Errorf("3 waits took %v, want about 100ms", took)
	}
	short, cancel2 := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel2()
	lim.Allow(context.Background(), "k2")
	if err := lim.Wait(short, "k2"); err == nil {
		t.Error("Wait with 5ms left got a token 50ms away")
	}
}

// Concurrency handles renew while held; Release is idempotent and safe
// after the server restarted (the lease is gone there).
func TestHandleRenewAndReleaseAfterRestart(t *testing.T) {
	ts := newTestServer(t)
	ts.put(&rule.Rule{Name: "cc", Algorithm: bucket.Concurrency, Limit: 1, Period: 150 * time.Millisecond})
	c, _ := newClient(t, []string{ts.addr}, WithCallTimeout(time.Second))
	waitRule(t, c, "cc")
	lim := c.Limiter("cc")
	ctx := context.Background()
	h, err := lim.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lim.Acquire(ctx, "k"); !errors.Is(err, ErrDenied) {
		t.Fatalf("second holder: %v", err)
	}
	time.Sleep(400 * time.Millisecond) // past the period: only renewals keep it
	if _, err := lim.Acquire(ctx, "k"); !errors.Is(err, ErrDenied) {
		t.Fatalf("lease was not renewed: %v", err)
	}
	if rpcs(c, "RenewLease") < 2 {
		t.Errorf("%v renewals", rpcs(c, "RenewLease"))
	}
	if err := h.Release(); err != nil {
		t.Fatal(err)
	}
	if err := h.Release(); err != nil {
		t.Fatalf("second release: %v", err)
	}
	h2, err := lim.Acquire(ctx, "k")
	if err != nil {
		t.Fatalf("after release: %v", err)
	}
	ts.stop()
	ts.restart(true)
	start := time.Now()
	err = h2.Release()
	t.Logf("release after restart: %v in %v", err, time.Since(start))
	if took := time.Since(start); took > time.Second {
		t.Errorf("release took %v", took)
	}
	if err := h2.Release(); err != nil {
		t.Errorf("second release: %v", err)
	}
	// While the server is down: Release is bounded and reports unavailability.
	h3, err := lim.Acquire(ctx, "k2")
	if err != nil {
		t.Fatal(err)
	}
	ts.stop()
	start = time.Now()
	err = h3.Release()
	if took := time.Since(start); took > time.Second {
		t.Errorf("release with the server down took %v", took)
	}
	if err != nil && !errors.Is(err, ErrUnavailable) {
		t.Errorf("release with the server down: %v", err)
	}
}

// A slow owner (200±50ms, 10% failures) with a 50ms call timeout: calls
// return in time, the breaker opens and stops sending, and probes close it
// once the owner is fast again.
func TestSlowOwnerOpensBreaker(t *testing.T) {
	ts := newTestServer(t)
	r := tokenBucket("s", 1000, time.Second, 1000)
	r.Fallback = rule.Fallback{Policy: rule.FallbackAllow}
	ts.put(r)
	c, _ := newClient(t, []string{ts.addr})
	waitRule(t, c, "s")
	lim := c.Limiter("s")
	ts.delay.Store(int64(200 * time.Millisecond))
	ts.jitter.Store(int64(50 * time.Millisecond))
	ts.failPct.Store(10)
	var worst time.Duration
	for i := 0; i < 30; i++ {
		t0 := time.Now()
		d, err := lim.AllowN(context.Background(), fmt.Sprint("k", i%5), 1)
		took := time.Since(t0)
		worst = max(worst, took)
		if took > DefaultCallTimeout+250*time.Millisecond {
			t.Errorf("call %d took %v", i, took)
		}
		if err != nil || !d.Allowed || !d.FromFallback() {
			t.Errorf("call %d: %+v %v", i, d, err)
		}
	}
	n := c.state.Load().owner("k0")
	if !n.open.Load() || !c.InFallback() {
		t.Fatal("breaker not open after 30 slow calls")
	}
	sent := acquireRPCs(c)
	if sent > 5 {
		t.Errorf("%v acquire RPCs reached the slow owner; the breaker should stop them after 3", sent)
	}
	t.Logf("slow owner: slowest call %v, %v acquire RPCs sent for 30 calls", worst, sent)
	ts.delay.Store(0)
	ts.failPct.Store(0)
	back := waitFor(t, 10*time.Second, "breaker closes", func() bool { return !n.open.Load() && !c.InFallback() })
	t.Logf("breaker closed %v after the owner became fast", back)
	if d, err := lim.AllowN(context.Background(), "k0", 1); err != nil || d.Source != SourceServer {
		t.Errorf("after: %+v %v", d, err)
	}
}

// notSent tells dial failures from everything else.
func TestNotSent(t *testing.T) {
	lis, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := lis.Addr().String()
	lis.Close()
	conn, err := grpc.NewClient(addr, (&Client{}).dialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err = pb.NewTokenServiceClient(conn).GetClusterView(ctx, &pb.GetClusterViewRequest{})
	if !notSent(err) {
		t.Errorf("connection refused not recognized: %v", err)
	}
	if notSent(context.DeadlineExceeded) || notSent(errBreakerOpen) {
		t.Error("timeout or breaker taken as not sent")
	}
}

// The local fallback limiter and the backoff, on a fake clock.
func TestLocalLimiterAndBackoffSynctest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ls := newLocalLimiters(2)
		for i := 0; i < 10; i++ {
			if ok, _, _ := ls.allow("r", "k", 1, 10, time.Second, time.Now()); !ok {
				t.Fatalf("call %d denied", i)
			}
		}
		ok, retry, _ := ls.allow("r", "k", 1, 10, time.Second, time.Now())
		if ok || retry != 100*time.Millisecond {
			t.Fatalf("11th: %v retry %v", ok, retry)
		}
		time.Sleep(retry)
		if ok, _, _ := ls.allow("r", "k", 1, 10, time.Second, time.Now()); !ok {
			t.Fatal("denied after the retry-after")
		}
		ls.allow("r", "k2", 1, 10, time.Second, time.Now())
		ls.allow("r", "k3", 1, 10, time.Second, time.Now())
		if len(ls.m) != 2 {
			t.Errorf("%d local limiters, cap 2", len(ls.m))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		defer cancel()
		start := time.Now()
		if err := sleep(ctx, time.Second); err == nil || time.Since(start) != 30*time.Millisecond {
			t.Errorf("sleep past the deadline: %v after %v", err, time.Since(start))
		}
	})
	// The backoff's range is tested in internal/backoff (TestWaitsStayInRange).
}
