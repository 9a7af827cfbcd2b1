package client

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tokenserver/tokenserver/internal/auth"
	"github.com/tokenserver/tokenserver/internal/tlsutil"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// viewStub answers GetClusterView with an error naming the caller's
// principal, so that the test sees what the server saw.
type viewStub struct {
	pb.UnimplementedTokenServiceServer
}

func (viewStub) GetClusterView(ctx context.Context, _ *pb.GetClusterViewRequest) (*pb.ClusterView, error) {
	p, _ := auth.FromContext(ctx)
	return nil, status.Errorf(codes.Unimplemented, "principal=%s", p)
}

// TestWithTLSAndToken: the options win over the default insecure
// credentials, and the server sees the token's principal over TLS; a token
// without TLS is not sent to a remote name.
func TestWithTLSAndToken(t *testing.T) {
	dir := t.TempDir()
	ca, err := tlsutil.NewCA("ca", 0)
	if err != nil {
		t.Fatal(err)
	}
	node, err := ca.Issue(tlsutil.CertRequest{CommonName: "n1", IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, URIs: []*url.URL{tlsutil.NodeURI("n1")}, Server: true, Client: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := node.WriteFiles(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")); err != nil {
		t.Fatal(err)
	}
	tok, line, err := auth.NewToken("svc", auth.RoleClient)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokens"), []byte(line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	rl, err := tlsutil.New(tlsutil.Files{CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key")}, tlsutil.Options{Interval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer rl.Close()
	cfg, err := rl.ServerConfig(tlsutil.ClientAuthNone)
	if err != nil {
		t.Fatal(err)
	}
	az, err := auth.New(auth.Options{TokenFile: filepath.Join(dir, "tokens"), ReloadInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer az.Close()
	srv := grpc.NewServer(grpc.Creds(auth.ServerCredentials(cfg, rl)), grpc.UnaryInterceptor(az.UnaryInterceptor()))
	pb.RegisterTokenServiceServer(srv, viewStub{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Stop()

	plain := grpc.NewServer(grpc.UnaryInterceptor(az.UnaryInterceptor()))
	pb.RegisterTokenServiceServer(plain, viewStub{})
	pln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go plain.Serve(pln)
	defer plain.Stop()

	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	call := func(addr string, opts ...Option) error {
		o := defaultOptions()
		for _, f := range opts {
			f(&o)
		}
		conn, err := grpc.NewClient(addr, (&Client{o: o}).dialOptions()...)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = pb.NewTokenServiceClient(conn).GetClusterView(ctx, &pb.GetClusterViewRequest{})
		return err
	}
	tests := []struct {
		name string
		addr string
		opts []Option
		code codes.Code
		msg  string
	}{
		{"no options: plaintext", ln.Addr().String(), nil, codes.Unavailable, ""},
		{"TLS without token", ln.Addr().String(), []Option{WithTLS(&tls.Config{RootCAs: roots})}, codes.Unauthenticated, ""},
		{"TLS and token", ln.Addr().String(), []Option{WithTLS(&tls.Config{RootCAs: roots}), WithToken(tok)}, codes.Unimplemented, "principal=token:svc"},
		{"TLS and a wrong token", ln.Addr().String(), []Option{WithTLS(&tls.Config{RootCAs: roots}), WithToken("nope")}, codes.Unauthenticated, ""},
		{"token without TLS to loopback", pln.Addr().String(), []Option{WithToken(tok)}, codes.Unimplemented, "principal=token:svc"},
		{"token without TLS to a remote name", pln.Addr().String(), []Option{WithToken(tok), WithDialOptions(grpc.WithAuthority("tokenserver.example:7070"))}, codes.Unauthenticated, "refusing to send the bearer token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := call(tt.addr, tt.opts...)
			if status.Code(err) != tt.code || !strings.Contains(status.Convert(err).Message(), tt.msg) {
				t.Errorf("GetClusterView: %v, want %v with %q", err, tt.code, tt.msg)
			}
		})
	}
}
