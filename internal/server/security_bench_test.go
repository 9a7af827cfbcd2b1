package server

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokenserver/tokenserver/internal/auth"
	"github.com/tokenserver/tokenserver/internal/tlsutil"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// benchPKI is a server certificate for localhost, its CA pool and a token
// file admitting one client,editor token.
type benchPKI struct {
	cert, key, tokens string
	pool              *x509.CertPool
	token             string
}

func newBenchPKI(b *testing.B) *benchPKI {
	b.Helper()
	ca, err := tlsutil.NewCA("bench", time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	kp, err := ca.Issue(tlsutil.CertRequest{CommonName: "n0", DNSNames: []string{"localhost"}, Server: true, Client: true})
	if err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	p := &benchPKI{cert: filepath.Join(dir, "n0.crt"), key: filepath.Join(dir, "n0.key"), tokens: filepath.Join(dir, "tokens"), pool: x509.NewCertPool()}
	if err := kp.WriteFiles(p.cert, p.key); err != nil {
		b.Fatal(err)
	}
	p.pool.AddCert(ca.Cert)
	tok, line, err := auth.NewToken("bench", auth.RoleClient|auth.RoleEditor)
	if err != nil {
		b.Fatal(err)
	}
	p.token = tok
	if err := os.WriteFile(p.tokens, []byte(line+"\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	return p
}

func dialBufTLS(b *testing.B, lis *bufconn.Listener, p *benchPKI, token string) *grpc.ClientConn {
	opts := []grpc.DialOption{
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: p.pool, ServerName: "localhost"})),
	}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(auth.BearerToken{Token: token}))
	}
	conn, err := grpc.NewClient("passthrough:///bufnet", opts...)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	return conn
}

// BenchmarkUnaryTLS is BenchmarkUnary over TLS: a bare gRPC unary call
// (the health service, static TLS config), AcquireToken on a node serving
// TLS from tlsutil.Reloader, and the same with token auth. acquire-tls over
// bare-tls is the TLS figure's ratio in one process; acquire-tls-token less
// acquire-tls is what token auth costs a call, client and server.
func BenchmarkUnaryTLS(b *testing.B) {
	p := newBenchPKI(b)
	b.Run("bare-tls", func(b *testing.B) {
		pair, err := tls.LoadX509KeyPair(p.cert, p.key)
		if err != nil {
			b.Fatal(err)
		}
		lis := bufconn.Listen(1 << 20)
		s := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pair}})))
		healthpb.RegisterHealthServer(s, health.NewServer())
		go s.Serve(lis)
		defer s.Stop()
		c := healthpb.NewHealthClient(dialBufTLS(b, lis, p, ""))
		req := &healthpb.HealthCheckRequest{}
		runParallel(b, func(ctx context.Context) error { _, err := c.Check(ctx, req); return err })
	})
	for _, withAuth := range []bool{false, true} {
		name := "acquire-tls"
		if withAuth {
			name += "-token"
		}
		b.Run(name, func(b *testing.B) {
			rl, err := tlsutil.New(tlsutil.Files{CertFile: p.cert, KeyFile: p.key}, tlsutil.Options{})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(rl.Close)
			sec := Security{TLS: rl}
			token := ""
			if withAuth {
				az, err := auth.New(auth.Options{TokenFile: p.tokens})
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(az.Close)
				sec.Auth, token = az, p.token
			}
			cfg := DefaultConfig()
			cfg.HTTPAddr = ""
			cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
			cfg.Security = sec
			n, err := New(cfg, NewStandalone("n0", "bufnet", inmem(b, 0)).Deps())
			if err != nil {
				b.Fatal(err)
			}
			lis := bufconn.Listen(1 << 20)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- n.Serve(ctx, Listeners{GRPC: lis}) }()
			b.Cleanup(func() { cancel(); <-done }) // after the timed part: a stop lingers
			conn := dialBufTLS(b, lis, p, token)
			put, perr := pb.NewAdminServiceClient(conn).PutRule(context.Background(), &pb.PutRuleRequest{Rule: &pb.Rule{Name: "bench", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 1 << 40, Period: durationpb.New(time.Second)}})
			if perr != nil {
				b.Fatalf("put: %v %v", put, perr)
			}
			tc := pb.NewTokenServiceClient(conn)
			keys := make([]string, 10000)
			for i := range keys {
				keys[i] = fmt.Sprint("user-", i)
			}
			i := 0
			runParallel(b, func(ctx context.Context) error {
				i++
				_, err := tc.AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: "bench", Key: keys[i%len(keys)]})
				return err
			})
		})
	}
}
