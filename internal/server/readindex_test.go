package server

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"

	"github.com/tokenserver/tokenserver/internal/rule"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// laggingTable is a Standalone whose data plane reads a table that lags
// behind its control plane's, as a follower's does for a moment after a
// rule write.
type laggingTable struct {
	*Standalone
	cur atomic.Pointer[rule.Table]
}

func (l *laggingTable) Table() *rule.Table { return l.cur.Load() }

// catchUp publishes the control plane's table to the data plane.
func (l *laggingTable) catchUp() {
	old := l.cur.Swap(l.Standalone.Table())
	old.Supersede()
}

// TestNewRuleNotFoundChecksLeader: a node whose table lacks a rule the
// leader has waits for it instead of answering NotFound; a rule the leader
// lacks is NotFound.
func TestNewRuleNotFoundChecksLeader(t *testing.T) {
	var lt *laggingTable
	tn := newTestNodeWith(t, func(s *Standalone) DataPlane {
		lt = &laggingTable{Standalone: s}
		lt.cur.Store(rule.NewTable(0, nil, nil))
		return lt
	})
	tn.put(t, tokenBucket("fresh", 5))
	if lt.Table().Get("fresh") != nil {
		t.Fatal("the data plane's table is not behind")
	}
	go func() {
		time.Sleep(50 * time.Millisecond) // the apply reaches this node later
		lt.catchUp()
	}()
	resp, err := tn.token.AcquireToken(ctx(t), &pb.AcquireTokenRequest{Rule: "fresh", Key: "k"})
	if err != nil || !resp.GetAllowed() {
		t.Fatalf("a rule the leader has: %v, %v", resp, err)
	}
	_, err = tn.token.AcquireToken(ctx(t), &pb.AcquireTokenRequest{Rule: "never-written", Key: "k"})
	wantCode(t, err, codes.NotFound, "never-written")
	if got := testutilCount(tn); got != 2 {
		t.Fatalf("%v leader reads, want 2", got)
	}
}

func testutilCount(tn *testNode) float64 {
	return testutil.ToFloat64(tn.node.metrics.ruleConfirms)
}
