package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokenserver/tokenserver/internal/raftfsm"
	"github.com/tokenserver/tokenserver/internal/rule"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// testNode is one node on a bufconn listener with a fake clock.
type testNode struct {
	node  *Node
	conn  *grpc.ClientConn
	token pb.TokenServiceClient
	admin pb.AdminServiceClient
	clock atomic.Int64
}

func newTestNode(t testing.TB, mutate func(*Config)) *testNode {
	t.Helper()
	return newTestNodeData(t, mutate, nil)
}

// newTestNodeWith is newTestNode whose data plane wrap makes from the
// node's Standalone (a view of more members, say).
func newTestNodeWith(t testing.TB, wrap func(*Standalone) DataPlane) *testNode {
	t.Helper()
	return newTestNodeData(t, nil, wrap)
}

func newTestNodeData(t testing.TB, mutate func(*Config), wrap func(*Standalone) DataPlane) *testNode {
	t.Helper()
	tn := &testNode{}
	tn.clock.Store(int64(100 * time.Second))
	cfg := DefaultConfig()
	cfg.HTTPAddr = ""
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg.Clock = tn.clock.Load
	if mutate != nil {
		mutate(&cfg)
	}
	deps := NewStandalone("node-1", "bufnet", inmem(t, cfg.MaxRules)).Deps()
	if wrap != nil {
		deps.Data = wrap(deps.Control.(*Standalone))
	}
	n, err := New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	lis := bufconn.Listen(1 << 20)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Serve(ctx, Listeners{GRPC: lis}) }()
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	tn.node, tn.conn = n, conn
	tn.token, tn.admin = pb.NewTokenServiceClient(conn), pb.NewAdminServiceClient(conn)
	return tn
}

func (tn *testNode) advance(d time.Duration) { tn.clock.Add(int64(d)) }

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func (tn *testNode) put(t testing.TB, r *pb.Rule) *pb.Rule {
	t.Helper()
	resp, err := tn.admin.PutRule(ctx(t), &pb.PutRuleRequest{Rule: r})
	if err != nil {
		t.Fatalf("PutRule(%s): %v", r.GetName(), err)
	}
	return resp.GetRule()
}

func tokenBucket(name string, limit int64) *pb.Rule {
	return &pb.Rule{Name: name, Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: limit, Period: durationpb.New(time.Second)}
}

func p(n int64) *int64 { return &n }

func wantCode(t *testing.T, err error, code codes.Code, msg string) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("error %v, want code %v", err, code)
	}
	if msg != "" && !strings.Contains(status.Convert(err).Message(), msg) {
		t.Fatalf("error %q does not contain %q", status.Convert(err).Message(), msg)
	}
}

func TestAcquireRefillAndDeny(t *testing.T) {
	tn := newTestNode(t, nil)
	stored := tn.put(t, tokenBucket("api", 3))
	var grant string
	for i := 0; i < 3; i++ {
		resp, err := tn.token.AcquireToken(ctx(t), &pb.AcquireTokenRequest{Rule: "api", Key: "alice"})
		if err != nil || !resp.GetAllowed() || resp.GetGranted() != 1 || resp.GetGrantId() == "" {
			t.Fatalf("acquire %d: %v %v", i, resp, err)
		}
		if resp.GetRuleVersion() != stored.GetVersion() || resp.GetEpoch() == 0 {
			t.Fatalf("acquire %d: version %d epoch %d", i, resp.GetRuleVersion(), resp.GetEpoch())
		}
		grant = resp.GetGrantId()
	}
	resp, err := tn.token.AcquireToken(ctx(t), &pb.AcquireTokenRequest{Rule: "api", Key: "alice"})
	if err != nil || resp.GetAllowed() || resp.GetRetryAfterNs() <= 0 || resp.GetGrantId() != "" {
		t.Fatalf("fourth acquire: %v %v, want a denial with retry-after", resp, err)
	}
	ref, err := tn.token.RefillToken(ctx(t), &pb.RefillTokenRequest{Rule: "api", Key: "alice", GrantId: grant})
	if err != nil || ref.GetRefilled() != 1 || ref.GetRemaining() != 1 {
		t.Fatalf("refill: %v %v", ref, err)
	}
	ref, err = tn.token.RefillToken(ctx(t), &pb.RefillTokenRequest{Rule: "api", Key: "alice", GrantId: grant})
	if err != nil || ref.GetRefilled() != 0 {
		t.Fatalf("retried refill: %v %v, want 0 refilled", ref, err)
	}
	tn.advance(time.Second)
	resp, err = tn.token.AcquireToken(ctx(t), &pb.AcquireTokenRequest{Rule: "api", Key: "alice", Permits: p(3)})
	if err != nil || !resp.GetAllowed() {
		t.Fatalf("after a second: %v %v", resp, err)
	}
}

func TestBadInput(t *testing.T) {
	tn := newTestNode(t, nil)
	tn.put(t, tokenBucket("api", 3))
	long := strings.Repeat("k", 257)
	for _, tt := range []struct {
		name string
		req  *pb.AcquireTokenRequest
		code codes.Code
		msg  string
	}{
		{"empty rule", &pb.AcquireTokenRequest{Key: "k"}, codes.InvalidArgument, "rule name is empty"},
		{"empty key", &pb.AcquireTokenRequest{Rule: "api"}, codes.InvalidArgument, "key is empty"},
		{"long key", &pb.AcquireTokenRequest{Rule: "api", Key: long}, codes.InvalidArgument, "257 bytes"},
		{"negative permits", &pb.AcquireTokenRequest{Rule: "api", Key: "k", Permits: p(-1)}, codes.InvalidArgument, "permits must be >= 0"},
		{"above capacity", &pb.AcquireTokenRequest{Rule: "api", Key: "k", Permits: p(4)}, codes.InvalidArgument, "could never be granted"},
		{"max wait above period", &pb.AcquireTokenRequest{Rule: "api", Key: "k", MaxWaitNs: int64(2 * time.Second)}, codes.InvalidArgument, "max_wait"},
		{"unknown rule", &pb.AcquireTokenRequest{Rule: "nope", Key: "k"}, codes.NotFound, `"nope"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tn.token.AcquireToken(ctx(t), tt.req)
			wantCode(t, err, tt.code, tt.msg)
		})
	}
	if tn.node.Buckets().Live() != 0 {
		t.Fatalf("bad input created %d buckets", tn.node.Buckets().Live())
	}
	_, err := tn.token.AcquireTokens(ctx(t), &pb.AcquireTokensRequest{Requests: make([]*pb.AcquireTokenRequest, MaxBatch+1)})
	wantCode(t, err, codes.InvalidArgument, "above the limit of 1000")
	_, err = tn.token.RefillToken(ctx(t), &pb.RefillTokenRequest{Rule: "api", Key: "k", GrantId: "garbage"})
	wantCode(t, err, codes.InvalidArgument, "grant_id")
	_, err = tn.admin.PutRule(ctx(t), &pb.PutRuleRequest{Rule: &pb.Rule{Name: "x", Algorithm: 99, Limit: 1, Period: durationpb.New(time.Second)}})
	wantCode(t, err, codes.InvalidArgument, "unknown algorithm")
	_, err = tn.admin.PutRule(ctx(t), &pb.PutRuleRequest{Rule: &pb.Rule{Name: "x", Algorithm: pb.Algorithm_SLIDING_WINDOW, Limit: 1, SampleCount: 7, Period: durationpb.New(time.Second)}})
	wantCode(t, err, codes.InvalidArgument, "sample_count 7 must divide")
	_, err = tn.admin.PutRule(ctx(t), &pb.PutRuleRequest{})
	wantCode(t, err, codes.InvalidArgument, "rule is missing")
	list, err := tn.admin.ListRules(ctx(t), &pb.ListRulesRequest{})
	if err != nil || len(list.GetRules()) != 1 {
		t.Fatalf("bad rules changed state: %v %v", list, err)
	}
}

func TestAcquireTokensBatch(t *testing.T) {
	tn := newTestNode(t, nil)
	tn.put(t, tokenBucket("api", 2))
	req := &pb.AcquireTokensRequest{Requests: []*pb.AcquireTokenRequest{
		{Rule: "api", Key: "a"},
		{Rule: "nope", Key: "a"},
		{Rule: "api", Key: "a"},
		{Rule: "api", Key: "a", Permits: p(-5)},
		{Rule: "api", Key: "a"},
		{Rule: "api", Key: "b", Permits: p(2)},
	}}
	resp, err := tn.token.AcquireTokens(ctx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	res := resp.GetResults()
	if len(res) != len(req.Requests) {
		t.Fatalf("%d results for %d requests", len(res), len(req.Requests))
	}
	wantCodes := []codes.Code{codes.OK, codes.NotFound, codes.OK, codes.InvalidArgument, codes.OK, codes.OK}
	wantAllowed := []bool{true, false, true, false, false, true}
	ids := map[string]bool{}
	for i, r := range res {
		if codes.Code(r.GetStatus().GetCode()) != wantCodes[i] {
			t.Errorf("item %d: status %v, want %v", i, r.GetStatus(), wantCodes[i])
		}
		if r.GetResponse().GetAllowed() != wantAllowed[i] {
			t.Errorf("item %d: allowed %v, want %v", i, r.GetResponse().GetAllowed(), wantAllowed[i])
		}
		if id := r.GetResponse().GetGrantId(); id != "" {
			if ids[id] {
				t.Errorf("item %d: grant id %q repeated", i, id)
			}
			ids[id] = true
			ref, err := tn.token.RefillToken(ctx(t), &pb.RefillTokenRequest{Rule: "api", Key: req.Requests[i].Key, GrantId: id})
			if err != nil || ref.GetRefilled() != r.GetResponse().GetGranted() {
				t.Errorf("item %d: refill of its grant: %v %v", i, ref, err)
			}
		}
	}
	if len(ids) != 3 {
		t.Fatalf("%d grant ids, want 3", len(ids))
	}
}

func TestResourceExhausted(t *testing.T) {
	tn := newTestNode(t, func(c *Config) { c.MaxBuckets = 2 })
	tn.put(t, tokenBucket("api", 5))
	for _, k := range []string{"a", "b"} {
		if _, err := tn.token.AcquireToken(ctx(t), &pb.AcquireTokenRequest{Rule: "api", Key: k}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := tn.token.AcquireToken(ctx(t), &pb.AcquireTokenRequest{Rule: "api", Key: "c"})
	wantCode(t, err, codes.ResourceExhausted, "cap")
	var qf *errdetails.QuotaFailure
	for _, d := range status.Convert(err).Details() {
		if q, ok := d.(*errdetails.QuotaFailure); ok {
			qf = q
		}
	}
	if qf == nil || qf.GetViolations()[0].GetSubject() != "node" {
		t.Fatalf("no QuotaFailure detail in %v", status.Convert(err).Details())
	}
}

func TestAdminRules(t *testing.T) {
	tn := newTestNode(t, nil)
	r := tn.put(t, tokenBucket("api", 3))
	v := r.GetVersion()
	_, err := tn.admin.PutRule(ctx(t), &pb.PutRuleRequest{Rule: tokenBucket("api", 4), ExpectedVersion: proto.Uint64(v + 7)})
	wantCode(t, err, codes.FailedPrecondition, "not the expected")
	up, err := tn.admin.PutRule(ctx(t), &pb.PutRuleRequest{Rule: tokenBucket("api", 4), ExpectedVersion: proto.Uint64(v)})
	if err != nil || up.GetRule().GetLimit() != 4 || up.GetRule().GetVersion() <= v {
		t.Fatalf("compare-and-set put: %v %v", up, err)
	}
	for _, local := range []bool{false, true} {
		got, err := tn.admin.GetRule(ctx(t), &pb.GetRuleRequest{Name: "api", Local: local})
		if err != nil || got.GetLimit() != 4 {
			t.Fatalf("get (local=%v): %v %v", local, got, err)
		}
	}
	_, err = tn.admin.GetRule(ctx(t), &pb.GetRuleRequest{Name: "nope"})
	wantCode(t, err, codes.NotFound, "")
	if _, err := tn.admin.DeleteRule(ctx(t), &pb.DeleteRuleRequest{Name: "api"}); err != nil {
		t.Fatal(err)
	}
	_, err = tn.admin.DeleteRule(ctx(t), &pb.DeleteRuleRequest{Name: "api"})
	wantCode(t, err, codes.NotFound, "")
}

func TestClusterViewAndWatch(t *testing.T) {
	tn := newTestNode(t, nil)
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := tn.token.WatchClusterView(c, &pb.GetClusterViewRequest{})
	if err != nil {
		t.Fatal(err)
	}
	v, err := stream.Recv()
	if err != nil || len(v.GetMembers()) != 1 || v.GetLeader() == "" || len(v.GetRules()) != 0 {
		t.Fatalf("first view: %v %v", v, err)
	}
	r := tokenBucket("api", 3)
	r.Fallback = &pb.Fallback{Policy: pb.FallbackPolicy_LOCAL, Limit: 1}
	tn.put(t, r)
	v, err = stream.Recv()
	if err != nil || len(v.GetRules()) != 1 || v.GetRules()[0].GetFallback().GetPolicy() != pb.FallbackPolicy_LOCAL {
		t.Fatalf("view after a rule put: %v %v", v, err)
	}
	got, err := tn.token.GetClusterView(ctx(t), &pb.GetClusterViewRequest{})
	if err != nil || !proto.Equal(got, v) {
		t.Fatalf("GetClusterView %v differs from the watched view %v (%v)", got, v, err)
	}
}

func TestHealthAndReflection(t *testing.T) {
	tn := newTestNode(t, nil)
	h, err := healthpb.NewHealthClient(tn.conn).Check(ctx(t), &healthpb.HealthCheckRequest{Service: "tokenserver.v1.TokenService"})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", h, err)
	}
	rc, err := reflectionpb.NewServerReflectionClient(tn.conn).ServerReflectionInfo(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := rc.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := rc.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range resp.GetListServicesResponse().GetService() {
		names = append(names, s.GetName())
	}
	if !strings.Contains(strings.Join(names, ","), "tokenserver.v1.TokenService") {
		t.Fatalf("reflection lists %v", names)
	}
}

func TestDefaultDeadline(t *testing.T) {
	var seen atomic.Bool
	n, err := New(Config{GRPCAddr: "127.0.0.1:0", MaxRecvMsgSize: 1 << 20, DefaultDeadline: time.Second, SweepInterval: time.Second}, NewStandalone("n", "a", inmem(t, 0)).Deps())
	if err != nil {
		t.Fatal(err)
	}
	_, err = n.unary(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/x/y"}, func(ctx context.Context, _ any) (any, error) {
		dl, ok := ctx.Deadline()
		seen.Store(ok && time.Until(dl) <= time.Second)
		return nil, nil
	})
	if err != nil || !seen.Load() {
		t.Fatal("a call without a deadline did not get the default one")
	}
}

func TestHTTPHealth(t *testing.T) {
	n, err := New(DefaultConfig(), NewStandalone("node-1", "127.0.0.1:7070", inmem(t, 0)).Deps())
	if err != nil {
		t.Fatal(err)
	}
	h := n.httpHandler()
	get := func(path string) int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		return rec.Code
	}
	if got := get("/healthz"); got != http.StatusOK {
		t.Fatalf("/healthz before serving: %d", got)
	}
	if got := get("/readyz"); got != http.StatusServiceUnavailable {
		t.Fatalf("/readyz before serving: %d, want 503", got)
	}
	n.serving.Store(true)
	n.updateHealth()
	if got := get("/readyz"); got != http.StatusOK {
		t.Fatalf("/readyz while serving: %d", got)
	}
}

func TestToStatusMapsEveryError(t *testing.T) {
	for _, tt := range []struct {
		err  error
		code codes.Code
	}{
		{rule.Invalid("x"), codes.InvalidArgument},
		{fmt.Errorf("get: %w", rule.ErrNotFound), codes.NotFound},
		{rule.ErrVersionMismatch, codes.FailedPrecondition},
		{rule.ErrNoLeader, codes.Unavailable},
		{context.DeadlineExceeded, codes.DeadlineExceeded},
		{errors.New("boom"), codes.Internal},
		{failf(ErrBadRequest, "grant_id is empty"), codes.InvalidArgument},
		{failf(ErrNotReady, "no view"), codes.Unavailable},
		{failf(ErrUnavailable, "stopping"), codes.Unavailable},
		{failf(ErrStreamCap, "cap"), codes.ResourceExhausted},
		{failf(ErrNoRaft, "no raft"), codes.FailedPrecondition},
		{failf(ErrWrongNode, "not you"), codes.PermissionDenied},
		{failf(ErrInternal, "bug"), codes.Internal},
	} {
		if got := toStatus(tt.err).Code(); got != tt.code {
			t.Errorf("toStatus(%v) = %v, want %v", tt.err, got, tt.code)
		}
		if f := (*failure)(nil); errors.As(tt.err, &f) && toStatus(tt.err).Message() != f.msg {
			t.Errorf("toStatus(%v) message %q, want the failure's own", tt.err, toStatus(tt.err).Message())
		}
	}
}

func TestMetrics(t *testing.T) {
	tn := newTestNode(t, nil)
	tn.put(t, tokenBucket("api", 2))
	for i := 0; i < 3; i++ {
		tn.token.AcquireToken(ctx(t), &pb.AcquireTokenRequest{Rule: "api", Key: "k"})
	}
	tn.token.AcquireToken(ctx(t), &pb.AcquireTokenRequest{Rule: "nope", Key: "k"})
	tn.token.AcquireTokens(ctx(t), &pb.AcquireTokensRequest{Requests: []*pb.AcquireTokenRequest{{Rule: "api", Key: "j"}}})
	rec := httptest.NewRecorder()
	tn.node.httpHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body := rec.Body.String()
	for _, want := range []string{
		`tokenserver_decisions_total{result="allowed",rule="api"} 3`,
		`tokenserver_decisions_total{result="denied",rule="api"} 1`,
		`tokenserver_buckets 2`,
		`tokenserver_rule_keys{rule="api"} 2`,
		`tokenserver_errors_total{code="NotFound"} 1`,
		`tokenserver_batch_size_count 1`,
		`tokenserver_decision_duration_seconds_count{method="AcquireToken"} 4`,
		`tokenserver_raft_leader 1`,
		`tokenserver_ready 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	if strings.Contains(body, `"k"`) || strings.Contains(body, `"j"`) {
		t.Error("a key appears as a label value")
	}
}

// inmem opens a one-node in-memory Raft node for a test's rules (the same
// FSM and rule.Set as production) and closes it when the test ends.
func inmem(t testing.TB, maxRules int) *raftfsm.Node {
	t.Helper()
	rn, err := raftfsm.NewInmem("node-1", maxRules)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rn.Close() })
	return rn
}
