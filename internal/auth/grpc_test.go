package auth

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/tokenserver/tokenserver/internal/tlsutil"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// adminStub answers NodeStatus with an error that reports what the handler
// saw (the principal, whether the caller is a peer); the other methods are
// Unimplemented, which proves the call got past auth.
type adminStub struct {
	pb.UnimplementedAdminServiceServer
}

func (adminStub) NodeStatus(ctx context.Context, _ *pb.NodeStatusRequest) (*pb.NodeStatusResponse, error) {
	p, _ := FromContext(ctx)
	return nil, status.Errorf(codes.Unimplemented, "principal=%s peer=%v names-n1=%v names-n2=%v", p, IsPeer(ctx), PeerNamesNode(ctx, "n1"), PeerNamesNode(ctx, "n2"))
}

type testPKI struct {
	ca, foreign         *tlsutil.CA
	dir                 string
	node, client, alien *tlsutil.KeyPair
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	p := &testPKI{dir: t.TempDir()}
	var err error
	if p.ca, err = tlsutil.NewCA("ca", 0); err != nil {
		t.Fatal(err)
	}
	if p.foreign, err = tlsutil.NewCA("foreign", 0); err != nil {
		t.Fatal(err)
	}
	issue := func(ca *tlsutil.CA, r tlsutil.CertRequest) *tlsutil.KeyPair {
		kp, err := ca.Issue(r)
		if err != nil {
			t.Fatal(err)
		}
		return kp
	}
	p.node = issue(p.ca, tlsutil.CertRequest{CommonName: "n1", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, URIs: []*url.URL{tlsutil.NodeURI("n1")}, Server: true, Client: true})
	p.client = issue(p.ca, tlsutil.CertRequest{CommonName: "ci", URIs: []*url.URL{tlsutil.ClientURI("ci")}, OrganizationalUnits: []string{"editor"}, Client: true})
	p.alien = issue(p.foreign, tlsutil.CertRequest{CommonName: "alien", URIs: []*url.URL{tlsutil.NodeURI("n9")}, Server: true, Client: true})
	writeFile(t, filepath.Join(p.dir, "ca.crt"), p.ca.CertPEM)
	if err := p.node.WriteFiles(filepath.Join(p.dir, "tls.crt"), filepath.Join(p.dir, "tls.key")); err != nil {
		t.Fatal(err)
	}
	return p
}

// startServer serves the stub and health over TLS with client auth mode,
// the token file and ServerCredentials, as the server will.
func startServer(t *testing.T, p *testPKI, mode tlsutil.ClientAuth) (string, *tlsutil.Reloader) {
	t.Helper()
	r, err := tlsutil.New(tlsutil.Files{CertFile: filepath.Join(p.dir, "tls.crt"), KeyFile: filepath.Join(p.dir, "tls.key"), ClientCAFile: filepath.Join(p.dir, "ca.crt")}, tlsutil.Options{Interval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	cfg, err := r.ServerConfig(mode)
	if err != nil {
		t.Fatal(err)
	}
	a := newAuth(t, Options{TokenFile: testTokenFile(t), ClientCerts: true})
	srv := grpc.NewServer(grpc.Creds(ServerCredentials(cfg, r)),
		grpc.UnaryInterceptor(a.UnaryInterceptor()), grpc.StreamInterceptor(a.StreamInterceptor()))
	pb.RegisterAdminServiceServer(srv, adminStub{})
	pb.RegisterTokenServiceServer(srv, pb.UnimplementedTokenServiceServer{})
	healthpb.RegisterHealthServer(srv, health.NewServer())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return ln.Addr().String(), r
}

func (p *testPKI) clientTLS(cert *tlsutil.KeyPair) *tls.Config {
	roots := x509.NewCertPool()
	roots.AddCert(p.ca.Cert)
	c := &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"}
	if cert != nil {
		pair, _ := cert.TLSCertificate()
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &pair, nil }
	}
	return c
}

func conn(t *testing.T, addr string, opts ...grpc.DialOption) pb.AdminServiceClient {
	t.Helper()
	c, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return pb.NewAdminServiceClient(c)
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return c
}

// TestGRPC runs real calls over TLS through the interceptors:
// Unimplemented means the call passed auth.
func TestGRPC(t *testing.T) {
	p := newTestPKI(t)
	addr, r := startServer(t, p, tlsutil.ClientAuthRequest)
	tlsCreds := grpc.WithTransportCredentials(credentials.NewTLS(p.clientTLS(nil)))
	token := func(tok string) grpc.DialOption {
		return grpc.WithPerRPCCredentials(BearerToken{Token: tok})
	}
	peerTLS, err := r.PeerClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	restore := func(c pb.AdminServiceClient) error {
		s, err := c.SnapshotRestore(ctx(t))
		if err != nil {
			return err
		}
		_, err = s.CloseAndRecv()
		return err
	}
	put := func(c pb.AdminServiceClient) error {
		_, err := c.PutRule(ctx(t), &pb.PutRuleRequest{})
		return err
	}
	join := func(c pb.AdminServiceClient) error {
		_, err := c.JoinCluster(ctx(t), &pb.JoinClusterRequest{})
		return err
	}
	nodeStatus := func(c pb.AdminServiceClient) error {
		_, err := c.NodeStatus(ctx(t), &pb.NodeStatusRequest{})
		return err
	}
	tests := []struct {
		name string
		dial []grpc.DialOption
		call func(pb.AdminServiceClient) error
		want codes.Code
		msg  string
	}{
		{"plaintext client", []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, put, codes.Unavailable, ""},
		{"foreign client certificate", []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(p.clientTLS(p.alien)))}, put, codes.Unavailable, ""},
		{"no token", []grpc.DialOption{tlsCreds}, put, codes.Unauthenticated, "no credential"},
		{"client token puts", []grpc.DialOption{tlsCreds, token(clientTok)}, put, codes.PermissionDenied, "lacks role editor"},
		{"editor token puts", []grpc.DialOption{tlsCreds, token(editorTok)}, put, codes.Unimplemented, ""},
		{"editor token restores", []grpc.DialOption{tlsCreds, token(editorTok)}, restore, codes.PermissionDenied, "lacks role admin"},
		{"admin token restores", []grpc.DialOption{tlsCreds, token(adminTok)}, restore, codes.Unimplemented, ""},
		{"editor token joins", []grpc.DialOption{tlsCreds, token(editorTok)}, join, codes.PermissionDenied, "admin"},
		{"admin token joins", []grpc.DialOption{tlsCreds, token(adminTok)}, join, codes.Unimplemented, ""},
		{"editor certificate puts", []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(p.clientTLS(p.client)))}, put, codes.Unimplemented, ""},
		{"editor certificate joins", []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(p.clientTLS(p.client)))}, join, codes.PermissionDenied, "admin"},
		{"peer joins", []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(peerTLS))}, join, codes.Unimplemented, ""},
		{"peer is a peer", []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(peerTLS))}, nodeStatus, codes.Unimplemented, "principal=peer:node:n1 peer=true names-n1=true names-n2=false"},
		{"a client with every role is no peer", []grpc.DialOption{tlsCreds, token(adminTok)}, nodeStatus, codes.Unimplemented, "principal=token:ops peer=false names-n1=false"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.call(conn(t, addr, tt.dial...))
			if got := status.Code(err); got != tt.want {
				t.Fatalf("code %v (%v), want %v", got, err, tt.want)
			}
			if !strings.Contains(fmt.Sprint(err), tt.msg) {
				t.Errorf("error %v does not say %q", err, tt.msg)
			}
		})
	}
	t.Run("health is open", func(t *testing.T) {
		c, err := grpc.NewClient(addr, tlsCreds)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := healthpb.NewHealthClient(c).Check(ctx(t), &healthpb.HealthCheckRequest{}); err != nil {
			t.Errorf("health check without a credential: %v", err)
		}
	})
}

// TestGRPCRequire: mTLS require refuses a client without a certificate,
// whatever token it has.
func TestGRPCRequire(t *testing.T) {
	p := newTestPKI(t)
	addr, _ := startServer(t, p, tlsutil.ClientAuthRequire)
	c := conn(t, addr, grpc.WithTransportCredentials(credentials.NewTLS(p.clientTLS(nil))),
		grpc.WithPerRPCCredentials(BearerToken{Token: adminTok}))
	if _, err := c.NodeStatus(ctx(t), &pb.NodeStatusRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("no certificate: %v, want Unavailable (handshake refused)", err)
	}
	c = conn(t, addr, grpc.WithTransportCredentials(credentials.NewTLS(p.clientTLS(p.client))))
	if _, err := c.NodeStatus(ctx(t), &pb.NodeStatusRequest{}); status.Code(err) != codes.Unimplemented {
		t.Errorf("client certificate: %v", err)
	}
}

func writeFile(t *testing.T, name string, data []byte) {
	t.Helper()
	if err := os.WriteFile(name, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestBearerTokenPlaintext: without TLS a token goes to a loopback address
// only.
func TestBearerTokenPlaintext(t *testing.T) {
	a := newAuth(t, Options{TokenFile: testTokenFile(t)})
	srv := grpc.NewServer(grpc.UnaryInterceptor(a.UnaryInterceptor()))
	pb.RegisterAdminServiceServer(srv, adminStub{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Stop()
	creds := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(BearerToken{Token: adminTok})}
	c := conn(t, ln.Addr().String(), creds...)
	if _, err := c.NodeStatus(ctx(t), &pb.NodeStatusRequest{}); !strings.Contains(fmt.Sprint(err), "principal=token:ops") {
		t.Errorf("plaintext to loopback: %v", err)
	}
	c = conn(t, ln.Addr().String(), append(creds, grpc.WithAuthority("tokenserver.example:7070"))...)
	_, err = c.NodeStatus(ctx(t), &pb.NodeStatusRequest{})
	if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "refusing to send a bearer token without TLS") {
		t.Errorf("plaintext to a remote name: %v", err)
	}
}
