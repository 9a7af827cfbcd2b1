//go:build multiprocess

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// TestIssue20Item23_RemoveTheLeader removes the leader with tokenctl: the
// command succeeds at once, the removed node reports not ready and refuses
// the data plane (FailedPrecondition), and the
// node restarted on its old data dir says it was removed and exits
// non-zero.
func TestIssue20Item23_RemoveTheLeader(t *testing.T) {
	c := newProcCluster(t, 3)
	l := c.leader("")
	if l == "" {
		t.Fatal("no leader")
	}
	pctx, pcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer pcancel()
	if _, err := c.admin(l).PutRule(pctx, &pb.PutRuleRequest{Rule: rulePB("r", 100)}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	out, errs, code := ctl(t, c.grpc[l], "cluster", "remove", l, "--timeout", "20s")
	took := time.Since(start)
	if code != 0 {
		t.Fatalf("cluster remove %s: exit %d\n%s\n%s", l, code, out, errs)
	}
	if took > 5*time.Second {
		t.Errorf("cluster remove of the leader took %v", took)
	}
	p := c.procs[l]
	c.waitFor("the removed node reports not ready", 10*time.Second, func() bool {
		resp, err := http.Get("http://" + p.httpAddr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode != http.StatusOK
	})
	// It decides nothing from its stale view: every key is refused, at
	// once, saying why.
	for i := range 20 {
		actx, acancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := c.token(l).AcquireToken(actx, &pb.AcquireTokenRequest{Rule: "r", Key: fmt.Sprint("k", i)})
		acancel()
		if st := status.Convert(err); st.Code() != codes.FailedPrecondition || !strings.HasPrefix(st.Message(), "this node was removed from the cluster; ") {
			t.Fatalf("acquire on the removed node: %v, want FailedPrecondition saying it was removed", err)
		}
	}
	c.waitFor("a view of the two others", 20*time.Second, func() bool {
		other := c.leader(l)
		if other == "" {
			return false
		}
		st, err := c.status(other)
		return err == nil && len(st.GetMembers()) == 2
	})
	c.kill(l)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin(t, "tokenserver"), c.args[l]...)
	b, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() == 0 {
		t.Fatalf("restart of the removed node: %v, want a non-zero exit\n%s", err, b)
	}
	if !strings.Contains(string(b), "this node was removed; start with a fresh --data-dir and --join") {
		t.Fatalf("restart of the removed node does not say why:\n%s", b)
	}
}
