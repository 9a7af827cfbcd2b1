//go:build multiprocess

package e2e

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokenserver/tokenserver/internal/cluster"
	"github.com/tokenserver/tokenserver/internal/testcluster"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// procCluster is N tokenserver processes started with --bootstrap-expect.
type procCluster struct {
	t     *testing.T
	ids   []string
	args  map[string][]string
	procs map[string]*serverProc
	conns map[string]*grpc.ClientConn
	grpc  map[string]string
	// pki, when set, runs the nodes with TLS on gRPC and HTTP, mutual TLS
	// on Raft and between nodes, and token auth; the test's connections
	// use TLS and the admin token.
	pki *testcluster.PKI
}

// fastRaft are the test timeouts (heartbeat and election 300 ms, leader
// lease 150 ms) and a short liveness hysteresis.
var fastRaft = []string{"--raft-heartbeat-timeout", "300ms", "--raft-election-timeout", "300ms",
	"--raft-leader-lease-timeout", "150ms", "--down-after", "2s", "--up-after", "3s"}

func newProcCluster(t *testing.T, n int, extra ...string) *procCluster {
	return startProcCluster(&procCluster{t: t}, n, extra...)
}

// newSecureProcCluster is newProcCluster with TLS, peer mTLS and token
// auth (certificates and tokens in c.pki).
func newSecureProcCluster(t *testing.T, n int, extra ...string) *procCluster {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("n%d", i)
	}
	return startProcCluster(&procCluster{t: t, pki: testcluster.NewPKI(t, ids...)}, n, extra...)
}

func startProcCluster(c *procCluster, n int, extra ...string) *procCluster {
	t := c.t
	c.args, c.procs, c.conns, c.grpc = map[string][]string{}, map[string]*serverProc{}, map[string]*grpc.ClientConn{}, map[string]string{}
	raft := map[string]string{}
	var peers []string
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("n%d", i)
		c.ids = append(c.ids, id)
		raft[id], c.grpc[id] = freePort(t), freePort(t)
		peers = append(peers, id+"="+raft[id])
	}
	dir := t.TempDir()
	for _, id := range c.ids {
		c.args[id] = append([]string{"--node-id", id, "--grpc-addr", c.grpc[id], "--http-addr", freePort(t), "--raft-addr", raft[id],
			"--data-dir", filepath.Join(dir, id), "--bootstrap-expect", strconv.Itoa(n), "--peers", strings.Join(peers, ",")}, append(fastRaft, extra...)...)
		if c.pki != nil {
			c.args[id] = append(c.args[id], c.pki.NodeArgs(id)...)
		}
	}
	for _, id := range c.ids {
		c.start(id)
	}
	c.dial()
	c.waitFor("a leader and a view of all nodes", 60*time.Second, func() bool { return c.liveCount() == n })
	return c
}

func (c *procCluster) start(id string) { c.procs[id] = startServer(c.t, c.args[id]...) }

// dial opens a client connection to every node.
func (c *procCluster) dial() {
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if c.pki != nil {
		opts = c.pki.DialOptions("admin")
	}
	for _, id := range c.ids {
		conn, err := grpc.NewClient(c.grpc[id], opts...)
		if err != nil {
			c.t.Fatal(err)
		}
		c.conns[id] = conn
		c.t.Cleanup(func() { conn.Close() })
	}
}

func rulePB(name string, limit int64) *pb.Rule {
	return &pb.Rule{Name: name, Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: limit, Period: durationpb.New(time.Second)}
}

func (c *procCluster) admin(id string) pb.AdminServiceClient {
	return pb.NewAdminServiceClient(c.conns[id])
}
func (c *procCluster) token(id string) pb.TokenServiceClient {
	return pb.NewTokenServiceClient(c.conns[id])
}

// status asks node id for the cluster status (1 s).
func (c *procCluster) status(id string) (*pb.ClusterStatusResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return c.admin(id).ClusterStatus(ctx, &pb.ClusterStatusRequest{})
}

// leader returns the leader id as seen by any running node.
func (c *procCluster) leader(except string) string {
	for _, id := range c.ids {
		if id == except || c.procs[id] == nil {
			continue
		}
		if st, err := c.status(id); err == nil && st.GetLeader() != "" && st.GetLeader() != except {
			return st.GetLeader()
		}
	}
	return ""
}

// liveCount is the number of live members every running node agrees on.
func (c *procCluster) liveCount() int {
	n := -1
	for _, id := range c.ids {
		if c.procs[id] == nil {
			continue
		}
		st, err := c.status(id)
		if err != nil || st.GetLeader() == "" {
			return -1
		}
		live := 0
		for _, m := range st.GetMembers() {
			if m.GetLive() {
				live++
			}
		}
		if n != -1 && live != n {
			return -1
		}
		n = live
	}
	return n
}

func (c *procCluster) waitFor(what string, bound time.Duration, cond func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			c.t.Fatalf("%s: not within %v", what, bound)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *procCluster) kill(id string) {
	c.t.Helper()
	p := c.procs[id]
	if err := p.cmd.Process.Kill(); err != nil {
		c.t.Fatal(err)
	}
	<-p.exited
	c.procs[id] = nil
}

func (c *procCluster) stop(id string) {
	c.t.Helper()
	c.procs[id].stop(c.t)
	c.procs[id] = nil
}

// nodeStatus returns (applied index, rules digest) of node id.
func (c *procCluster) nodeStatus(id string) (uint64, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	ns, err := c.admin(id).NodeStatus(ctx, &pb.NodeStatusRequest{})
	return ns.GetAppliedIndex(), ns.GetRulesDigest(), err
}

// History of rule operations, for porcupine.

type ruleInput struct {
	put   bool
	name  string
	value int64
}

type ruleOutput struct {
	value   int64 // limit read; 0 for "no such rule"
	unknown bool  // a write whose outcome is unknown (error or timeout)
}

var ruleModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		for _, op := range history {
			n := op.Input.(ruleInput).name
			by[n] = append(by[n], op)
		}
		keys := make([]string, 0, len(by))
		for k := range by {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, by[k])
		}
		return out
	},
	Init: func() any { return int64(0) },
	Step: func(state, input, output any) (bool, any) {
		in, out := input.(ruleInput), output.(ruleOutput)
		if in.put {
			return true, in.value
		}
		return out.value == state.(int64), state
	},
	Equal: func(a, b any) bool { return a.(int64) == b.(int64) },
	DescribeOperation: func(input, output any) string {
		in, out := input.(ruleInput), output.(ruleOutput)
		if in.put {
			return fmt.Sprintf("put(%s, %d) unknown=%v", in.name, in.value, out.unknown)
		}
		return fmt.Sprintf("get(%s) -> %d", in.name, out.value)
	},
}

type history struct {
	mu  sync.Mutex
	ops []porcupine.Operation
}

func (h *history) add(op porcupine.Operation) {
	h.mu.Lock()
	h.ops = append(h.ops, op)
	h.mu.Unlock()
}

var start = time.Now()

func now() int64 { return int64(time.Since(start)) }

// put writes rule `name` with limit `value` through node id and records it.
func (c *procCluster) put(h *history, client int, id, name string, value int64) error {
	call := now()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := c.admin(id).PutRule(ctx, &pb.PutRuleRequest{Rule: &pb.Rule{Name: name, Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: value, Period: durationpb.New(time.Minute)}})
	ret := now()
	out := ruleOutput{}
	if err != nil {
		// It may or may not have been applied: it may take effect at any
		// time after its call.
		out.unknown, ret = true, math.MaxInt64
	}
	h.add(porcupine.Operation{ClientId: client, Input: ruleInput{put: true, name: name, value: value}, Call: call, Output: out, Return: ret})
	return err
}

// get reads rule `name` (a current read) through node id and records it.
func (c *procCluster) get(h *history, client int, id, name string) (int64, error) {
	call := now()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	r, err := c.admin(id).GetRule(ctx, &pb.GetRuleRequest{Name: name})
	ret := now()
	switch {
	case status.Code(err) == codes.NotFound:
	case err != nil:
		return 0, err // a failed read observed nothing
	}
	h.add(porcupine.Operation{ClientId: client, Input: ruleInput{name: name}, Call: call, Output: ruleOutput{value: r.GetLimit()}, Return: ret})
	return r.GetLimit(), nil
}

// TestClusterFailover is the Raft issue's multi-process test: 3 processes,
// rule writes through followers under load, kill -9 of the leader, a new
// leader with every acknowledged rule, keys of every owner served by the
// survivors, the killed node catching up, and a full restart; the rule
// history is checked for linearizability and the replicas for equality.
//
// It runs as production should: TLS on gRPC and HTTP, mutual TLS on Raft
// and between nodes, every call with a bearer token (the other
// multi-process tests run in the clear).
func TestClusterFailover(t *testing.T) {
	c := newSecureProcCluster(t, 3)
	clusterFailover(t, c)
	// The rules were written by the token's principal, through whichever
	// node took the write.
	if !t.Failed() {
		r, err := c.admin(c.ids[0]).GetRule(context.Background(), &pb.GetRuleRequest{Name: "load"})
		if err != nil || r.GetUpdatedBy() != "token:admin-user" {
			t.Errorf("rule load: updated_by %q, %v; want token:admin-user", r.GetUpdatedBy(), err)
		}
	}
}

// TestClusterFailoverPlaintext is TestClusterFailover as the no-flag nodes
// run: plain TCP, no auth.
func TestClusterFailoverPlaintext(t *testing.T) {
	clusterFailover(t, newProcCluster(t, 3))
}

func clusterFailover(t *testing.T, c *procCluster) {
	h := &history{}
	const names = 60
	ruleName := func(i int) string { return fmt.Sprintf("lin-%02d", i) }

	// Seed a rule for the acquire load.
	leader := c.leader("")
	follower := c.ids[0]
	if follower == leader {
		follower = c.ids[1]
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	if _, err := c.admin(follower).PutRule(ctx, &pb.PutRuleRequest{Rule: &pb.Rule{Name: "load", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 1000000, Period: durationpb.New(time.Second)}}); err != nil {
		t.Fatalf("put through follower %s: %v", follower, err)
	}
	cancel()

	// Background load, bounded by stop and by 3 minutes.
	stop := make(chan struct{})
	deadline := time.After(3 * time.Minute)
	var wg sync.WaitGroup
	var acquiresOK, acquiresErr, writesOK, writesErr atomic.Int64
	var value atomic.Int64
	running := func() bool {
		select {
		case <-stop:
			return false
		case <-deadline:
			return false
		default:
			return true
		}
	}
	alive := func() []string {
		var out []string
		for _, id := range c.ids {
			if c.procs[id] != nil {
				out = append(out, id)
			}
		}
		return out
	}
	var aliveMu sync.Mutex
	aliveNow := func() []string { aliveMu.Lock(); defer aliveMu.Unlock(); return alive() }
	for w := 0; w < 4; w++ { // acquire load: ~4 x 800/s
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(5 * time.Millisecond)
			defer tick.Stop()
			for running() {
				<-tick.C
				ids := aliveNow()
				for i := 0; i < 4; i++ {
					ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
					_, err := c.token(ids[rand.IntN(len(ids))]).AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: "load", Key: fmt.Sprint("user-", rand.IntN(10000))})
					cancel()
					if err != nil {
						acquiresErr.Add(1)
					} else {
						acquiresOK.Add(1)
					}
				}
			}
		}()
	}
	for w := 0; w < 4; w++ { // rule writers: names of parity w%2, so 2 writers per name
		wg.Add(1)
		go func() {
			defer wg.Done()
			for running() {
				ids := aliveNow()
				name := ruleName(2*rand.IntN(names/2) + w%2)
				if err := c.put(h, w, ids[rand.IntN(len(ids))], name, value.Add(1)); err != nil {
					writesErr.Add(1)
					time.Sleep(50 * time.Millisecond)
				} else {
					writesOK.Add(1)
				}
				time.Sleep(time.Duration(50+rand.IntN(50)) * time.Millisecond)
			}
		}()
	}
	for r := 0; r < 2; r++ { // readers
		wg.Add(1)
		go func() {
			defer wg.Done()
			for running() {
				ids := aliveNow()
				c.get(h, 10+r, ids[rand.IntN(len(ids))], ruleName(rand.IntN(names)))
				time.Sleep(time.Duration(50+rand.IntN(50)) * time.Millisecond)
			}
		}()
	}

	time.Sleep(3 * time.Second)
	leader = c.leader("")
	if leader == "" {
		t.Fatal("no leader before the kill")
	}
	t.Logf("killing leader %s", leader)
	killedAt := time.Now()
	aliveMu.Lock()
	c.kill(leader)
	aliveMu.Unlock()
	var newLeader string
	c.waitFor("a new leader", 30*time.Second, func() bool { newLeader = c.leader(leader); return newLeader != "" })
	t.Logf("new leader %s after %v", newLeader, time.Since(killedAt).Round(time.Millisecond))
	before := writesOK.Load()
	c.waitFor("rule writes accepted again", 30*time.Second, func() bool { return writesOK.Load() > before+5 })

	// Once the view drops the killed node, keys of every owner are served
	// by the survivors, through any survivor.
	c.waitFor("the view drops the killed node", 30*time.Second, func() bool { return c.liveCount() == 2 })
	view, err := c.token(newLeader).GetClusterView(context.Background(), &pb.GetClusterViewRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var members []cluster.Member
	for _, m := range view.GetMembers() {
		members = append(members, cluster.Member{ID: m.GetId()})
	}
	v := cluster.NewView(view.GetEpoch(), members)
	for _, m := range members {
		key := ""
		for i := 0; ; i++ {
			if o, _ := v.Owner(fmt.Sprint("owned-", i)); o.ID == m.ID {
				key = fmt.Sprint("owned-", i)
				break
			}
		}
		for _, via := range aliveNow() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			resp, err := c.token(via).AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: "load", Key: key})
			cancel()
			if err != nil || !resp.GetAllowed() {
				t.Fatalf("acquire for %s (owner %s) via %s after failover: %v %v", key, m.ID, via, resp, err)
			}
		}
	}

	// The killed node comes back and catches up.
	aliveMu.Lock()
	c.start(leader)
	aliveMu.Unlock()
	c.waitFor("the restarted node catches up", 30*time.Second, func() bool {
		ai, dg, err := c.nodeStatus(leader)
		li, ld, lerr := c.nodeStatus(newLeader)
		return err == nil && lerr == nil && dg == ld && ai >= li-5
	})
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	t.Logf("load: %d acquires ok, %d failed; %d rule writes acknowledged, %d not", acquiresOK.Load(), acquiresErr.Load(), writesOK.Load(), writesErr.Load())

	// Full restart: every rule is still there, the same on every node.
	for _, id := range c.ids {
		c.stop(id)
	}
	for _, id := range c.ids {
		c.start(id)
	}
	c.waitFor("the restarted cluster has a leader and a full view", 60*time.Second, func() bool { return c.liveCount() == 3 })
	for i := 0; i < names; i++ {
		var err error
		for try := 0; try < 20; try++ {
			if _, err = c.get(h, 99, c.ids[i%3], ruleName(i)); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("final read of %s: %v", ruleName(i), err)
		}
	}
	var digests []string
	c.waitFor("identical replicas", 30*time.Second, func() bool {
		digests = digests[:0]
		for _, id := range c.ids {
			ai, dg, err := c.nodeStatus(id)
			if err != nil {
				return false
			}
			digests = append(digests, fmt.Sprintf("%d/%s", ai, dg))
		}
		return digests[0] == digests[1] && digests[1] == digests[2]
	})
	t.Logf("replicas after restart (applied index/digest): %v", digests)

	res, info := porcupine.CheckOperationsVerbose(ruleModel, h.ops, 60*time.Second)
	if res != porcupine.Ok {
		path := filepath.Join(t.TempDir(), "history.html")
		_ = porcupine.VisualizePath(ruleModel, info, path)
		t.Fatalf("rule history of %d operations is %v (visualization: %s)", len(h.ops), res, path)
	}
	t.Logf("rule history of %d operations is linearizable", len(h.ops))
	if writesOK.Load() < 50 {
		t.Fatalf("only %d acknowledged writes: the load did not run", writesOK.Load())
	}
}

// ownerOf is the owner of key in a wire view.
func ownerOf(v *pb.ClusterView, key string) string {
	var ms []cluster.Member
	for _, m := range v.GetMembers() {
		ms = append(ms, cluster.Member{ID: m.GetId()})
	}
	o, _ := cluster.NewView(v.GetEpoch(), ms).Owner(key)
	return o.ID
}
