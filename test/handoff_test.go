//go:build multiprocess

package e2e

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokenserver/tokenserver/client"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// handoffLoad is raw gRPC and SDK load on 1,000 keys with a 100-per-day
// rule of each counting algorithm (bucket handoff tests): it tallies what
// was admitted per (rule, key) and what the SDK decided without a server.
type handoffLoad struct {
	c        *procCluster
	algs     map[string]pb.Algorithm
	mu       sync.Mutex
	admitted map[string]int64
	calls    atomic.Int64
	// sdkCalls counts the SDK's decisions, sdkFallback those not made by
	// a server (a hold that outlasts the SDK's call timeout shows here).
	sdkCalls, sdkFallback atomic.Int64
	// sdkConnClosing counts fallbacks on a connection the SDK closed
	// itself (a member left its view mid-call).
	sdkConnClosing atomic.Int64
	running        sync.Map // node id -> true while up
	// nodes and tokens are the members the raw load goes through (under
	// mu: a scale test adds members while it runs).
	nodes  []string
	tokens map[string]pb.TokenServiceClient
	stop   context.CancelFunc
	began  time.Time // when the SDK load began
	wg     sync.WaitGroup
	// leases is the concurrency load that runs beside the counting one.
	leases *leaseLoad
}

const (
	handoffLimit   = 100
	handoffKeys    = 1000
	handoffPermits = 10
	handoffSDKKeys = 100 // the SDK's keys: sdk-0..99, one permit a call
)

func newHandoffLoad(t *testing.T, c *procCluster) *handoffLoad {
	l := &handoffLoad{c: c, admitted: map[string]int64{}, tokens: map[string]pb.TokenServiceClient{}, algs: map[string]pb.Algorithm{
		"tb": pb.Algorithm_TOKEN_BUCKET, "fw": pb.Algorithm_FIXED_WINDOW, "sw": pb.Algorithm_SLIDING_WINDOW,
		"sl": pb.Algorithm_SLIDING_LOG, "lb": pb.Algorithm_LEAKY_BUCKET,
	}}
	for name, alg := range l.algs {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		r := &pb.Rule{Name: name, Algorithm: alg, Limit: handoffLimit, Period: durationpb.New(24 * time.Hour), MaxKeys: 2 * (handoffKeys + handoffSDKKeys),
			Fallback: &pb.Fallback{Policy: pb.FallbackPolicy_DENY}}
		if _, err := c.admin(c.leader("")).PutRule(ctx, &pb.PutRuleRequest{Rule: r}); err != nil {
			t.Fatalf("put %s: %v", name, err)
		}
		cancel()
	}
	l.leases = newLeaseLoad(t, l)
	for _, id := range c.ids {
		l.add(id, c.token(id))
		c.waitFor("the rules on "+id, 30*time.Second, func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			for _, name := range []string{"lb", leaseRule, leaseSDKRule} {
				if _, err := c.admin(id).GetRule(ctx, &pb.GetRuleRequest{Name: name, Local: true}); err != nil {
					return false
				}
			}
			return true
		})
	}
	return l
}

// add puts member id, reached through tc, under load.
func (l *handoffLoad) add(id string, tc pb.TokenServiceClient) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.nodes = append(l.nodes, id)
	l.tokens[id] = tc
	l.running.Store(id, true)
}

// node is the i-th member under load (round robin) and its client.
func (l *handoffLoad) node(i int) (string, pb.TokenServiceClient) {
	l.mu.Lock()
	defer l.mu.Unlock()
	id := l.nodes[i%len(l.nodes)]
	return id, l.tokens[id]
}

// round sends one acquire of handoffPermits for every (rule, key) through
// node id, in batches of 500.
func (l *handoffLoad) round(tc pb.TokenServiceClient) {
	var items []*pb.AcquireTokenRequest
	flush := func() {
		if len(items) == 0 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := tc.AcquireTokens(ctx, &pb.AcquireTokensRequest{Requests: items})
		l.calls.Add(1)
		if err == nil {
			l.mu.Lock()
			for i, r := range resp.GetResults() {
				if r.GetResponse().GetAllowed() {
					l.admitted[items[i].GetRule()+"/"+items[i].GetKey()] += r.GetResponse().GetGranted()
				}
			}
			l.mu.Unlock()
		}
		items = items[:0]
	}
	for name := range l.algs {
		for k := 0; k < handoffKeys; k++ {
			p := int64(handoffPermits)
			items = append(items, &pb.AcquireTokenRequest{Rule: name, Key: fmt.Sprintf("user-%d", k), Permits: &p})
			if len(items) == 500 {
				flush()
			}
		}
	}
	flush()
}

// start uses up most of every key, then runs raw rounds through the nodes
// that are up and an SDK on handoffSDKKeys keys, until stopAndCheck.
func (l *handoffLoad) start(t *testing.T, seeds []string) {
	for i := 0; i < 8; i++ {
		_, tc := l.node(i)
		l.round(tc)
	}
	ctx, stop := context.WithCancel(context.Background())
	l.stop = stop
	l.leases.start(t, ctx, seeds)
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			id, tc := l.node(i)
			if up, _ := l.running.Load(id); up == true {
				l.round(tc)
			}
		}
	}()
	l.began = time.Now()
	began := l.began
	// The call timeout of TestRollingRestart: generous for a loaded test
	// machine (the first calls on new connections), and the server
	// bounds a wait for a key in flight by the caller's deadline,
	// whatever it is.
	sdk, err := client.New(ctx, seeds, client.WithCallTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sdk.Close() })
	for name := range l.algs {
		lim := sdk.Limiter(name)
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				key := fmt.Sprintf("sdk-%d", i%handoffSDKKeys)
				d, err := lim.AllowN(ctx, key, 1)
				if ctx.Err() != nil {
					return
				}
				l.sdkCalls.Add(1)
				if d.Source != client.SourceServer && err != nil && strings.Contains(err.Error(), "the client connection is closing") {
					// The SDK closed its connection to a member the view
					// dropped while a call was on it: the SDK's doing
					// (client/), not a hold; counted apart.
					l.sdkConnClosing.Add(1)
				} else if d.Source != client.SourceServer {
					if l.sdkFallback.Add(1) <= 5 {
						t.Logf("SDK fallback at %v on %s/%s: %v", time.Since(began).Round(time.Millisecond), name, key, err)
					}
				}
				if d.Allowed {
					l.mu.Lock()
					l.admitted[name+"/"+key]++
					l.mu.Unlock()
				}
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
}

// stopAndCheck ends the load and fails the test if any (rule, key) was
// admitted more than its limit, or the SDK fell back; then it checks the
// concurrency leases (leaseLoad.check).
func (l *handoffLoad) stopAndCheck(t *testing.T, what string) {
	l.stop()
	l.wg.Wait()
	l.leases.check(t, what)
	over, worst, worstKey := 0, int64(0), ""
	perRule := map[string][]int64{}
	for k, n := range l.admitted {
		if n > worst {
			worst, worstKey = n, k
		}
		if n > handoffLimit {
			over++
		}
		perRule[k[:2]] = append(perRule[k[:2]], n)
	}
	for name, ns := range perRule {
		sort.Slice(ns, func(i, j int) bool { return ns[i] < ns[j] })
		t.Logf("FIGURE %s %s: admitted/limit per key min %d/%d, max %d/%d over %d keys", what, name, ns[0], handoffLimit, ns[len(ns)-1], handoffLimit, len(ns))
	}
	t.Logf("FIGURE %s: %d keys x %d rules, %d raw calls, %d SDK decisions (%d not by a server, %d more on a connection the SDK closed), worst key %s admitted %d/%d, %d keys over",
		what, handoffKeys+handoffSDKKeys, len(l.algs), l.calls.Load(), l.sdkCalls.Load(), l.sdkFallback.Load(), l.sdkConnClosing.Load(), worstKey, worst, handoffLimit, over)
	if over > 0 {
		t.Errorf("%d (rule, key) pairs admitted more than %d; worst %s: %d", over, handoffLimit, worstKey, worst)
	}
	if n := l.sdkFallback.Load(); n > 0 {
		t.Errorf("the SDK decided %d calls without a server: a key in flight must never send it into fallback", n)
	}
}

// TestHandoffRollingRestart restarts each node of a 3-node cluster in
// turn (SIGTERM: drain, handoff, restart) under raw gRPC and SDK load:
// the buckets move with their keys, so no key is admitted more than its
// 100 a day, and the SDK never falls back. (Before the handoff, every
// moved key started fresh and could take up to 3x.)
func TestHandoffRollingRestart(t *testing.T) {
	c := newProcCluster(t, 3)
	l := newHandoffLoad(t, c)
	l.start(t, []string{c.grpc["n0"], c.grpc["n1"], c.grpc["n2"]})
	for _, id := range c.ids {
		l.running.Store(id, false)
		start := time.Now()
		c.stop(id)
		t.Logf("stopped %s in %v (%v after the load began)", id, time.Since(start), time.Since(l.began).Round(time.Millisecond))
		c.start(id)
		l.running.Store(id, true)
		c.waitFor("all 3 back in the view", 60*time.Second, func() bool { return c.liveCount() == 3 })
		time.Sleep(2 * time.Second) // load runs on the new view (and its handoff)
	}
	l.stopAndCheck(t, "handoff rolling restart")
}

// TestHandoffScaleUpAndDown scales a cluster from 3 to 5 nodes and back
// to 3 under the same load: each join moves keys to the new member, each
// drain moves them back, and no key is admitted more than its limit.
func TestHandoffScaleUpAndDown(t *testing.T) {
	c := newProcCluster(t, 3)
	l := newHandoffLoad(t, c)
	l.start(t, []string{c.grpc["n0"], c.grpc["n1"], c.grpc["n2"]})
	dir := t.TempDir()
	added := []string{"n3", "n4"}
	for _, id := range added {
		c.join(id, dir)
		l.add(id, pb.NewTokenServiceClient(c.conns[id]))
		want := len(c.ids)
		c.waitFor(fmt.Sprintf("a view of %d", want), 60*time.Second, func() bool { return c.liveCount() == want })
		t.Logf("%s joined", id)
		time.Sleep(2 * time.Second)
	}
	for _, id := range added {
		l.running.Store(id, false)
		c.stop(id)
		t.Logf("%s stopped", id)
		want := 0
		for _, m := range c.ids {
			if c.procs[m] != nil {
				want++
			}
		}
		c.waitFor(fmt.Sprintf("a view of %d", want), 60*time.Second, func() bool { return c.liveCount() == want })
		time.Sleep(2 * time.Second)
	}
	l.stopAndCheck(t, "handoff scale 3-5-3")
}
