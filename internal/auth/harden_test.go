package auth

// Regression tests of issue 20: token size, revocation that fails closed,
// node identity tied to membership, the certificate deny list.

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/tokenserver/tokenserver/internal/tlsutil"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// syncBuffer is a log sink safe for the watcher's goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func acquireCtx(tok string) context.Context {
	return withToken(context.Background(), "Bearer "+tok)
}

// TestBearerTokenTooLongNotHashed (item 4): a bearer token past
// MaxTokenBytes is Unauthenticated for its size, before it is looked up;
// one at the bound is looked up as usual.
func TestBearerTokenTooLongNotHashed(t *testing.T) {
	a := newAuth(t, Options{TokenFile: testTokenFile(t)})
	m := pb.TokenService_AcquireToken_FullMethodName
	_, err := a.Authorize(acquireCtx(strings.Repeat("x", 15<<20)), m)
	if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "longer than 4096 bytes") {
		t.Errorf("a 15 MB token: %v, want Unauthenticated for its size", err)
	}
	_, err = a.Authorize(acquireCtx(strings.Repeat("x", MaxTokenBytes)), m)
	if !errors.Is(err, errBadToken) {
		t.Errorf("a token of MaxTokenBytes: %v, want it looked up (%v)", err, errBadToken)
	}
}

// TestTokenFileTypoStillRevokes (item 8): an edit that removes a token and
// has a typo in another line revokes the removed token at once; only the
// bad line's token is not accepted, the bad line is logged with its
// number, the reload metric says not OK, and a return to the previous
// content loads it again.
func TestTokenFileTypoStillRevokes(t *testing.T) {
	dir := t.TempDir()
	var logs syncBuffer
	now := time.Unix(1_700_000_000, 0)
	name := writeTokens(t, dir, TokenLine("keep", "a", RoleClient), TokenLine("drop", "b", RoleClient), TokenLine("typo", "c", RoleClient))
	original, _ := os.ReadFile(name)
	a := newAuth(t, Options{TokenFile: name, Logger: slog.New(slog.NewTextHandler(&logs, nil)), Now: func() time.Time { return now }})
	reg := prometheus.NewRegistry()
	if err := a.RegisterMetrics(reg); err != nil {
		t.Fatal(err)
	}
	m := pb.TokenService_AcquireToken_FullMethodName
	now = now.Add(time.Minute)
	writeTokens(t, dir, TokenLine("keep", "a", RoleClient), strings.Replace(TokenLine("typo", "c", RoleClient), "client", "clinet", 1))
	if err := a.Reload(); err == nil || !strings.Contains(err.Error(), ":2:") {
		t.Fatalf("Reload = %v, want the bad line (2) reported", err)
	}
	if _, err := a.Authorize(acquireCtx("drop"), m); status.Code(err) != codes.Unauthenticated {
		t.Errorf("the removed token: %v, want Unauthenticated", err)
	}
	if _, err := a.Authorize(acquireCtx("typo"), m); status.Code(err) != codes.Unauthenticated {
		t.Errorf("the bad line's token: %v, want Unauthenticated", err)
	}
	if _, err := a.Authorize(acquireCtx("keep"), m); err != nil {
		t.Errorf("the kept token: %v", err)
	}
	if !strings.Contains(logs.String(), "tokens:2") || !strings.Contains(logs.String(), "unknown role") {
		t.Errorf("the bad line is not logged with its place and reason:\n%s", logs.String())
	}
	if got := testutil.ToFloat64(collectorOf(reg, "tokenserver_auth_tokens_reload_ok")); got != 0 {
		t.Errorf("reload_ok = %v after bad lines, want 0", got)
	}
	if err := os.WriteFile(name, original, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Authorize(acquireCtx("drop"), m); err != nil {
		t.Errorf("back to the original file: %v", err)
	}
	want := `
# HELP tokenserver_auth_tokens_last_reload_success_timestamp_seconds Unix time of the last successful look at the --auth-tokens file.
# TYPE tokenserver_auth_tokens_last_reload_success_timestamp_seconds gauge
tokenserver_auth_tokens_last_reload_success_timestamp_seconds 1.70000006e+09
# HELP tokenserver_auth_tokens_reload_ok 1 when the last look at the --auth-tokens file loaded it whole or found it unchanged; 0 after a failed read or a content with bad lines.
# TYPE tokenserver_auth_tokens_reload_ok gauge
tokenserver_auth_tokens_reload_ok 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

// collectorOf gathers one metric family of reg as a collector for
// testutil.ToFloat64.
func collectorOf(reg *prometheus.Registry, name string) prometheus.Collector {
	return prometheus.CollectorFunc(func(ch chan<- prometheus.Metric) {
		mfs, _ := reg.Gather()
		for _, mf := range mfs {
			if mf.GetName() == name {
				ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(name, "", nil, nil), prometheus.GaugeValue, mf.GetMetric()[0].GetGauge().GetValue())
			}
		}
	})
}

// TestTokenFileDeletedIsLoggedAndExported (item 8): a token file deleted
// after a good load is logged at warn and exported (reload_ok 0), and the
// tokens in use stay.
func TestTokenFileDeletedIsLoggedAndExported(t *testing.T) {
	dir := t.TempDir()
	var logs syncBuffer
	name := writeTokens(t, dir, TokenLine("tok", "a", RoleClient))
	a := newAuth(t, Options{TokenFile: name, ReloadInterval: time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	reg := prometheus.NewRegistry()
	if err := a.RegisterMetrics(reg); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(name); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(logs.String(), "token file reload failed") {
		if time.Now().After(deadline) {
			t.Fatalf("the deleted file was not logged:\n%s", logs.String())
		}
		time.Sleep(time.Millisecond)
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "no such file") {
		t.Errorf("log:\n%s", logs.String())
	}
	if got := testutil.ToFloat64(collectorOf(reg, "tokenserver_auth_tokens_reload_ok")); got != 0 {
		t.Errorf("reload_ok = %v with the file deleted, want 0", got)
	}
	if _, err := a.Authorize(acquireCtx("tok"), pb.TokenService_AcquireToken_FullMethodName); err != nil {
		t.Errorf("the tokens in use were dropped: %v", err)
	}
}

// blockingWatch is a TokenService whose WatchClusterView runs until its
// context ends.
type blockingWatch struct {
	pb.UnimplementedTokenServiceServer
	started chan struct{}
}

func (b blockingWatch) WatchClusterView(_ *pb.GetClusterViewRequest, ss pb.TokenService_WatchClusterViewServer) error {
	b.started <- struct{}{}
	<-ss.Context().Done()
	return status.FromContextError(ss.Context().Err()).Err()
}

// TestRevokedTokenEndsStream (item 8): a stream opened with a token ends,
// Unauthenticated, when a reload removes the token; another token's
// stream goes on.
func TestRevokedTokenEndsStream(t *testing.T) {
	dir := t.TempDir()
	name := writeTokens(t, dir, TokenLine("gone", "a", RoleClient), TokenLine("stays", "b", RoleClient))
	a := newAuth(t, Options{TokenFile: name})
	bw := blockingWatch{started: make(chan struct{}, 2)}
	srv := grpc.NewServer(grpc.StreamInterceptor(a.StreamInterceptor()))
	pb.RegisterTokenServiceServer(srv, bw)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	open := func(tok string) pb.TokenService_WatchClusterViewClient {
		c, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(BearerToken{Token: tok}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		s, err := pb.NewTokenServiceClient(c).WatchClusterView(ctx(t), &pb.GetClusterViewRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	gone, stays := open("gone"), open("stays")
	<-bw.started
	<-bw.started
	writeTokens(t, dir, TokenLine("stays", "b", RoleClient))
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, err := gone.Recv(); status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "revoked") {
		t.Errorf("the revoked token's stream: %v, want Unauthenticated (revoked)", err)
	}
	if n := a.LiveStreams(); n != 1 {
		t.Errorf("%d live streams, want 1 (the other token's)", n)
	}
	writeTokens(t, dir, TokenLine("stays", "b", RoleClient|RoleViewer))
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, err := stays.Recv(); status.Code(err) != codes.Unauthenticated {
		t.Errorf("a token whose roles changed: %v, want its stream ended", err)
	}
}

// peerChecker names the node of a certificate's tokenserver://node/ID.
type peerChecker struct{}

func (peerChecker) PeerID(cs *tls.ConnectionState) (string, bool) {
	ids := tlsutil.NodeIDs(cs.VerifiedChains[0][0])
	if len(ids) == 0 {
		return "", false
	}
	return ids[0], true
}

// peerCtx is a server-side context of a connection with a verified peer
// certificate naming node id.
func peerCtx(t *testing.T, ca *tlsutil.CA, id string) (context.Context, *x509.Certificate) {
	t.Helper()
	kp, err := ca.Issue(tlsutil.CertRequest{CommonName: id, URIs: []*url.URL{tlsutil.NodeURI(id)}, Server: true, Client: true})
	if err != nil {
		t.Fatal(err)
	}
	cs := tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{kp.Cert, ca.Cert}}}
	ai := AuthInfo{TLSInfo: credentials.TLSInfo{State: cs}, Principal: identify(&cs, peerChecker{})}
	return peer.NewContext(context.Background(), &peer.Peer{AuthInfo: ai}), kp.Cert
}

// TestPeerIdentityNeedsMembership (item 9): a peer certificate of the peer
// CA whose node id is not a member may only join, as itself, whatever
// forwarded marker it sends; it cannot author writes for others. A member
// peer keeps every role, and a removed member's stream ends on Recheck.
func TestPeerIdentityNeedsMembership(t *testing.T) {
	ca, err := tlsutil.NewCA("ca", 0)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	members := map[string]bool{"n1": true, "n2": true}
	isMember := func(id string) bool { mu.Lock(); defer mu.Unlock(); return members[id] }
	a := newAuth(t, Options{ClientCerts: true, Members: isMember})
	put, join := pb.AdminService_PutRule_FullMethodName, pb.AdminService_JoinCluster_FullMethodName

	stranger, _ := peerCtx(t, ca, "n9")
	if _, err := a.Authorize(stranger, put); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "not a member") {
		t.Errorf("a non-member peer puts a rule: %v, want PermissionDenied", err)
	}
	jctx, err := a.Authorize(metadata.NewIncomingContext(stranger, metadata.Pairs(PrincipalHeader, "token:ops")), join)
	if err != nil {
		t.Fatalf("a non-member peer joins: %v", err)
	}
	if p, _ := FromContext(jctx); !p.Joining || p.OnBehalfOf != "" {
		t.Errorf("joining principal %+v: want Joining, acting for nobody", p)
	}
	if err := CheckJoin(jctx, "n9", true); err != nil {
		t.Errorf("joining as itself: %v", err)
	}
	for _, forwarded := range []bool{false, true} {
		if err := CheckJoin(jctx, "n1", forwarded); status.Code(err) != codes.PermissionDenied {
			t.Errorf("a non-member joins as n1 (forwarded marker %v): %v, want PermissionDenied", forwarded, err)
		}
	}

	member, _ := peerCtx(t, ca, "n2")
	in := metadata.NewIncomingContext(member, metadata.Pairs(PrincipalHeader, "token:ci"))
	mctx, err := a.Authorize(in, put)
	if err != nil {
		t.Fatalf("a member peer forwards a put: %v", err)
	}
	p, _ := FromContext(mctx)
	if got := p.AuditAttrs(); len(got) != 4 || got[1] != "token:ci" || got[3] != "peer:node:n2" {
		t.Errorf("audit attributes %v, want principal=token:ci via=peer:node:n2", got)
	}
	if err := CheckJoin(mctx, "n5", true); err != nil {
		t.Errorf("a member's forwarded join: %v (checked where it arrived)", err)
	}
	if err := CheckJoin(mctx, "n5", false); status.Code(err) != codes.PermissionDenied {
		t.Errorf("a member joins as another id: %v", err)
	}

	sctx, err := a.Authorize(member, pb.TokenService_WatchClusterView_FullMethodName)
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := a.Revocable(sctx)
	defer stop()
	a.Recheck()
	if sctx.Err() != nil {
		t.Fatal("a member's stream ended")
	}
	mu.Lock()
	delete(members, "n2")
	mu.Unlock()
	a.Recheck()
	if !errors.Is(context.Cause(sctx), ErrRevoked) {
		t.Errorf("a removed member's stream: cause %v, want ErrRevoked", context.Cause(sctx))
	}
	if _, err := a.Authorize(member, put); status.Code(err) != codes.PermissionDenied {
		t.Errorf("a removed member puts: %v", err)
	}
}

// TestDeniedSerialRefused (item 9): a certificate whose serial is denied
// is Unauthenticated, a peer's included, and its live streams end on
// Recheck.
func TestDeniedSerialRefused(t *testing.T) {
	ca, err := tlsutil.NewCA("ca", 0)
	if err != nil {
		t.Fatal(err)
	}
	pctx, leaf := peerCtx(t, ca, "n1")
	var mu sync.Mutex
	denied := map[string]bool{}
	a := newAuth(t, Options{ClientCerts: true, CertDenied: func(c *x509.Certificate) bool {
		mu.Lock()
		defer mu.Unlock()
		return denied[c.SerialNumber.String()]
	}})
	sctx, err := a.Authorize(pctx, pb.TokenService_WatchClusterView_FullMethodName)
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := a.Revocable(sctx)
	defer stop()
	mu.Lock()
	denied[leaf.SerialNumber.String()] = true
	mu.Unlock()
	if _, err := a.Authorize(pctx, pb.AdminService_NodeStatus_FullMethodName); status.Code(err) != codes.Unauthenticated {
		t.Errorf("a denied serial: %v, want Unauthenticated", err)
	}
	a.Recheck()
	if !errors.Is(context.Cause(sctx), ErrRevoked) {
		t.Errorf("the denied certificate's stream: cause %v", context.Cause(sctx))
	}
}

// TestTokenFileStartIsStrict: at start a bad line refuses the file, naming
// the line (an operator is there to fix it).
func TestTokenFileStartIsStrict(t *testing.T) {
	dir := t.TempDir()
	name := writeTokens(t, dir, TokenLine("a", "a", RoleClient), "sha256:zz b client")
	if _, err := New(Options{TokenFile: name, ReloadInterval: -1}); err == nil || !strings.Contains(err.Error(), filepath.Base(name)+":2") {
		t.Errorf("New with a bad line: %v", err)
	}
}

// TestClientAuthNoneNoCertPrincipal (item 10): with --tls-client-auth
// none, an editor's client certificate is not a credential (the call has
// none), while a peer (asking for the peer server name) still is one.
func TestClientAuthNoneNoCertPrincipal(t *testing.T) {
	p := newTestPKI(t)
	addr, r := startServer(t, p, tlsutil.ClientAuthNone)
	c := conn(t, addr, grpc.WithTransportCredentials(credentials.NewTLS(p.clientTLS(p.client))))
	if _, err := c.PutRule(ctx(t), &pb.PutRuleRequest{}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("an editor certificate in mode none: %v, want Unauthenticated", err)
	}
	peerTLS, err := r.PeerClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	c = conn(t, addr, grpc.WithTransportCredentials(credentials.NewTLS(peerTLS)))
	if _, err := c.NodeStatus(ctx(t), &pb.NodeStatusRequest{}); !strings.Contains(fmt.Sprint(err), "principal=peer:node:n1") {
		t.Errorf("a peer in mode none: %v", err)
	}
}
