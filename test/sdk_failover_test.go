//go:build multiprocess

package e2e

// The SDK at the edges of issue 11, against real processes: a fresh node
// decides from its first rule write on, a node frozen with its connections
// open is routed around, a killed owner's keys are served again within a
// second, and a full restart never admits more than the fallback policy.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokenserver/tokenserver/client"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// gauge reads a client metric without labels from reg (-1 if absent).
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			m := mf.GetMetric()[0]
			if g := m.GetGauge(); g != nil {
				return g.GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	return -1
}

// rpcCount is tokenserver_client_rpcs_total for method in reg.
func rpcCount(t *testing.T, reg *prometheus.Registry, method string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "tokenserver_client_rpcs_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "method" && lp.GetValue() == method {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// decisionCount is tokenserver_client_decisions_total for rule, source and
// result in reg.
func decisionCount(t *testing.T, reg *prometheus.Registry, rule, source, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "tokenserver_client_decisions_total" {
			continue
		}
		want := map[string]string{"rule": rule, "source": source, "result": result}
		for _, m := range mf.GetMetric() {
			n := 0
			for _, lp := range m.GetLabel() {
				if v, ok := want[lp.GetName()]; ok && v == lp.GetValue() {
					n++
				}
			}
			if n == len(want) {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// dialNode opens a client connection to addr, closed in t.Cleanup.
func dialNode(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// sdkClient starts an SDK client of seeds on its own registry, closed in
// t.Cleanup.
func sdkClient(t *testing.T, seeds []string, opts ...client.Option) (*client.Client, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := client.New(ctx, seeds, append([]client.Option{client.WithMetrics(reg)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, reg
}

// keysOf returns n keys that node id owns in view.
func keysOf(view *pb.ClusterView, id, prefix string, n int) []string {
	var out []string
	for i := 0; len(out) < n; i++ {
		if k := fmt.Sprint(prefix, i); ownerOf(view, k) == id {
			out = append(out, k)
		}
	}
	return out
}

// putRuleEverywhere writes r through the leader and waits until every
// running node has it.
func (c *procCluster) putRuleEverywhere(r *pb.Rule) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.admin(c.leader("")).PutRule(ctx, &pb.PutRuleRequest{Rule: r}); err != nil {
		c.t.Fatal(err)
	}
	for _, id := range c.ids {
		if c.procs[id] == nil {
			continue
		}
		c.waitFor("rule "+r.GetName()+" on "+id, 30*time.Second, func() bool {
			_, err := c.admin(id).GetRule(ctx, &pb.GetRuleRequest{Name: r.GetName(), Local: true})
			return err == nil
		})
	}
}

// decision is one SDK decision seen by a load loop.
type decision struct {
	called  time.Time // when the call began
	at      time.Time // when it returned
	key     string
	source  client.Source
	allowed bool
	err     error
}

// loadLoop calls lim.AllowN on keys in turn, every pause, until stop is
// closed, and returns what it saw.
func loadLoop(lim *client.Limiter, keys []string, pause time.Duration, stop <-chan struct{}) <-chan []decision {
	out := make(chan []decision, 1)
	go func() {
		var seen []decision
		for i := 0; ; i++ {
			select {
			case <-stop:
				out <- seen
				return
			default:
			}
			k := keys[i%len(keys)]
			called := time.Now()
			d, err := lim.AllowN(context.Background(), k, 1)
			seen = append(seen, decision{called: called, at: time.Now(), key: k, source: d.Source, allowed: d.Allowed, err: err})
			time.Sleep(pause)
		}
	}()
	return out
}

// TestSDKFreshNodeDecidesFromFirstRuleWrite: on a single fresh node, 8
// goroutines × 100 Allow on a 100-token bucket, started right after PutRule
// returns, admit exactly 100, 10 times in a row. (Before: the node answered
// "no routing view" for ~0.4 s, the SDK fell back, and the rule, which has
// no fallback policy, admitted all 800.)
func TestSDKFreshNodeDecidesFromFirstRuleWrite(t *testing.T) {
	for run := 0; run < 10; run++ {
		s := startServer(t, "--node-id", "solo", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
			"--raft-addr", freePort(t), "--data-dir", t.TempDir())
		conn := dialNode(t, s.grpcAddr)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		for {
			_, err := pb.NewAdminServiceClient(conn).PutRule(ctx, &pb.PutRuleRequest{Rule: &pb.Rule{
				Name: "fresh", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 100, Period: durationpb.New(time.Hour)}})
			if err == nil {
				break
			}
			if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
				t.Fatalf("run %d: PutRule: %v", run, err)
			}
			time.Sleep(5 * time.Millisecond) // no leader yet
		}
		// A 500ms call timeout: on a loaded machine a fresh process now and
		// then answers slower than the default 50ms, and a timed-out call
		// falls back by design; this test is about the start-up window, in
		// which the node answered at once that it could not decide.
		sdk, reg := sdkClient(t, []string{s.grpcAddr}, client.WithCallTimeout(500*time.Millisecond))
		lim := sdk.Limiter("fresh")
		var admitted atomic.Int64
		var firstFallback atomic.Pointer[string]
		var wg sync.WaitGroup
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 100; i++ {
					d, err := lim.AllowN(ctx, "k", 1)
					if d.Allowed {
						admitted.Add(1)
					}
					if d.Source == client.SourceFallback {
						msg := fmt.Sprintf("%v (call %d of goroutine %d)", err, i, g)
						firstFallback.CompareAndSwap(nil, &msg)
					}
				}
			}()
		}
		wg.Wait()
		cancel()
		fb := decisionCount(t, reg, "fresh", "fallback", "allowed") + decisionCount(t, reg, "fresh", "fallback", "denied")
		t.Logf("run %d: admitted %d of 800 on a 100-token bucket; %v fallback decisions", run, admitted.Load(), fb)
		if admitted.Load() != 100 || fb != 0 {
			t.Fatalf("run %d: admitted %d of 800 right after PutRule on a fresh node, want exactly 100 (fallback decisions: %v, the first: %v)", run, admitted.Load(), fb, *firstFallback.Load())
		}
		sdk.Close()
		conn.Close()
		s.stop(t)
	}
}

// TestSDKFrozenWatchedNode: two clients follow the WatchClusterView stream
// of a node that is then frozen (SIGSTOP) with its connections open. Its
// keys are decided by the servers again within a second or so (the breaker
// sends them to their next owner), no call is allowed locally (the rule's
// fallback is DENY), and both clients route by the cluster's new view, which
// drops the frozen node, within --down-after (2 s) + 1 s.
func TestSDKFrozenWatchedNode(t *testing.T) {
	c := newProcCluster(t, 3)
	c.putRuleEverywhere(&pb.Rule{Name: "frz", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 1_000_000, Period: durationpb.New(time.Second),
		Fallback: &pb.Fallback{Policy: pb.FallbackPolicy_DENY}})
	// A client's watcher starts on the first member by id: n0.
	victim, other := "n0", "n1"
	view, err := c.token(other).GetClusterView(context.Background(), &pb.GetClusterViewRequest{})
	if err != nil {
		t.Fatal(err)
	}
	keys := keysOf(view, victim, "frozen-", 4)
	type follower struct {
		sdk  *client.Client
		reg  *prometheus.Registry
		seen <-chan []decision
	}
	stop := make(chan struct{})
	var fs []follower
	for i := 0; i < 2; i++ {
		sdk, reg := sdkClient(t, []string{c.grpc[other]}, client.WithCallTimeout(100*time.Millisecond))
		c.waitFor("the client's view of 3", 10*time.Second, func() bool { return gauge(t, reg, "tokenserver_client_view_members") == 3 })
		fs = append(fs, follower{sdk: sdk, reg: reg, seen: loadLoop(sdk.Limiter("frz"), keys, 2*time.Millisecond, stop)})
	}
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
	}()
	time.Sleep(300 * time.Millisecond) // load before the freeze

	watches := make([]float64, len(fs))
	for i, f := range fs {
		watches[i] = rpcCount(t, f.reg, "WatchClusterView")
	}
	role := "a follower"
	if c.leader("") == victim {
		role = "the leader"
	}
	pid := c.procs[victim].cmd.Process.Pid
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGCONT) }) // before startServer's kill
	frozen := time.Now()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var dropped time.Time // the cluster's view without the frozen node
	clientView := make([]time.Duration, len(fs))
	deadline := frozen.Add(20 * time.Second)
	for (dropped.IsZero() || slices.Contains(clientView, 0)) && time.Now().Before(deadline) {
		if dropped.IsZero() {
			ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
			if v, err := c.token(other).GetClusterView(ctx, &pb.GetClusterViewRequest{}); err == nil && len(v.GetMembers()) == 2 {
				dropped = time.Now()
			}
			cancel()
		}
		for i, f := range fs {
			if clientView[i] == 0 && gauge(t, f.reg, "tokenserver_client_view_members") == 2 {
				clientView[i] = time.Since(frozen)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(time.Second) // load on the new view
	close(stop)
	if dropped.IsZero() {
		t.Fatal("the cluster never dropped the frozen node from its view")
	}
	for i, f := range fs {
		seen := <-f.seen
		var lastFallback time.Time
		var served, fellBack, allowedLocally int
		firstServed := map[string]time.Duration{}
		for _, d := range seen {
			if d.at.Before(frozen) {
				continue
			}
			if _, ok := firstServed[d.key]; !ok && d.source != client.SourceFallback {
				firstServed[d.key] = d.at.Sub(frozen)
			}
			switch d.source {
			case client.SourceFallback:
				fellBack++
				lastFallback = d.at
				t.Logf("client %d: fallback %v after SIGSTOP for %s: %v", i, d.at.Sub(frozen).Round(time.Millisecond), d.key, d.err)
				if d.allowed {
					allowedLocally++
				}
			default:
				served++
			}
		}
		around := time.Duration(0)
		if !lastFallback.IsZero() {
			around = lastFallback.Sub(frozen)
		}
		var routed time.Duration // every key decided by a server again
		for _, d := range firstServed {
			routed = max(routed, d)
		}
		t.Logf("FIGURE frozen watched node (%s), client %d: every key decided by a server %v after SIGSTOP, the last fallback decision %v after it; client on the cluster's new view %v after SIGSTOP (the cluster dropped the node after %v; --down-after 2s); %d calls after the freeze: %d by servers, %d fallback (DENY), %d allowed locally",
			role, i, routed.Round(time.Millisecond), around.Round(time.Millisecond), clientView[i].Round(time.Millisecond), dropped.Sub(frozen).Round(time.Millisecond), served+fellBack, served, fellBack, allowedLocally)
		if moved := rpcCount(t, f.reg, "WatchClusterView") - watches[i]; moved < 1 {
			t.Errorf("client %d opened no new watch stream after the freeze: it did not follow the frozen node, or never moved off it", i)
		}
		if allowedLocally != 0 {
			t.Errorf("client %d: %d calls allowed locally under a DENY fallback", i, allowedLocally)
		}
		if clientView[i] == 0 || clientView[i] > dropped.Sub(frozen)+time.Second+2*time.Second {
			t.Errorf("client %d: on the cluster's new view after %v; the cluster dropped the node after %v (bound: +1 s, +2 s slack for a shared machine)", i, clientView[i], dropped.Sub(frozen))
		}
		// Every key is decided by a server again well before the view
		// drops the node: ~0.3 s here (3 timeouts open the breaker); the
		// bound is generous for a shared machine.
		for _, k := range keys {
			if d, ok := firstServed[k]; !ok || d > 2*time.Second {
				t.Errorf("client %d: key %s first decided by a server %v after SIGSTOP (served: %v; generous bound 2 s)", i, k, d, ok)
			}
		}
		// Regression: when the client took the new view before a server
		// did, that server forwarded the key to the frozen node and the call
		// timed out: a fallback at each view change. A loaded machine times
		// out a 100 ms call now and then; a handful is all that may fall back.
		if fellBack > max(10, (served+fellBack)/20) {
			t.Errorf("client %d: %d of %d calls fell back after the freeze", i, fellBack, served+fellBack)
		}
	}
}

// killTrial kills the owner of keys (a follower) under SDK load and
// returns how long after the kill the last fallback decision and the first
// server decision for every key came, how many fallback decisions there
// were, and the admissions per key from the kill to the end of the trial.
// The owner is started again and back in the view when it returns.
func killTrial(t *testing.T, c *procCluster, sdk *client.Client, rule string) (fallback, served time.Duration, fellBack int, admitted map[string]int) {
	t.Helper()
	leader := c.leader("")
	var victim string
	for _, id := range c.ids {
		if id != leader {
			victim = id
		}
	}
	view, err := c.token(leader).GetClusterView(context.Background(), &pb.GetClusterViewRequest{})
	if err != nil {
		t.Fatal(err)
	}
	keys := keysOf(view, victim, fmt.Sprint("kill-", time.Now().UnixNano(), "-"), 4)
	stop := make(chan struct{})
	seen := loadLoop(sdk.Limiter(rule), keys, time.Millisecond, stop)
	time.Sleep(200 * time.Millisecond)
	killed := time.Now()
	c.kill(victim)
	// Admissions of calls begun once the process is gone are the fresh
	// bucket's alone. A call begun before could be granted by the dying
	// owner's bucket and return after `killed`: counting it (CI: 21 of
	// 20, from one such grant) measured the old bucket, not the bound.
	dead := time.Now()
	time.Sleep(3 * time.Second)
	close(stop)
	firstServed := map[string]time.Time{}
	admitted = map[string]int{}
	var lastFallback time.Time
	for _, d := range <-seen {
		if d.at.Before(killed) {
			continue
		}
		if d.allowed && !d.called.Before(dead) {
			admitted[d.key]++
		}
		if d.source == client.SourceFallback {
			lastFallback = d.at
			fellBack++
			t.Logf("fallback %v after the kill for %s: %v", d.at.Sub(killed).Round(time.Millisecond), d.key, d.err)
		} else if firstServed[d.key].IsZero() {
			firstServed[d.key] = d.at
		}
	}
	if !lastFallback.IsZero() {
		fallback = lastFallback.Sub(killed)
	}
	for _, k := range keys {
		if firstServed[k].IsZero() {
			served = 3 * time.Second
		} else {
			served = max(served, firstServed[k].Sub(killed))
		}
	}
	c.start(victim)
	c.waitFor("the killed node back in the view", 60*time.Second, func() bool { return c.liveCount() == 3 })
	return fallback, served, fellBack, admitted
}

// TestSDKKilledOwner: kill -9 of a key's owner under SDK load. The keys are
// decided by servers again at once (the SDK and the forwarding nodes send
// them to their next owner in rendezvous order), and each key admits at
// most one fresh bucket (20) after the move. Generous bounds here; `make
// figures` measures 10 kills.
func TestSDKKilledOwner(t *testing.T) {
	c := newProcCluster(t, 3)
	c.putRuleEverywhere(&pb.Rule{Name: "kill", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 20, Period: durationpb.New(time.Hour),
		Fallback: &pb.Fallback{Policy: pb.FallbackPolicy_DENY}})
	sdk, _ := sdkClient(t, []string{c.grpc["n0"], c.grpc["n1"], c.grpc["n2"]})
	for trial := 0; trial < 2; trial++ {
		fallback, served, fellBack, admitted := killTrial(t, c, sdk, "kill")
		t.Logf("kill %d: every key served by a server again within %v; %d fallback decisions, the last %v after the kill; admitted after the kill %v (bound: one fresh bucket, 20 per key)",
			trial, served.Round(time.Millisecond), fellBack, fallback.Round(time.Millisecond), admitted)
		if served > 2*time.Second {
			t.Errorf("kill %d: a key was first served by a server %v after the kill (generous bound 2 s; target 1 s)", trial, served)
		}
		for k, n := range admitted {
			if n > 20 {
				t.Errorf("kill %d: key %s admitted %d after the kill, bound one fresh bucket (20)", trial, k, n)
			}
		}
	}
}

// TestSDKFullRestart: every node of a 3-node cluster restarted at once
// under SDK load. A DENY rule is never allowed locally (before, the SDK
// took the empty rule list of a node replaying its log and forgot the
// policy: 644 local allows); a LOCAL rule admits locally within its
// per-instance limit.
func TestSDKFullRestart(t *testing.T) {
	c := newProcCluster(t, 3)
	c.putRuleEverywhere(&pb.Rule{Name: "rd", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 1_000_000, Period: durationpb.New(time.Second),
		Fallback: &pb.Fallback{Policy: pb.FallbackPolicy_DENY}})
	c.putRuleEverywhere(&pb.Rule{Name: "rl", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 1_000_000, Period: durationpb.New(10 * time.Second),
		Fallback: &pb.Fallback{Policy: pb.FallbackPolicy_LOCAL, Limit: 5}})
	sdk, reg := sdkClient(t, []string{c.grpc["n0"], c.grpc["n1"], c.grpc["n2"]})
	keys := []string{"a", "b", "c", "d", "e", "f"}
	stop := make(chan struct{})
	seenD := loadLoop(sdk.Limiter("rd"), keys, 2*time.Millisecond, stop)
	seenL := loadLoop(sdk.Limiter("rl"), keys, 2*time.Millisecond, stop)
	time.Sleep(300 * time.Millisecond)
	start := time.Now()
	for _, id := range c.ids {
		c.kill(id)
	}
	time.Sleep(500 * time.Millisecond) // fallback while everything is down
	for _, id := range c.ids {
		c.start(id)
	}
	c.waitFor("the cluster back", 60*time.Second, func() bool { return c.liveCount() == 3 })
	c.waitFor("the SDK back on the servers", 30*time.Second, func() bool {
		d, err := sdk.Limiter("rd").AllowN(context.Background(), "probe", 1)
		return err == nil && d.Source == client.SourceServer
	})
	elapsed := time.Since(start)
	close(stop)
	dd, dl := <-seenD, <-seenL
	localD := 0
	for _, d := range dd {
		if d.source == client.SourceFallback && d.allowed {
			localD++
		}
		if d.err != nil && !errors.Is(d.err, client.ErrUnavailable) {
			t.Errorf("rd: unexpected error %v", d.err)
		}
	}
	localL := map[string]int{}
	for _, d := range dl {
		if d.source == client.SourceFallback && d.allowed {
			localL[d.key]++
		}
	}
	// LOCAL: 5 per 10 s per key for this instance, bursting 5.
	bound := 5 + int(5*elapsed.Seconds()/10) + 1
	t.Logf("full restart (%v until back on the servers): DENY rule %d calls, %d allowed locally (metric: %v); LOCAL rule local admissions per key %v (bound %d)",
		elapsed.Round(time.Millisecond), len(dd), localD, decisionCount(t, reg, "rd", "fallback", "allowed"), localL, bound)
	if localD != 0 || decisionCount(t, reg, "rd", "fallback", "allowed") != 0 {
		t.Errorf("DENY rule allowed %d calls locally during a full restart", localD)
	}
	for k, n := range localL {
		if n > bound {
			t.Errorf("LOCAL rule key %s admitted %d locally in %v, bound %d", k, n, elapsed, bound)
		}
	}
}
