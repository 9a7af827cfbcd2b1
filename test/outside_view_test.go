//go:build multiprocess

package e2e

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// TestOutsideItsViewNeverStartsFresh: a node outside its own view (here
// draining, in its --drain-linger; after a restart, before it hears that
// it is back) that a forwarded call reaches for a key it holds nothing of
// asks the key's owner in its view. When that owner does not answer
// (frozen, SIGSTOP), the node waits for the key's state and then holds
// the call (a deny with a short retry_after; a settlement is Unavailable),
// as a new owner does for a key in flight: it never decides the key on a
// fresh bucket. Regression (the handoff tests' SDK lease load, a key
// holding 4 leases of 3, and a release answered "nothing of it here"
// while the lease was on its way): with no handoff expected, such a node
// took an owner that did not answer as "nothing in flight" and started
// the key fresh.
func TestOutsideItsViewNeverStartsFresh(t *testing.T) {
	c := newProcCluster(t, 3, "--drain-linger", "8s")
	c.putRuleEverywhere(&pb.Rule{Name: "co", Algorithm: pb.Algorithm_CONCURRENCY, Limit: 1, Period: durationpb.New(time.Hour),
		Fallback: &pb.Fallback{Policy: pb.FallbackPolicy_DENY}})
	leader := c.leader("")
	var drain, owner string // neither leads: the frozen owner must not stop the cluster
	for _, id := range c.ids {
		switch {
		case id == leader:
		case drain == "":
			drain = id
		default:
			owner = id
		}
	}
	v := c.fullView(leader)
	var without []*pb.Member // the view once drain has left
	for _, m := range v.GetMembers() {
		if m.GetId() != drain {
			without = append(without, m)
		}
	}
	key := ""
	for i := 0; key == ""; i++ {
		if k := fmt.Sprint("co-", i); ownerOf(&pb.ClusterView{Members: without}, k) == owner && ownerOf(v, k) == owner {
			key = k
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	lease, err := c.token(owner).AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: "co", Key: key})
	if err != nil || !lease.GetAllowed() {
		t.Fatalf("the key's one lease on its owner %s: %v %v", owner, lease, err)
	}

	p := c.procs[drain]
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	c.waitFor(drain+" outside its own view", 20*time.Second, func() bool {
		cctx, ccancel := context.WithTimeout(ctx, time.Second)
		defer ccancel()
		got, err := c.token(drain).GetClusterView(cctx, &pb.GetClusterViewRequest{})
		if err != nil {
			return false
		}
		for _, m := range got.GetMembers() {
			if m.GetId() == drain {
				return false
			}
		}
		return len(got.GetMembers()) == 2
	})
	o := c.procs[owner]
	if err := o.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	cont := func() { _ = o.cmd.Process.Signal(syscall.SIGCONT) }
	t.Cleanup(cont)

	fwd := metadata.AppendToOutgoingContext(ctx, pb.ForwardedHeader, "1")
	call := func(what string, f func(context.Context) (string, error)) {
		cctx, ccancel := context.WithTimeout(fwd, 900*time.Millisecond)
		defer ccancel()
		start := time.Now()
		got, err := f(cctx)
		t.Logf("%s forwarded to %s (outside its view, owner %s frozen): %s, %v in %v", what, drain, owner, got, err, time.Since(start).Round(time.Millisecond))
		if err == nil && got != "held" {
			t.Errorf("%s forwarded to %s while the key's owner %s did not answer: %s; want it held (the key's state is on %s)", what, drain, owner, got, owner)
		}
	}
	call("an acquire", func(ctx context.Context) (string, error) {
		r, err := c.token(drain).AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: "co", Key: key})
		if err != nil || r.GetAllowed() {
			return fmt.Sprintf("allowed %v", r.GetAllowed()), err
		}
		return "held", nil
	})
	call("a release", func(ctx context.Context) (string, error) {
		r, err := c.token(drain).RefillToken(ctx, &pb.RefillTokenRequest{Rule: "co", Key: key, GrantId: lease.GetGrantId()})
		return fmt.Sprintf("refilled %d", r.GetRefilled()), err
	})
	cont()
	// The owner still holds the key's state, and the key never holds two
	// leases. n0's questions to the frozen owner waited in its socket and
	// may run when it resumes, after n0 gave up on them (any RPC to a
	// stalled peer can): the release gives the lease back once, whichever
	// runs it, and the question's acquire may take the lease again, which
	// then waits for its expiry (under-admission, never over).
	r, err := c.token(owner).RefillToken(ctx, &pb.RefillTokenRequest{Rule: "co", Key: key, GrantId: lease.GetGrantId()})
	if err != nil || r.GetRefilled() > 1 {
		t.Fatalf("release on the owner %s once it runs again: %v %v", owner, r, err)
	}
	allowed := 0
	for range 2 {
		a, err := c.token(owner).AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: "co", Key: key})
		if err != nil {
			t.Fatalf("acquire on the owner %s after the release: %v", owner, err)
		}
		if a.GetAllowed() {
			allowed++
		}
	}
	if allowed > 1 {
		t.Fatalf("the owner %s granted %d more leases of a limit of 1 after the release", owner, allowed)
	}
	select {
	case err := <-p.exited:
		if err != nil {
			t.Fatalf("%s exited with %v after SIGTERM", drain, err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not exit within 30 s of SIGTERM", drain)
	}
	c.procs[drain] = nil
}
