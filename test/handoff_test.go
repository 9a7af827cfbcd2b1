//go:build multiprocess

package e2e

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
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
		c.grpc[id] = freePort(t)
		c.args[id] = append([]string{"--node-id", id, "--grpc-addr", c.grpc[id], "--http-addr", freePort(t), "--raft-addr", freePort(t),
			"--data-dir", filepath.Join(dir, id), "--join", c.grpc["n0"], "--stabilization-time", "1s"}, fastRaft...)
		c.start(id)
		conn, err := grpc.NewClient(c.grpc[id], grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		c.ids = append(c.ids, id)
		c.conns[id] = conn
		l.add(id, pb.NewTokenServiceClient(conn))
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

// The concurrency rules of the lease load: raw gRPC holds leases of
// leaseRule (which live an hour: none expires during a test) on
// leaseKeys keys, the SDK holds leases of leaseSDKRule (which live
// leaseSDKPeriod, renewed by the SDK every third of it while held) on
// leaseSDKKeys keys.
const (
	leaseRule      = "cc"
	leaseLimit     = 5
	leaseKeys      = 100
	leaseSDKRule   = "cs"
	leaseSDKLimit  = 3
	leaseSDKKeys   = 20
	leaseSDKPeriod = 6 * time.Second
)

// leaseLoad holds and releases concurrency leases across the moves of a
// handoff test. This test is the only client of its keys and no lease
// expires while it is held, so what it holds is what the owner counts:
// it checks that no key ever holds more than its limit (in flight), that
// every release is honoured once (RefillToken gives the lease back, and
// a second release of it gives nothing), that the SDK loses no lease
// (its renewals reach the lease wherever it moved), and, at the end, that
// every key's leases all came back. Keys a call left in doubt (an
// acquire without an answer, a release the SDK could not make in its
// time) are left out of that last check only, and counted.
type leaseLoad struct {
	l *handoffLoad
	// epoch is the highest view epoch an acquire answered with; a lease
	// taken under a lower one is released after a view change.
	epoch atomic.Uint64

	mu sync.Mutex
	// held are the raw leases held per key, oldest first; tainted the
	// keys a call left in doubt (an acquire or release without an
	// answer), whose count the final check cannot know.
	held    map[string][]heldLease
	tainted map[string]bool
	// sdkHeld counts the SDK's handles per key; sdkDoubt are the keys of
	// a release the SDK could not make (its lease expires by itself).
	sdkHeld  map[string]int
	sdkDoubt map[string]bool
	// problems are the violations found, the first few kept.
	problems []string
	nproblem int

	acquired, released, releasedAfterMove, releasedTwice, releaseErrs, batchErrs atomic.Int64
	// sdkConnClosing counts acquires failed on a connection the SDK
	// closed itself (as handoffLoad.sdkConnClosing).
	sdkAcquired, sdkFallback, sdkConnClosing, sdkLost, sdkReleaseErrs atomic.Int64
}

type heldLease struct {
	grant string
	epoch uint64
}

func newLeaseLoad(t *testing.T, l *handoffLoad) *leaseLoad {
	for _, r := range []*pb.Rule{
		{Name: leaseRule, Algorithm: pb.Algorithm_CONCURRENCY, Limit: leaseLimit, Period: durationpb.New(time.Hour), Fallback: &pb.Fallback{Policy: pb.FallbackPolicy_DENY}},
		{Name: leaseSDKRule, Algorithm: pb.Algorithm_CONCURRENCY, Limit: leaseSDKLimit, Period: durationpb.New(leaseSDKPeriod), Fallback: &pb.Fallback{Policy: pb.FallbackPolicy_DENY}},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if _, err := l.c.admin(l.c.leader("")).PutRule(ctx, &pb.PutRuleRequest{Rule: r}); err != nil {
			t.Fatalf("put %s: %v", r.Name, err)
		}
		cancel()
	}
	return &leaseLoad{l: l, held: map[string][]heldLease{}, tainted: map[string]bool{}, sdkHeld: map[string]int{}, sdkDoubt: map[string]bool{}}
}

// problem records a violation.
func (q *leaseLoad) problem(format string, args ...any) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.nproblem++
	if len(q.problems) < 40 {
		q.problems = append(q.problems, fmt.Sprintf(format, args...))
	}
}

// start runs the raw lease rounds and the SDK lease holders until ctx
// ends.
func (q *leaseLoad) start(t *testing.T, ctx context.Context, seeds []string) {
	q.l.wg.Add(1)
	go func() {
		defer q.l.wg.Done()
		for i := 0; ctx.Err() == nil; i++ {
			id, tc := q.l.node(i)
			if up, _ := q.l.running.Load(id); up == true {
				q.round(id, tc, i)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	sdk, err := client.New(ctx, seeds, client.WithCallTimeout(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sdk.Close() })
	lim := sdk.Limiter(leaseSDKRule)
	for w := 0; w < 4; w++ {
		q.l.wg.Add(1)
		go func() {
			defer q.l.wg.Done()
			var hs sync.WaitGroup
			defer hs.Wait()
			for i := w; ctx.Err() == nil; i += 4 {
				key := fmt.Sprintf("sdkc-%d", i%leaseSDKKeys)
				h, err := lim.Acquire(ctx, key)
				if ctx.Err() != nil {
					if err == nil {
						q.sdkRelease(key, h)
					}
					return
				}
				var denied *client.DeniedError
				switch {
				case errors.As(err, &denied):
				case err != nil && strings.Contains(err.Error(), "the client connection is closing"):
					q.sdkConnClosing.Add(1) // the SDK's doing (see handoffLoad.sdkConnClosing)
				case err != nil:
					if q.sdkFallback.Add(1) <= 5 {
						t.Logf("SDK lease acquire on %s not decided by a server: %v", key, err)
					}
				default:
					q.sdkAcquired.Add(1)
					q.mu.Lock()
					q.sdkHeld[key]++
					n := q.sdkHeld[key]
					q.mu.Unlock()
					if n > leaseSDKLimit {
						q.problem("SDK key %s holds %d leases, above its limit of %d", key, n, leaseSDKLimit)
					}
					hs.Add(1)
					go func() { // held for a while, across moves now and then
						defer hs.Done()
						// Up to 2.9 s: a hold past a third of the
						// period is renewed once, none outlives it.
						time.Sleep(time.Duration(100+(i*37)%2800) * time.Millisecond)
						q.sdkRelease(key, h)
					}()
				}
				time.Sleep(5 * time.Millisecond)
			}
		}()
	}
}

// sdkRelease releases h, counted off before the server hears of it, so
// that the count never runs above what the owner holds.
func (q *leaseLoad) sdkRelease(key string, h *client.Handle) {
	q.mu.Lock()
	q.sdkHeld[key]--
	q.mu.Unlock()
	if h.Lost() {
		q.sdkLost.Add(1)
		q.problem("SDK lease of %s lost: its owner did not renew it", key)
	}
	err := h.Release()
	if err == nil {
		return
	}
	// The release did not reach a server in the SDK's time (its call
	// timeout, or a connection the SDK closed itself when a member left
	// its view, as handoffLoad.sdkConnClosing): the lease expires by
	// itself (client.Handle.Release), so the final check skips the key.
	if strings.Contains(err.Error(), "the client connection is closing") {
		q.sdkConnClosing.Add(1)
	} else if q.sdkReleaseErrs.Add(1) <= 3 {
		q.l.c.t.Logf("SDK release of a lease of %s: %v", key, err)
	}
	q.mu.Lock()
	q.sdkDoubt[key] = true
	q.mu.Unlock()
}

// round takes a lease of every raw key through tc (admitted exactly while
// the key holds fewer than its limit), then releases the oldest lease of
// every key holding more than one, each release checked, one in five
// released twice.
func (q *leaseLoad) round(via string, tc pb.TokenServiceClient, round int) {
	items := make([]*pb.AcquireTokenRequest, leaseKeys)
	for k := range items {
		items[k] = &pb.AcquireTokenRequest{Rule: leaseRule, Key: fmt.Sprintf("lease-%d", k)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	resp, err := tc.AcquireTokens(ctx, &pb.AcquireTokensRequest{Requests: items})
	cancel()
	q.mu.Lock()
	if err != nil && strings.Contains(err.Error(), "no routing view yet") {
		// A node that has just started refuses before it decides
		// anything: nothing was granted.
		q.mu.Unlock()
		return
	}
	if err != nil && q.batchErrs.Add(1) <= 3 {
		q.l.c.t.Logf("lease batch through %s: %v (its keys are in doubt)", via, err)
	}
	for k, it := range items {
		if err != nil {
			q.tainted[it.GetKey()] = true // granted or not: unknown
			continue
		}
		res := resp.GetResults()[k]
		if st := res.GetStatus(); st != nil && st.GetCode() != 0 {
			switch codes.Code(st.GetCode()) {
			case codes.DeadlineExceeded, codes.Canceled, codes.Unknown, codes.Internal:
				q.tainted[it.GetKey()] = true // perhaps granted on its owner
			}
			continue
		}
		r := res.GetResponse()
		if !r.GetAllowed() {
			continue
		}
		for e := q.epoch.Load(); r.GetEpoch() > e && !q.epoch.CompareAndSwap(e, r.GetEpoch()); e = q.epoch.Load() {
		}
		q.acquired.Add(1)
		q.held[it.GetKey()] = append(q.held[it.GetKey()], heldLease{grant: r.GetGrantId(), epoch: r.GetEpoch()})
		if n := len(q.held[it.GetKey()]); n > leaseLimit {
			q.nproblem++
			if len(q.problems) < 10 {
				q.problems = append(q.problems, fmt.Sprintf("raw key %s holds %d leases, above its limit of %d", it.GetKey(), n, leaseLimit))
			}
		}
	}
	type rel struct {
		key string
		l   heldLease
	}
	var rels []rel
	for key, hs := range q.held {
		if len(hs) > 1 { // a key in doubt still releases the leases it knows
			rels = append(rels, rel{key, hs[0]})
			q.held[key] = hs[1:]
		}
	}
	q.mu.Unlock()
	var wg sync.WaitGroup
	next := make(chan rel)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range next {
				q.release(via, tc, r.key, r.l, (round+len(r.key))%5 == 0)
			}
		}()
	}
	for _, r := range rels {
		next <- r
	}
	close(next)
	wg.Wait()
}

// release ends lease l of key through tc, retrying a call that got no
// answer: the first release must give the lease back, a second (twice)
// nothing.
func (q *leaseLoad) release(via string, tc pb.TokenServiceClient, key string, l heldLease, twice bool) {
	var errs []string
	start := time.Now()
	refill := func() (int64, error) {
		var err error
		for try := 0; try < 5; try++ {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			var resp *pb.RefillTokenResponse
			resp, err = tc.RefillToken(ctx, &pb.RefillTokenRequest{Rule: leaseRule, Key: key, GrantId: l.grant})
			cancel()
			if err == nil {
				return resp.GetRefilled(), nil
			}
			errs = append(errs, fmt.Sprintf("%v: %v", time.Since(start).Round(time.Millisecond), err))
			time.Sleep(50 * time.Millisecond)
		}
		return 0, err
	}
	got, err := refill()
	if err != nil {
		q.releaseErrs.Add(1)
		q.mu.Lock()
		q.tainted[key] = true // released or not: unknown
		q.mu.Unlock()
		return
	}
	q.released.Add(1)
	if l.epoch < q.epoch.Load() {
		q.releasedAfterMove.Add(1)
	}
	if got != 1 {
		q.problem("release of a lease of %s (taken at epoch %d, now %d) gave back %d after %v via %s, want 1 (earlier tries: %v)", key, l.epoch, q.epoch.Load(), got, time.Since(start).Round(time.Millisecond), via, errs)
		return
	}
	if !twice {
		return
	}
	if got, err = refill(); err == nil {
		q.releasedTwice.Add(1)
		if got != 0 {
			q.problem("a second release of a lease of %s gave back %d, want 0", key, got)
		}
	}
}

// check releases every lease still held, then fails the test on any
// violation seen, or if a key's leases did not all come back: each key
// not left in doubt must then have its whole limit free.
func (q *leaseLoad) check(t *testing.T, what string) {
	id, tc := q.l.node(0)
	for i := 0; ; i++ { // a node that is up
		if up, _ := q.l.running.Load(id); up == true {
			break
		}
		id, tc = q.l.node(i + 1)
	}
	q.mu.Lock()
	held := q.held
	q.held = map[string][]heldLease{}
	q.mu.Unlock()
	for key, hs := range held {
		for _, l := range hs {
			q.release(id, tc, key, l, false)
		}
	}
	free := func(name, key string, want int64) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		zero := int64(0)
		resp, err := tc.AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: name, Key: key, Permits: &zero})
		if err != nil {
			q.problem("peek %s/%s: %v", name, key, err)
		} else if got := resp.GetRemaining(); got != want {
			q.problem("%s/%s has %d of %d leases free once all were released: a release was lost", name, key, got, want)
		}
	}
	q.mu.Lock()
	tainted := len(q.tainted)
	for k := 0; k < leaseKeys; k++ {
		if key := fmt.Sprintf("lease-%d", k); !q.tainted[key] {
			q.mu.Unlock()
			free(leaseRule, key, leaseLimit)
			q.mu.Lock()
		}
	}
	q.mu.Unlock()
	for k := 0; k < leaseSDKKeys; k++ { // the SDK released all its handles when the load stopped
		if key := fmt.Sprintf("sdkc-%d", k); !q.sdkDoubt[key] {
			free(leaseSDKRule, key, leaseSDKLimit)
		}
	}
	t.Logf("FIGURE %s leases: raw %d taken, %d released (%d after a view change, %d released twice), %d releases unanswered, %d of %d keys in doubt; SDK %d taken, %d not by a server, %d calls on a connection the SDK closed (%d keys in doubt), %d lost, %d more releases not made in time",
		what, q.acquired.Load(), q.released.Load(), q.releasedAfterMove.Load(), q.releasedTwice.Load(), q.releaseErrs.Load(), tainted, leaseKeys,
		q.sdkAcquired.Load(), q.sdkFallback.Load(), q.sdkConnClosing.Load(), len(q.sdkDoubt), q.sdkLost.Load(), q.sdkReleaseErrs.Load())
	for _, p := range q.problems {
		t.Errorf("leases: %s", p)
	}
	if q.nproblem > len(q.problems) {
		t.Errorf("leases: %d more problems", q.nproblem-len(q.problems))
	}
	if q.releasedAfterMove.Load() == 0 {
		t.Errorf("leases: no lease was released after a view change: the test did not test the handoff of leases")
	}
	if n := q.sdkFallback.Load(); n > 0 {
		t.Errorf("leases: the SDK decided %d lease acquires without a server", n)
	}
}
