package server

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/tokenserver/tokenserver/internal/auth"
	"github.com/tokenserver/tokenserver/internal/cluster"
	"github.com/tokenserver/tokenserver/internal/rule"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// TestConnectionCapsPerIPAndTotal: past the per-IP or the total cap, a new
// connection is closed at accept and counted; closing one makes room.
func TestConnectionCapsPerIPAndTotal(t *testing.T) {
	for _, tc := range []struct {
		name         string
		total, perIP int
	}{{"per IP", 10, 2}, {"total", 2, 10}} {
		t.Run(tc.name, func(t *testing.T) {
			raw, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			var refused atomic.Int64
			l := newLimitListener(raw, tc.total, tc.perIP, &refused, nil)
			defer l.Close()
			accepted := make(chan net.Conn, 10)
			go func() {
				defer close(accepted)
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					accepted <- c
				}
			}()
			dial := func() net.Conn {
				t.Helper()
				c, err := net.Dial("tcp", raw.Addr().String())
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				return c
			}
			closedByServer := func(c net.Conn) bool {
				c.SetReadDeadline(time.Now().Add(5 * time.Second))
				_, err := c.Read(make([]byte, 1))
				return err != nil && !os.IsTimeout(err)
			}
			dial()
			dial()
			a1 := <-accepted
			<-accepted
			if !closedByServer(dial()) {
				t.Fatal("a third connection was not closed")
			}
			if refused.Load() != 1 {
				t.Fatalf("refused %d, want 1", refused.Load())
			}
			a1.Close()
			dial()
			select {
			case <-accepted:
			case <-time.After(5 * time.Second):
				t.Fatal("no room after a close")
			}
		})
	}
}

// TestAvoidHeaderBounded: an avoid header of 8 MB of commas and ids is
// read only up to MaxAvoid ids, without splitting it (allocations do not
// grow with its size).
func TestAvoidHeaderBounded(t *testing.T) {
	tn := newTestNode(t, nil)
	v := cluster.NewView(1, []cluster.Member{{ID: "node-1"}, {ID: "b"}})
	huge := strings.Repeat(",", 8<<20) + strings.Repeat("x,", 1000)
	ids := strings.Repeat("a,", 10000)
	for _, tc := range []struct {
		name, header string
		max          int
	}{{"commas", huge, MaxAvoid}, {"ids", ids, 1}, {"few", "b, c", 2}} {
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(AvoidHeader, tc.header))
		var got map[string]bool
		allocs := testing.AllocsPerRun(3, func() { got = tn.node.avoided(ctx, v) })
		if len(got) > tc.max {
			t.Errorf("%s: %d ids honored, at most %d", tc.name, len(got), tc.max)
		}
		if allocs > 20 {
			t.Errorf("%s: %v allocations", tc.name, allocs)
		}
	}
	// The transport refuses a header block past MaxHeaderListSize.
	big := metadata.AppendToOutgoingContext(ctx(t), AvoidHeader, strings.Repeat(",", 64<<10))
	_, err := tn.token.GetClusterView(big, &pb.GetClusterViewRequest{})
	if err == nil {
		t.Fatal("a 64 KiB header was accepted")
	}
}

// TestHealthWatchCapped: at most MaxHealthWatches Watch streams; one more
// is ResourceExhausted, and Check, what probes use, still answers.
func TestHealthWatchCapped(t *testing.T) {
	tn := newTestNode(t, func(c *Config) { c.MaxHealthWatches = 2 })
	hc := healthpb.NewHealthClient(tn.conn)
	for range 2 {
		w, err := hc.Watch(ctx(t), &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	w, err := hc.Watch(ctx(t), &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = w.Recv()
	}
	wantCode(t, err, codes.ResourceExhausted, "health Watch")
	if _, err := hc.Check(ctx(t), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("Check: %v", err)
	}
}

// TestBearerTokenBounded: an authorization header longer than
// MaxAuthorizationBytes is Unauthenticated before it is looked up, and
// counted as an auth failure.
func TestBearerTokenBounded(t *testing.T) {
	tok, line, err := auth.NewToken("c", auth.RoleClient)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(file, []byte(line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	az, err := auth.New(auth.Options{TokenFile: file})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(az.Close)
	tn := newTestNode(t, func(c *Config) { c.Security.Auth = az })
	call := func(token string) error {
		c := metadata.AppendToOutgoingContext(ctx(t), "authorization", "Bearer "+token)
		_, err := tn.token.GetClusterView(c, &pb.GetClusterViewRequest{})
		return err
	}
	if err := call(tok); err != nil {
		t.Fatalf("a good token: %v", err)
	}
	wantCode(t, call(strings.Repeat("A", 2*MaxAuthorizationBytes)), codes.Unauthenticated, "at most 1024")
	wantCode(t, call("short"), codes.Unauthenticated, "")
	if got := testutil.ToFloat64(tn.node.metrics.authFailures.WithLabelValues("Unauthenticated")); got != 2 {
		t.Fatalf("auth failures %v, want 2", got)
	}
}

// TestMetricsTimeDecisionsAndAdmin: decision_duration_seconds times the
// deciding calls only; admin calls are counted by method and code.
func TestMetricsTimeDecisionsAndAdmin(t *testing.T) {
	tn := newTestNode(t, nil)
	tn.put(t, tokenBucket("r", 5))
	if _, err := tn.token.GetClusterView(ctx(t), &pb.GetClusterViewRequest{}); err != nil {
		t.Fatal(err)
	}
	if _, err := tn.token.AcquireToken(ctx(t), &pb.AcquireTokenRequest{Rule: "r", Key: "k"}); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(tn.node.metrics.latency); n != len(decisionMethods) {
		t.Fatalf("%d decision_duration series, want %d", n, len(decisionMethods))
	}
	if _, timed := tn.node.metrics.methods[pb.TokenService_GetClusterView_FullMethodName]; timed {
		t.Fatal("GetClusterView is timed as a decision")
	}
	if got := testutil.ToFloat64(tn.node.metrics.adminCalls.WithLabelValues("PutRule", "OK")); got != 1 {
		t.Fatalf("admin PutRule OK = %v", got)
	}
}

// TestMalformedProtobufInvalidArgument: a request that is no valid
// protobuf is InvalidArgument, not INTERNAL, and the node serves on.
func TestMalformedProtobufInvalidArgument(t *testing.T) {
	tn := newTestNode(t, nil)
	for _, body := range [][]byte{{0xff, 0xff, 0xff}, {0x0a, 0x7f, 'a'}} {
		err := tn.conn.Invoke(ctx(t), pb.TokenService_AcquireToken_FullMethodName, &pb.AcquireTokenRequest{}, new(pb.AcquireTokenResponse), grpc.ForceCodecV2(rawCodec{body}))
		wantCode(t, err, codes.InvalidArgument, "not a valid tokenserver.v1.AcquireTokenRequest")
	}
	if _, err := tn.token.GetClusterView(ctx(t), &pb.GetClusterViewRequest{}); err != nil {
		t.Fatal(err)
	}
}

// TestJoinClusterBadAddressInvalidArgument: JoinCluster with an address
// that is not host:port is InvalidArgument naming the field.
func TestJoinClusterBadAddressInvalidArgument(t *testing.T) {
	tn := newTestNode(t, nil)
	for _, tc := range []struct{ raft, grpc, field string }{
		{"not an address", "127.0.0.1:1", "raft_addr"},
		{"127.0.0.1:99999", "127.0.0.1:1", "raft_addr"},
		{"127.0.0.1:1", "nohost", "grpc_addr"},
	} {
		_, err := tn.admin.JoinCluster(ctx(t), &pb.JoinClusterRequest{Id: "n2", RaftAddr: tc.raft, GrpcAddr: tc.grpc})
		wantCode(t, err, codes.InvalidArgument, tc.field)
	}
}

// TestMembershipErrorsNameTheMember: removing or draining a member the
// cluster lacks says so, not "rule not found".
func TestMembershipErrorsNameTheMember(t *testing.T) {
	err := toError(memberError("ghost", fmt.Errorf("member %q: %w", "ghost", rule.ErrNotFound)))
	wantCode(t, err, codes.NotFound, `member "ghost" is not in the cluster`)
	if strings.Contains(err.Error(), "rule") {
		t.Fatalf("%v speaks of a rule", err)
	}
}

// TestAllowedDecisionHasNoLimitReason: a plain allow carries no reason; a
// denial by the limit says LIMIT.
func TestAllowedDecisionHasNoLimitReason(t *testing.T) {
	tn := newTestNode(t, nil)
	tn.put(t, tokenBucket("r", 1))
	for _, want := range []struct {
		allowed bool
		reason  pb.Reason
	}{{true, pb.Reason_REASON_UNSPECIFIED}, {false, pb.Reason_LIMIT}} {
		resp, err := tn.token.AcquireToken(ctx(t), &pb.AcquireTokenRequest{Rule: "r", Key: "k"})
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetAllowed() != want.allowed || resp.GetReason() != want.reason {
			t.Fatalf("allowed %v reason %v, want %v %v", resp.GetAllowed(), resp.GetReason(), want.allowed, want.reason)
		}
	}
}

// TestViewStreamsCappedPerPrincipal: one caller holds at most
// MaxViewStreamsPerPrincipal WatchClusterView streams; one more is
// ResourceExhausted naming the cap per caller, and a freed slot is reused.
func TestViewStreamsCappedPerPrincipal(t *testing.T) {
	tn := newTestNode(t, func(c *Config) { c.MaxViewStreamsPerPrincipal = 2 })
	open := func() (pb.TokenService_WatchClusterViewClient, context.CancelFunc, error) {
		c, cancel := context.WithCancel(ctx(t))
		w, err := tn.token.WatchClusterView(c, &pb.GetClusterViewRequest{})
		if err == nil {
			_, err = w.Recv()
		}
		return w, cancel, err
	}
	_, cancel1, err := open()
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := open(); err != nil {
		t.Fatal(err)
	}
	_, _, err = open()
	wantCode(t, err, codes.ResourceExhausted, "the cap per caller")
	cancel1()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, _, err = open(); err == nil || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatalf("a freed slot is not reused: %v", err)
	}
}

// TestViewSentOnlyWhenChanged: a stream that asks for heartbeats gets the
// whole view, then small heartbeats (no members, no rules) while nothing
// changes, and the whole view again after a change.
func TestViewSentOnlyWhenChanged(t *testing.T) {
	tn := newTestNode(t, nil)
	tn.put(t, tokenBucket("a", 1))
	c := metadata.AppendToOutgoingContext(ctx(t), ViewHeartbeatHeader, "1")
	w, err := tn.token.WatchClusterView(c, &pb.GetClusterViewRequest{})
	if err != nil {
		t.Fatal(err)
	}
	first, err := w.Recv()
	if err != nil || len(first.GetRules()) != 1 {
		t.Fatalf("first message: %v rules, %v", len(first.GetRules()), err)
	}
	beat, err := w.Recv() // after ViewHeartbeat
	if err != nil {
		t.Fatal(err)
	}
	if len(beat.GetRules()) != 0 || len(beat.GetMembers()) != 0 || beat.GetEpoch() != first.GetEpoch() || beat.GetAnsweredBy() != first.GetAnsweredBy() {
		t.Fatalf("heartbeat %v, want the epoch and no rules or members", beat)
	}
	tn.put(t, tokenBucket("b", 1))
	for {
		v, err := w.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if len(v.GetRules()) == 2 {
			break
		}
		if len(v.GetRules()) != 0 {
			t.Fatalf("a view of %d rules after the change", len(v.GetRules()))
		}
	}
	// Without the header every message is the whole view.
	w2, err := tn.token.WatchClusterView(ctx(t), &pb.GetClusterViewRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if v, err := w2.Recv(); err != nil || len(v.GetRules()) != 2 {
			t.Fatalf("%v rules, %v", len(v.GetRules()), err)
		}
	}
}

// tempErr is an accept error that says it is temporary (EMFILE's kind).
type tempErr struct{}

func (tempErr) Error() string   { return "accept: too many open files" }
func (tempErr) Temporary() bool { return true }
func (tempErr) Timeout() bool   { return false }

// flakyListener fails its first n accepts with a temporary error.
type flakyListener struct {
	net.Listener
	fails atomic.Int64
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.fails.Add(-1) >= 0 {
		return nil, tempErr{}
	}
	return l.Listener.Accept()
}

// TestAcceptRetriesTemporaryErrors: out of file descriptors, the gRPC and
// HTTP listeners retry with backoff and report each failure, instead of
// returning (which ends the server for good).
func TestAcceptRetriesTemporaryErrors(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fl := &flakyListener{Listener: raw}
	fl.fails.Store(3)
	var refused atomic.Int64
	var reported []time.Duration
	l := newLimitListener(fl, 10, 10, &refused, func(_ error, d time.Duration) { reported = append(reported, d) })
	defer l.Close()
	go func() {
		if c, err := net.Dial("tcp", raw.Addr().String()); err == nil {
			defer c.Close()
			time.Sleep(time.Second)
		}
	}()
	c, err := l.Accept()
	if err != nil {
		t.Fatalf("Accept returned %v", err)
	}
	c.Close()
	if len(reported) != 3 || reported[0] <= 0 || reported[2] <= reported[0] {
		t.Fatalf("temporary errors reported with delays %v, want 3 growing", reported)
	}
}
