//go:build multiprocess

package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/testcluster"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// TestClusterDrainNotReady: a member drained by `cluster drain`
// (DrainMember on the leader) answers /readyz 503 with the reason, and
// stays so past --up-after.
func TestClusterDrainNotReady(t *testing.T) {
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
