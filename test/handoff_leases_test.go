//go:build multiprocess

package e2e

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokenserver/tokenserver/client"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

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
					// The SDK's doing (see handoffLoad.sdkConnClosing);
					// the server may have granted the lease.
					q.sdkConnClosing.Add(1)
					q.mu.Lock()
					q.sdkDoubt[key] = true
					q.mu.Unlock()
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
	if notReady(err) {
		// A node that has just started (no routing view yet, or its
		// log not replayed) refuses before it decides anything:
		// nothing was granted.
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

// notReady reports whether err is a node's NOT_READY: it was reached and
// decided nothing.
func notReady(err error) bool {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unavailable {
		return false
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetReason() == pb.NotReadyReason {
			return true
		}
	}
	return false
}
