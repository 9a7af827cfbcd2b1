//go:build multiprocess

package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/testcluster"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// TestClusterDrainNotReady: a member drained by `cluster drain`
// (DrainMember on the leader) answers /readyz 503 with the reason, and
// stays so past --up-after.
func TestClusterDrainNotReady(t *testing.T) {
	t.Parallel() // mostly waiting: runs beside the other waiting tests (Makefile: -parallel 4)
	for _, drainLeader := range []bool{false, true} {
		drainTrial(t, drainLeader)
	}
}

func drainTrial(t *testing.T, drainLeader bool) {
	c := newProcCluster(t, 3)
	leader := c.leader("")
	target := c.ids[0]
	if drainLeader {
		target = leader
	} else if target == leader {
		target = c.ids[1]
	}
	if _, err := c.admin(leader).DrainMember(withTimeout(t, 10*time.Second), &pb.DrainMemberRequest{Id: target}); err != nil {
		t.Fatal(err)
	}
	http := c.procs[target].httpAddr
	c.waitFor("the drained member's /readyz to fail", 10*time.Second, func() bool { return !readyz(http) })
	deadline := time.Now().Add(4 * time.Second) // --up-after is 3s
	for time.Now().Before(deadline) {
		if readyz(http) {
			t.Fatalf("the drained member's /readyz answers ready again (leader: %v)", drainLeader)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestNoTLSNoCertificatesLog: a node without TLS does not log that
// certificates were loaded; a node with TLS does.
func TestNoTLSNoCertificatesLog(t *testing.T) {
	plain, _ := single(t)
	pki := testcluster.NewPKI(t, "n0")
	cert, key := pki.NodeFiles("n0")
	tlsNode, _ := single(t, "--tls-cert", cert, "--tls-key", key)
	plain.stop(t)
	tlsNode.stop(t)
	if strings.Contains(plain.logs.String(), "certificates loaded") {
		t.Fatal("a node without TLS logs that certificates were loaded")
	}
	if !strings.Contains(tlsNode.logs.String(), "certificates loaded") {
		t.Fatal("a node with TLS does not log its certificates")
	}
}

// TestIssue20Item16_SIGTERMWithAFrozenPeer: a node whose peer is frozen
// (SIGSTOP: its sockets stay open and are never read, as behind a long
// partition) exits within --shutdown-grace of SIGTERM, although Raft
// replication and forwarded calls to that peer are blocked in writes.
func TestIssue20Item16_SIGTERMWithAFrozenPeer(t *testing.T) {
	const grace = 3 * time.Second
	c := newProcCluster(t, 3, "--shutdown-grace", grace.String())
	l := c.leader("")
	if l == "" {
		t.Fatal("no leader")
	}
	var frozen string
	for _, id := range c.ids {
		if id != l {
			frozen = id
			break
		}
	}
	p := c.procs[frozen]
	if err := p.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.cmd.Process.Signal(syscall.SIGCONT) })

	// Fill the leader's sockets to the frozen node: large rule writes
	// (replicated to it by Raft, committed by the third node) and
	// forwarded calls for keys it owns.
	deny := make([]string, 2000)
	for i := range deny {
		deny[i] = fmt.Sprintf("%0120d", i)
	}
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := range 16 {
		wg.Go(func() {
			r := rulePB(fmt.Sprint("big", i), 10)
			r.Deny = deny
			_, _ = c.admin(l).PutRule(ctx, &pb.PutRuleRequest{Rule: r})
		})
	}
	for i := range 32 {
		wg.Go(func() {
			req := &pb.AcquireTokensRequest{}
			for j := range 500 {
				req.Requests = append(req.Requests, &pb.AcquireTokenRequest{Rule: "big0", Key: fmt.Sprintf("%d-%d-%s", i, j, strings.Repeat("k", 200))})
			}
			cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
			defer ccancel()
			_, _ = c.token(l).AcquireTokens(cctx, req)
		})
	}
	wg.Wait()

	lp := c.procs[l]
	start := time.Now()
	if err := lp.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	const margin = 2 * time.Second // process start-up of the stop, log flushing
	select {
	case <-lp.exited:
		took := time.Since(start)
		t.Logf("exited %v after SIGTERM (grace %v)", took.Round(time.Millisecond), grace)
		for _, line := range strings.Split(lp.logs.String(), "\n") {
			if strings.Contains(line, "stopping") || strings.Contains(line, "abandoned") || strings.Contains(line, "blocked") || strings.Contains(line, "leadership") || strings.Contains(line, "routing view") {
				t.Logf("node log: %s", line)
			}
		}
		if took > grace+margin {
			t.Fatalf("exit took %v, grace %v", took, grace)
		}
	case <-time.After(grace + 30*time.Second):
		t.Fatalf("still running %v after SIGTERM with a frozen peer (grace %v)", grace+30*time.Second, grace)
	}
	c.procs[l] = nil
}
