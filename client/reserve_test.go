package client

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokenserver/tokenserver/internal/auth"
	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// TestReserveCommitSteps: a reservation takes its estimate; a commit
// below it gives the difference back, above it charges the extra into
// debt; a retried commit changes nothing; a key in debt is denied. Per
// algorithm that takes commits, against the in-process server.
func TestReserveCommitSteps(t *testing.T) {
	type step struct {
		estimate, used   int64
		reserveRemaining int64 // after the reservation
		remaining, debt  int64 // after the commit
		retry            bool  // commit the previous reservation again instead
	}
	steps := []step{
		{estimate: 10, used: 4, reserveRemaining: 90, remaining: 96},
		{retry: true, used: 50, remaining: 96},
		{estimate: 10, used: 30, reserveRemaining: 86, remaining: 66},
		{estimate: 60, used: 120, reserveRemaining: 6, remaining: 0, debt: 54},
	}
	for _, alg := range []bucket.Algorithm{bucket.TokenBucket, bucket.FixedWindow, bucket.SlidingWindow} {
		t.Run(alg.String(), func(t *testing.T) {
			ts := newTestServer(t)
			ts.put(&rule.Rule{Name: "cost", Algorithm: alg, Limit: 100, Period: time.Hour})
			c, _ := newClient(t, []string{ts.addr}, WithCallTimeout(2*time.Second))
			waitRule(t, c, "cost")
			lim := c.Limiter("cost")
			ctx := shortCtx(t)
			var r *Reservation
			for i, s := range steps {
				if !s.retry {
					var err error
					if r, err = lim.Reserve(ctx, "tenant", s.estimate); err != nil {
						t.Fatalf("step %d: Reserve(%d): %v", i, s.estimate, err)
					}
					if got := r.Decision().Remaining; got != s.reserveRemaining {
						t.Errorf("step %d: remaining after Reserve(%d) = %d, want %d", i, s.estimate, got, s.reserveRemaining)
					}
				}
				got, err := r.Commit(s.used)
				if err != nil {
					t.Fatalf("step %d: Commit(%d): %v", i, s.used, err)
				}
				if got.Remaining != s.remaining || got.Debt != s.debt {
					t.Errorf("step %d: Commit(%d) = %+v, want remaining %d debt %d", i, s.used, got, s.remaining, s.debt)
				}
				if s.debt > 0 && got.RetryAfter <= 0 {
					t.Errorf("step %d: in debt with no retry-after: %+v", i, got)
				}
			}
			_, err := lim.Reserve(ctx, "tenant", 1)
			var de *DeniedError
			if !errors.As(err, &de) || de.RetryAfter <= 0 {
				t.Errorf("Reserve in debt: %v, want a *DeniedError with a retry-after", err)
			}
		})
	}
}

// TestReserveBadInput: used < 0, a negative estimate, and a grant that
// names another key change nothing and say why.
func TestReserveBadInput(t *testing.T) {
	ts := newTestServer(t)
	ts.put(tokenBucket("cost", 100, time.Hour, 0))
	c, _ := newClient(t, []string{ts.addr}, WithCallTimeout(2*time.Second))
	waitRule(t, c, "cost")
	lim := c.Limiter("cost")
	ctx := shortCtx(t)
	if _, err := lim.Reserve(ctx, "a", -1); !errors.Is(err, ErrInvalid) {
		t.Errorf("Reserve(-1) = %v, want ErrInvalid", err)
	}
	r, err := lim.Reserve(ctx, "a", 10)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Commit(-1); !errors.Is(err, ErrInvalid) {
		t.Errorf("Commit(-1) = %v, want ErrInvalid", err)
	}
	other := &Reservation{l: lim, key: "b", estimate: r.estimate, grant: r.grant, decision: r.decision} // a's grant under key b
	if _, err := other.Commit(1); !errors.Is(err, ErrReservationNotFound) {
		t.Errorf("Commit of a's grant under key b = %v, want ErrReservationNotFound", err)
	}
	if got := ts.remaining("cost", "a"); got != 90 {
		t.Errorf("key a remaining = %d after refused commits, want 90 (unchanged)", got)
	}
	if got := ts.remaining("cost", "b"); got != 100 {
		t.Errorf("key b remaining = %d, want 100 (untouched)", got)
	}
}

// TestReserveWithLeasingLimiter: on a limiter that leases, a
// reservation is its own server grant, never taken from the lease, so its
// commit settles exactly against the server's accounting while the
// limiter's AllowN calls are served from leases.
func TestReserveWithLeasingLimiter(t *testing.T) {
	ts := newTestServer(t)
	r := tokenBucket("cost", 1000, time.Hour, 0)
	r.Lease = rule.Lease{MaxBatch: 50, TTL: time.Minute}
	ts.put(r)
	c, _ := newClient(t, []string{ts.addr}, WithCallTimeout(2*time.Second))
	waitRule(t, c, "cost")
	lim := c.Limiter("cost", WithLease(50, time.Minute))
	ctx := shortCtx(t)
	for i := 0; i < 20; i++ { // make the key hot: later calls lease
		if d, err := lim.AllowN(ctx, "hot", 1); err != nil || !d.Allowed {
			t.Fatalf("AllowN %d: %+v %v", i, d, err)
		}
	}
	if testutil.ToFloat64(lim.m.granted) == 0 {
		t.Fatal("the hot key took no lease: the test would not show a reservation beside a lease")
	}
	before := ts.remaining("cost", "hot")
	for i := 0; i < 10; i++ {
		res, err := lim.Reserve(ctx, "hot", 5)
		if err != nil {
			t.Fatalf("Reserve %d: %v", i, err)
		}
		if res.Decision().Source != SourceServer || res.grant == "" {
			t.Fatalf("Reserve %d decided by %v with grant %q, want the server with a grant", i, res.Decision().Source, res.grant)
		}
		if _, err := res.Commit(7); err != nil {
			t.Fatalf("Commit %d: %v", i, err)
		}
	}
	if got := ts.remaining("cost", "hot"); got != before-70 {
		t.Errorf("server remaining %d after 10 reservations committed at 7, want %d", got, before-70)
	}
	if got := rpcs(c, "CommitToken"); got != 10 {
		t.Errorf("CommitToken RPCs = %v, want 10", got)
	}
}

// TestReserveFallbackLocalCharges: a reservation the LOCAL fallback
// granted settles locally: the overrun is charged to the local limiter,
// once.
func TestReserveFallbackLocalCharges(t *testing.T) {
	ts := newTestServer(t)
	c, _ := newClient(t, []string{ts.addr}, WithCallTimeout(50*time.Millisecond))
	ts.stop()
	lim := c.Limiter("gone", WithFallback(FallbackLocal, 10))
	ctx := shortCtx(t)
	r, err := lim.Reserve(ctx, "k", 2)
	if err != nil || r.Decision().Source != SourceFallback {
		t.Fatalf("Reserve while the server is down: %v, %+v", err, r)
	}
	s, err := r.Commit(15) // 10 per second locally: 2 reserved, 13 more charged
	if err != nil || s.Debt != 5 || s.RetryAfter < 500*time.Millisecond {
		t.Fatalf("Commit(15) of a local reservation of 2 = %+v, %v; want debt 5 with a retry-after of about 600ms", s, err)
	}
	if again, _ := r.Commit(15); again != (Settlement{}) {
		t.Errorf("a second local commit = %+v, want nothing charged", again)
	}
	if d, _ := lim.AllowN(ctx, "k", 1); d.Allowed {
		t.Errorf("AllowN after a local overrun past the limit: allowed, want denied")
	}
}

// TestReserveAndAllowAllAuthRefused: a refused credential is returned by
// Reserve, Commit and AllowAll, and never turned into an allow, whatever
// the fallback policy says.
func TestReserveAndAllowAllAuthRefused(t *testing.T) {
	addr, a, file := authServer(t)
	c, err := New(shortCtx(t), []string{addr}, WithToken("client-token"), WithCallTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	lim := c.Limiter("r", WithFallback(FallbackAllow, 0))
	if err := os.WriteFile(file, []byte(auth.TokenLine("other", "x", auth.RoleClient)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	if r, err := lim.Reserve(shortCtx(t), "k", 1); r != nil || !errors.Is(err, ErrAuth) || status.Code(err) != codes.Unauthenticated {
		t.Errorf("Reserve = %v, %v; want nil and ErrAuth (Unauthenticated)", r, err)
	}
	held := &Reservation{l: lim, key: "k", estimate: 1, grant: "granted-before", decision: Decision{Allowed: true, Source: SourceServer}}
	if _, err := held.Commit(3); !errors.Is(err, ErrAuth) {
		t.Errorf("Commit = %v, want ErrAuth", err)
	}
	d, err := c.AllowAll(shortCtx(t), Item{Rule: "r", Key: "k", N: 1}, Item{Rule: "r", Key: "j", N: 1})
	if d.Allowed || !errors.Is(err, ErrAuth) {
		t.Errorf("AllowAll = %+v, %v; want denied with ErrAuth", d, err)
	}
	if c.InFallback() {
		t.Error("a refused credential put the client in fallback")
	}
}

// TestAllowAllAcrossLevels: org, team and user budgets are granted
// together or not at all; a denied level leaves the others as they were.
func TestAllowAllAcrossLevels(t *testing.T) {
	ts := newTestServer(t)
	ts.put(tokenBucket("org", 100, time.Hour, 0))
	ts.put(tokenBucket("team", 20, time.Hour, 0))
	ts.put(tokenBucket("user", 6, time.Hour, 0))
	c, _ := newClient(t, []string{ts.addr}, WithCallTimeout(2*time.Second))
	ctx := shortCtx(t)
	items := []Item{{"org", "acme", 2}, {"team", "acme/ml", 2}, {"user", "acme/ml/ann", 2}}
	for i := 0; i < 3; i++ {
		d, err := c.AllowAll(ctx, items...)
		if err != nil || !d.Allowed || len(d.Items) != 3 {
			t.Fatalf("AllowAll %d: %+v, %v", i, d, err)
		}
	}
	d, err := c.AllowAll(ctx, items...)
	if err != nil || d.Allowed || d.RetryAfter <= 0 {
		t.Fatalf("AllowAll past the user's limit: %+v, %v; want denied with a retry-after", d, err)
	}
	for _, it := range items {
		want := map[string]int64{"org": 94, "team": 14, "user": 0}[it.Rule]
		if got := ts.remaining(it.Rule, it.Key); got != want {
			t.Errorf("%s remaining %d after a denied AllowAll, want %d (nothing charged)", it.Rule, got, want)
		}
	}
	if _, err := c.AllowAll(ctx, Item{"org", "acme", 1}, Item{"nosuch", "acme", 1}); !errors.Is(err, ErrNotFound) {
		t.Errorf("AllowAll with an unknown rule: %v, want ErrNotFound", err)
	}
	if got := ts.remaining("org", "acme"); got != 94 {
		t.Errorf("org remaining %d after an AllowAll with an unknown rule, want 94", got)
	}
	if _, err := c.AllowAll(ctx, Item{"org", "", 1}); !errors.Is(err, ErrInvalid) {
		t.Errorf("AllowAll with an empty key: %v, want ErrInvalid", err)
	}
}

// mixedServer grants every AcquireTokens item but the last, with grant
// ids, ignoring all_or_nothing (a server that predates it), and counts the
// refills it gets.
type mixedServer struct {
	oneNodeServer
	refills chan string
}

func (s *mixedServer) AcquireTokens(_ context.Context, req *pb.AcquireTokensRequest) (*pb.AcquireTokensResponse, error) {
	out := &pb.AcquireTokensResponse{}
	for i := range req.GetRequests() {
		r := &pb.AcquireTokenResponse{Allowed: true, Granted: 1, GrantId: fmt.Sprintf("g%d", i)}
		if i == len(req.GetRequests())-1 {
			r = &pb.AcquireTokenResponse{RetryAfterNs: int64(time.Second)}
		}
		out.Results = append(out.Results, &pb.AcquireTokensResult{Response: r})
	}
	return out, nil
}

func (s *mixedServer) RefillToken(_ context.Context, req *pb.RefillTokenRequest) (*pb.RefillTokenResponse, error) {
	s.refills <- req.GetGrantId()
	return &pb.RefillTokenResponse{}, nil
}

// TestAllowAllGivesBackWhenTheServerDidNot: a server that answers some
// items granted and one denied (it ignored all_or_nothing) gets the
// granted ones back from the SDK, and the caller sees a denial.
func TestAllowAllGivesBackWhenTheServerDidNot(t *testing.T) {
	s := &mixedServer{refills: make(chan string, 10)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = ln.Addr().String()
	s.rule = &pb.ClientRule{Name: "r", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 1, Period: durationpb.New(time.Hour), Version: 1}
	srv := grpc.NewServer()
	pb.RegisterTokenServiceServer(srv, s)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	c, _ := newClient(t, []string{s.addr}, WithCallTimeout(time.Second))
	d, err := c.AllowAll(shortCtx(t), Item{"r", "a", 1}, Item{"r", "b", 1}, Item{"r", "c", 1})
	if err != nil || d.Allowed || d.RetryAfter != time.Second {
		t.Fatalf("AllowAll = %+v, %v; want denied with the denied item's retry-after", d, err)
	}
	for _, it := range d.Items {
		if it.Allowed {
			t.Errorf("item shown allowed in a denied AllowAll: %+v", d.Items)
		}
	}
	got := map[string]bool{}
	for len(got) < 2 {
		select {
		case id := <-s.refills:
			got[id] = true
		case <-time.After(5 * time.Second):
			t.Fatalf("refills %v, want g0 and g1 given back", got)
		}
	}
	if !got["g0"] || !got["g1"] {
		t.Errorf("refills %v, want g0 and g1", got)
	}
}
