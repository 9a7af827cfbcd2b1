package client

// Regression tests of issue 20 for the SDK: credentials refused are never
// a fallback (item 21), the bucket cap is not "allow" (item 6), a normal
// start does not warn (item 25), a Limiter's options conflict (item 25).

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
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
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokenserver/tokenserver/internal/auth"
	"github.com/tokenserver/tokenserver/internal/tlsutil"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// oneNodeServer is a one-node TokenService: its view names itself and one
// rule; acquires are allowed, or fail with acquireErr.
type oneNodeServer struct {
	pb.UnimplementedTokenServiceServer
	addr       string
	rule       *pb.ClientRule
	acquireErr error
}

func (s *oneNodeServer) view() *pb.ClusterView {
	return &pb.ClusterView{Epoch: 1, Ready: true, Members: []*pb.Member{{Id: "n1", GrpcAddr: s.addr}}, Rules: []*pb.ClientRule{s.rule}}
}

func (s *oneNodeServer) GetClusterView(context.Context, *pb.GetClusterViewRequest) (*pb.ClusterView, error) {
	return s.view(), nil
}

func (s *oneNodeServer) WatchClusterView(_ *pb.GetClusterViewRequest, ss pb.TokenService_WatchClusterViewServer) error {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		if err := ss.Send(s.view()); err != nil {
			return err
		}
		select {
		case <-ss.Context().Done():
			return ss.Context().Err()
		case <-t.C:
		}
	}
}

func (s *oneNodeServer) AcquireToken(context.Context, *pb.AcquireTokenRequest) (*pb.AcquireTokenResponse, error) {
	if s.acquireErr != nil {
		return nil, s.acquireErr
	}
	return &pb.AcquireTokenResponse{Allowed: true, Granted: 1}, nil
}

func (s *oneNodeServer) AcquireTokens(_ context.Context, req *pb.AcquireTokensRequest) (*pb.AcquireTokensResponse, error) {
	if s.acquireErr != nil {
		return nil, s.acquireErr
	}
	out := &pb.AcquireTokensResponse{}
	for range req.GetRequests() {
		out.Results = append(out.Results, &pb.AcquireTokensResult{Response: &pb.AcquireTokenResponse{Allowed: true, Granted: 1}})
	}
	return out, nil
}

// startOneNode serves s on 127.0.0.1 with opts (credentials,
// interceptors).
func startOneNode(t *testing.T, s *oneNodeServer, opts ...grpc.ServerOption) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s.addr = ln.Addr().String()
	if s.rule == nil {
		s.rule = &pb.ClientRule{Name: "r", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 1, Period: durationpb.New(time.Hour), Version: 1}
	}
	srv := grpc.NewServer(opts...)
	pb.RegisterTokenServiceServer(srv, s)
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return s.addr
}

func shortCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// authServer serves a oneNodeServer behind auth with a token file holding a
// client token and a viewer token; it returns the address, the
// authenticator and the token file.
func authServer(t *testing.T) (string, *auth.Authenticator, string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "tokens")
	lines := auth.TokenLine("client-token", "svc", auth.RoleClient) + "\n" + auth.TokenLine("viewer-token", "dash", auth.RoleViewer) + "\n"
	if err := os.WriteFile(file, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := auth.New(auth.Options{TokenFile: file, ReloadInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	addr := startOneNode(t, &oneNodeServer{}, grpc.UnaryInterceptor(a.UnaryInterceptor()), grpc.StreamInterceptor(a.StreamInterceptor()))
	return addr, a, file
}

// TestSDKWrongTokenFailsClosed (item 21): New with a token the server
// does not know fails with ErrAuth (Unauthenticated), instead of a client
// that allows everything from its fallback.
func TestSDKWrongTokenFailsClosed(t *testing.T) {
	addr, _, _ := authServer(t)
	c, err := New(shortCtx(t), []string{addr}, WithToken("wrong-token"))
	if err == nil {
		c.Close()
		t.Fatal("New succeeded with a wrong token")
	}
	var ae *AuthError
	if !errors.Is(err, ErrAuth) || !errors.As(err, &ae) || status.Code(ae.Err) != codes.Unauthenticated {
		t.Errorf("New = %v, want an AuthError wrapping Unauthenticated", err)
	}
}

// TestSDKTokenWithoutClientRoleFailsClosed (item 21): a token without the
// client role is PermissionDenied, and New returns it as ErrAuth.
func TestSDKTokenWithoutClientRoleFailsClosed(t *testing.T) {
	addr, _, _ := authServer(t)
	c, err := New(shortCtx(t), []string{addr}, WithToken("viewer-token"))
	if err == nil {
		c.Close()
		t.Fatal("New succeeded with a viewer token")
	}
	if !errors.Is(err, ErrAuth) || status.Code(errors.Unwrap(errors.Unwrap(err))) != codes.PermissionDenied {
		t.Errorf("New = %v, want ErrAuth wrapping PermissionDenied", err)
	}
}

// TestSDKRevokedTokenCallsFailClosed (item 21): calls whose credentials
// the server refuses return ErrAuth and are never allowed, whatever the
// fallback policy says; the client is not in fallback.
func TestSDKRevokedTokenCallsFailClosed(t *testing.T) {
	addr, a, file := authServer(t)
	reg := prometheus.NewRegistry()
	c, err := New(shortCtx(t), []string{addr}, WithToken("client-token"), WithMetrics(reg), WithCallTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	lim := c.Limiter("r", WithFallback(FallbackAllow, 0))
	if d, err := lim.AllowN(shortCtx(t), "k", 1); err != nil || !d.Allowed || d.Source != SourceServer {
		t.Fatalf("before the revocation: %+v, %v", d, err)
	}
	if err := os.WriteFile(file, []byte(auth.TokenLine("other", "x", auth.RoleClient)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	allowed := 0
	for i := 0; i < 20; i++ {
		d, err := lim.AllowN(shortCtx(t), "k", 1)
		if d.Allowed {
			allowed++
		}
		if !errors.Is(err, ErrAuth) || status.Code(err) != codes.Unauthenticated {
			t.Fatalf("call %d: %v, want ErrAuth (Unauthenticated)", i, err)
		}
	}
	if allowed != 0 {
		t.Errorf("%d of 20 allowed with a revoked token", allowed)
	}
	if _, err := c.Limiter("conc", WithFallback(FallbackAllow, 0)).Acquire(shortCtx(t), "k"); !errors.Is(err, ErrAuth) {
		t.Errorf("Acquire: %v, want ErrAuth", err)
	}
	if c.InFallback() {
		t.Error("a refused credential put the client in fallback")
	}
	if got := testutil.ToFloat64(c.m.authRefused); got < 20 {
		t.Errorf("tokenserver_client_auth_refused_total = %v, want ≥ 20", got)
	}
}

// TestSDKCertificateMismatchFailsClosed (item 21): a server certificate
// that does not verify (a name mismatch) is ErrAuth from New.
func TestSDKCertificateMismatchFailsClosed(t *testing.T) {
	ca, err := tlsutil.NewCA("ca", 0)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := ca.Issue(tlsutil.CertRequest{CommonName: "n1", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, URIs: []*url.URL{tlsutil.NodeURI("n1")}, Server: true})
	if err != nil {
		t.Fatal(err)
	}
	pair, err := kp.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	addr := startOneNode(t, &oneNodeServer{}, grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{pair}})))
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	c, err := New(shortCtx(t), []string{addr}, WithTLS(&tls.Config{RootCAs: roots, ServerName: "wrong.example"}))
	if err == nil {
		c.Close()
		t.Fatal("New succeeded against a certificate for another name")
	}
	if !errors.Is(err, ErrAuth) || !strings.Contains(err.Error(), "x509") {
		t.Errorf("New = %v, want ErrAuth naming the x509 error", err)
	}
	c, err = New(shortCtx(t), []string{addr}, WithTLS(&tls.Config{RootCAs: roots}))
	if err != nil {
		t.Fatalf("the right name: %v", err)
	}
	c.Close()
}

// TestSDKResourceExhaustedNotAllowed (item 6): the node's bucket cap
// (ResourceExhausted) is decided by the fallback policy when one is
// known, and denied when none is, instead of "server unreachable: allow".
func TestSDKResourceExhaustedNotAllowed(t *testing.T) {
	capErr := status.Error(codes.ResourceExhausted, "node bucket cap reached")
	tests := []struct {
		name      string
		rule      *pb.ClientRule
		opts      []LimiterOption
		wantAllow []bool
	}{
		{"no policy: denied", nil, nil, []bool{false, false}},
		{"limiter says allow", nil, []LimiterOption{WithFallback(FallbackAllow, 0)}, []bool{true, true}},
		{"rule says local 1", &pb.ClientRule{Name: "r", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 5, Period: durationpb.New(time.Hour), Version: 1,
			Fallback: &pb.Fallback{Policy: pb.FallbackPolicy(FallbackLocal), Limit: 1}}, nil, []bool{true, false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := startOneNode(t, &oneNodeServer{rule: tt.rule, acquireErr: capErr})
			c, err := New(shortCtx(t), []string{addr}, WithCallTimeout(time.Second))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			lim := c.Limiter("r", tt.opts...)
			for i, want := range tt.wantAllow {
				d, err := lim.AllowN(shortCtx(t), "new-key", 1)
				if d.Allowed != want || d.Source != SourceFallback {
					t.Errorf("call %d: %+v (%v), want allowed=%v from the fallback", i, d, err, want)
				}
				if tt.opts == nil && tt.rule == nil && !errors.Is(err, ErrUnavailable) {
					t.Errorf("call %d: %v, want ErrUnavailable", i, err)
				}
			}
			if tt.opts == nil && tt.rule == nil {
				if _, err := c.Limiter("conc").Acquire(shortCtx(t), "k"); !errors.Is(err, ErrUnavailable) {
					t.Errorf("Acquire with no policy: %v, want ErrUnavailable", err)
				}
			}
		})
	}
}

// syncLog is a log sink safe for the client's goroutines.
type syncLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncLog) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncLog) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestSDKNormalStartDoesNotWarn (item 25): a start that finds a server
// logs no "entering fallback"; a start that finds none says so at warn.
func TestSDKNormalStartDoesNotWarn(t *testing.T) {
	addr := startOneNode(t, &oneNodeServer{})
	var logs syncLog
	c, err := New(shortCtx(t), []string{addr}, WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if strings.Contains(logs.String(), "fallback") || strings.Contains(logs.String(), "level=WARN") {
		t.Errorf("a normal start logged:\n%s", logs.String())
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	var logs2 syncLog
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	c, err = New(ctx, []string{dead}, WithLogger(slog.New(slog.NewTextHandler(&logs2, nil))))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if n := strings.Count(logs2.String(), "entering fallback"); n != 1 || !strings.Contains(logs2.String(), "level=WARN") {
		t.Errorf("a start with no server said %d times that it enters fallback:\n%s", n, logs2.String())
	}
}

// TestLimiterOptionsConflict (item 25): Limiter with equal options returns
// the same Limiter quietly; with other options the first ones stay, and
// the conflict is logged, counted, and an error from LimiterE.
func TestLimiterOptionsConflict(t *testing.T) {
	addr := startOneNode(t, &oneNodeServer{})
	var logs syncLog
	reg := prometheus.NewRegistry()
	c, err := New(shortCtx(t), []string{addr}, WithLogger(slog.New(slog.NewTextHandler(&logs, nil))), WithMetrics(reg))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a := c.Limiter("r", WithFallback(FallbackDeny, 0))
	if b := c.Limiter("r", WithFallback(FallbackDeny, 0)); b != a || strings.Contains(logs.String(), "other options") {
		t.Fatalf("equal options: same limiter %v, log:\n%s", b == a, logs.String())
	}
	if b := c.Limiter("r", WithFallback(FallbackAllow, 0)); b != a || b.o.fbPolicy != FallbackDeny {
		t.Fatalf("other options: same limiter %v, policy %v; want the first limiter, unchanged", b == a, b.o.fbPolicy)
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), `ignored="fallback=allow/0"`) {
		t.Errorf("the conflict is not logged:\n%s", logs.String())
	}
	if got := testutil.ToFloat64(c.m.limiterConflicts.WithLabelValues("r")); got != 1 {
		t.Errorf("conflicts counted %v, want 1", got)
	}
	if _, err := c.LimiterE("r", WithLease(10, time.Second)); !errors.Is(err, ErrLimiterOptions) {
		t.Errorf("LimiterE with other options: %v", err)
	}
	if l, err := c.LimiterE("r", WithFallback(FallbackDeny, 0)); err != nil || l != a {
		t.Errorf("LimiterE with equal options: %v", err)
	}
}
