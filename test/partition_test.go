//go:build multiprocess

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// The partition tests: three tokenserver processes, each in its own
// network namespace (netns_test.go), one of them cut off for a while and
// healed, under a steady stream of rule writes.

// partUpAfter is the partition cluster's --up-after (fastRaft's).
const partUpAfter = 3 * time.Second

// nsCluster is a cluster of processes in a netLab.
type nsCluster struct {
	t     *testing.T
	lab   *netLab
	procs []*serverProc
	conns []*grpc.ClientConn
	http  []*http.Client
}

func newNSCluster(t *testing.T, n int) *nsCluster {
	t.Helper()
	lab := newNetLab(t, n)
	c := &nsCluster{t: t, lab: lab}
	var peers []string
	for i := range n {
		peers = append(peers, fmt.Sprintf("n%d=%s:7071", i, lab.ip(i)))
	}
	dir := t.TempDir()
	for i := range n {
		ip := lab.ip(i)
		args := append([]string{"--log-format", "json", "--insecure", "--node-id", fmt.Sprintf("n%d", i),
			"--grpc-addr", ip + ":7070", "--raft-addr", ip + ":7071", "--http-addr", ip + ":7072",
			"--data-dir", filepath.Join(dir, fmt.Sprintf("n%d", i)), "--bootstrap-expect", fmt.Sprint(n), "--peers", strings.Join(peers, ",")},
			fastRaft...)
		c.procs = append(c.procs, startServerCmd(t, lab.command(i, bin(t, "tokenserver"), args...)))
		conn, err := grpc.NewClient(ip+":7070", grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(lab.dialer(i)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		c.conns = append(c.conns, conn)
		c.http = append(c.http, lab.httpClient(i))
	}
	c.waitFor("every node ready", 60*time.Second, func() bool {
		for i := range n {
			if !c.ready(i) {
				return false
			}
		}
		return true
	})
	return c
}

func (c *nsCluster) admin(i int) pb.AdminServiceClient { return pb.NewAdminServiceClient(c.conns[i]) }
func (c *nsCluster) token(i int) pb.TokenServiceClient { return pb.NewTokenServiceClient(c.conns[i]) }

// ready asks node i's /readyz.
func (c *nsCluster) ready(i int) bool {
	resp, err := c.http[i].Get(fmt.Sprintf("http://%s:7072/readyz", c.lab.ip(i)))
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func (c *nsCluster) waitFor(what string, bound time.Duration, cond func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			c.t.Fatalf("%s: not within %v", what, bound)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// call runs f with a 1 s deadline.
func call[T any](f func(ctx context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return f(ctx)
}

// leader is the leader's index as node i sees it (-1: none).
func (c *nsCluster) leader(i int) int {
	st, err := call(func(ctx context.Context) (*pb.ClusterStatusResponse, error) {
		return c.admin(i).ClusterStatus(ctx, &pb.ClusterStatusRequest{})
	})
	if err != nil || st.GetLeader() == "" {
		return -1
	}
	var l int
	fmt.Sscanf(st.GetLeader(), "n%d", &l)
	return l
}

// liveOn reports whether node i's view, as it answers, lists node j.
func (c *nsCluster) liveOn(i, j int) (bool, error) {
	v, err := call(func(ctx context.Context) (*pb.ClusterView, error) {
		return c.token(i).GetClusterView(ctx, &pb.GetClusterViewRequest{})
	})
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(v.GetMembers(), func(m *pb.Member) bool { return m.GetId() == fmt.Sprintf("n%d", j) }), nil
}

// table lists node i's own copy of the rules: name → version.
func (c *nsCluster) table(i int) (map[string]uint64, error) {
	out := map[string]uint64{}
	token := ""
	for {
		resp, err := call(func(ctx context.Context) (*pb.ListRulesResponse, error) {
			return c.admin(i).ListRules(ctx, &pb.ListRulesRequest{Local: true, PageSize: 1000, PageToken: token})
		})
		if err != nil {
			return nil, err
		}
		for _, r := range resp.GetRules() {
			out[r.GetName()] = r.GetVersion()
		}
		if token = resp.GetNextPageToken(); token == "" {
			return out, nil
		}
	}
}

// writer puts rules through the nodes in turn (except skip) until stop,
// and returns the acknowledged names.
func (c *nsCluster) writer(skip int, stop <-chan struct{}) <-chan []string {
	done := make(chan []string, 1)
	go func() {
		var acked []string
		for k := 0; ; k++ {
			select {
			case <-stop:
				done <- acked
				return
			default:
			}
			i := k % len(c.conns)
			if i == skip {
				continue
			}
			name := fmt.Sprintf("w-%05d", k)
			_, err := call(func(ctx context.Context) (*pb.PutRuleResponse, error) {
				return c.admin(i).PutRule(ctx, &pb.PutRuleRequest{Rule: rulePB(name, 1000)})
			})
			if err == nil {
				acked = append(acked, name)
			}
			time.Sleep(20 * time.Millisecond) // a steady load, not a flood
		}
	}()
	return done
}

// partitionResult is what one partition run measured.
type partitionResult struct {
	notReadyAfter time.Duration // from the cut to the cut-off node's /readyz failing
	serveAfter    time.Duration // from the heal to the healed node serving
	readyAfter    time.Duration // from the heal to its /readyz passing
	acked         int
}

// runPartition cuts a follower off for d, heals it, and checks what the
// issue asks: the cut-off node is not ready while dropped (item 20), the
// healed node serves within up-after + 1 s (item 15), no acknowledged
// write is lost, and every node ends with the same rule table.
func runPartition(t *testing.T, d time.Duration) partitionResult {
	c := newNSCluster(t, 3)
	var res partitionResult
	if _, err := call(func(ctx context.Context) (*pb.PutRuleResponse, error) {
		return c.admin(0).PutRule(ctx, &pb.PutRuleRequest{Rule: rulePB("api", 1_000_000)})
	}); err != nil {
		t.Fatal(err)
	}
	l := c.leader(0)
	if l < 0 {
		t.Fatal("no leader")
	}
	victim := (l + 1) % 3
	stop := make(chan struct{})
	var stopOnce sync.Once
	stopWriter := func() { stopOnce.Do(func() { close(stop) }) }
	t.Cleanup(stopWriter)
	acked := c.writer(victim, stop)

	c.lab.cut(victim)
	cut := time.Now()
	// The majority drops the victim from its view after down-after, and
	// the victim, though its own view still lists it, reports not ready.
	other := (victim + 1) % 3
	c.waitFor("the majority drops the cut-off node", d, func() bool {
		live, err := c.liveOn(other, victim)
		return err == nil && !live
	})
	c.waitFor("the cut-off node reports not ready", d-time.Since(cut), func() bool { return !c.ready(victim) })
	res.notReadyAfter = time.Since(cut)
	if live, err := c.liveOn(victim, victim); err == nil && !live {
		t.Log("note: the cut-off node's own view dropped it")
	}
	// Stay cut for the rest of d; the node must stay not ready.
	for time.Since(cut) < d {
		if c.ready(victim) {
			t.Fatalf("the cut-off node reported ready %v into the partition", time.Since(cut).Round(time.Millisecond))
		}
		time.Sleep(250 * time.Millisecond)
	}

	c.lab.heal(victim)
	healed := time.Now()
	// Serving: a rule write through the healed node (forwarded to the
	// leader) and an acquire of a key another node owns (forwarded).
	owner := func(key string) string {
		v, err := call(func(ctx context.Context) (*pb.ClusterView, error) {
			return c.token(other).GetClusterView(ctx, &pb.GetClusterViewRequest{})
		})
		if err != nil {
			return ""
		}
		return ownerOf(v, key)
	}
	key := ""
	for k := 0; key == "" && k < 1000; k++ {
		if o := owner(fmt.Sprint("k", k)); o != "" && o != fmt.Sprintf("n%d", victim) {
			key = fmt.Sprint("k", k)
		}
	}
	if key == "" {
		t.Fatal("no key owned by a node of the majority")
	}
	// Serving is answering calls: a rule write through the healed node
	// (forwarded to the leader) and an acquire of a key another node owns
	// (forwarded): the issue's target is up-after + 1 s. Ready is /readyz,
	// which waits for the view to take the node back: up-after once the
	// leader's health check of it passes, so up-after plus the peer
	// connection's reconnect backoff (up to 1 s), a liveness tick and the
	// server's readiness poll (readyBound).
	bound, readyBound := partUpAfter+time.Second, partUpAfter+3*time.Second
	var serveFail, readyAt time.Duration
	var serveFailMsg string
	var failAtBound string
	c.waitFor("the healed node serves and is ready", 2*time.Minute, func() bool {
		var fail []string
		if _, err := call(func(ctx context.Context) (*pb.PutRuleResponse, error) {
			return c.admin(victim).PutRule(ctx, &pb.PutRuleRequest{Rule: rulePB("after-heal", 10)})
		}); err != nil {
			fail = append(fail, "rule write: "+err.Error())
		}
		if _, err := call(func(ctx context.Context) (*pb.AcquireTokenResponse, error) {
			return c.token(victim).AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: "api", Key: key})
		}); err != nil {
			fail = append(fail, "acquire of another node's key: "+err.Error())
		}
		if len(fail) == 0 && res.serveAfter == 0 {
			res.serveAfter = time.Since(healed)
		}
		if len(fail) > 0 {
			serveFail, serveFailMsg = time.Since(healed), strings.Join(fail, "; ")
		}
		// Ready in the majority's view too: right after the heal the node
		// can pass /readyz for a moment on its stale view.
		ready := c.ready(victim)
		if ready {
			live, err := c.liveOn(other, victim)
			ready = err == nil && live
		}
		if !ready {
			readyAt = 0
		} else if readyAt == 0 {
			readyAt = time.Since(healed)
		}
		if !ready {
			fail = append(fail, "/readyz not ready")
		}
		if failAtBound == "" && time.Since(healed) > bound && len(fail) > 0 {
			failAtBound = strings.Join(fail, "; ")
		}
		return res.serveAfter > 0 && readyAt > 0 && time.Since(healed)-readyAt > time.Second // ready, and stays so
	})
	res.readyAfter = readyAt
	if serveFail > res.serveAfter {
		// Logged, not failed: an election after the heal answers a
		// forwarded write UNAVAILABLE "retry", which a client retries.
		t.Logf("note: the healed node served at %v, then failed again at %v: %s", res.serveAfter, serveFail, serveFailMsg)
	}
	stopWriter()
	names := <-acked
	res.acked = len(names)

	// No acknowledged write lost, and identical tables everywhere.
	var tables []map[string]uint64
	c.waitFor("identical rule tables", 20*time.Second, func() bool {
		tables = tables[:0]
		for i := range 3 {
			tb, err := c.table(i)
			if err != nil {
				return false
			}
			tables = append(tables, tb)
		}
		return mapsEqual(tables[0], tables[1]) && mapsEqual(tables[0], tables[2])
	})
	for _, n := range names {
		if _, ok := tables[0][n]; !ok {
			t.Errorf("acknowledged write %s lost", n)
		}
	}
	if res.serveAfter > bound {
		t.Errorf("the healed node served %v after the heal, past up-after + 1 s = %v; at %v still failing: %s",
			res.serveAfter.Round(time.Millisecond), bound, bound, failAtBound)
	}
	if res.readyAfter > readyBound {
		t.Errorf("the healed node was ready %v after the heal, past up-after + 3 s = %v; at %v still failing: %s",
			res.readyAfter.Round(time.Millisecond), readyBound, bound, failAtBound)
	}
	return res
}

func mapsEqual(a, b map[string]uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestIssue20Item15_20_Partition20s cuts a follower off for 20 s (issue
// 20, items 15 and 20).
func TestIssue20Item15_20_Partition20s(t *testing.T) {
	t.Parallel() // mostly waiting: runs beside the other waiting tests (Makefile: -parallel 4)
	r := runPartition(t, 20*time.Second)
	logPartitionFigure(t, 20*time.Second, r)
}

// logPartitionFigure reports a partition run's figures.
func logPartitionFigure(t *testing.T, d time.Duration, r partitionResult) {
	t.Logf("FIGURE partition %v: cut-off node not ready %v after the cut; healed node serves %v and is ready %v after the heal (up-after %v); %d writes acknowledged, none lost",
		d, r.notReadyAfter.Round(time.Millisecond), r.serveAfter.Round(time.Millisecond), r.readyAfter.Round(time.Millisecond), partUpAfter, r.acked)
}
