package server

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// BenchmarkUnary compares one AcquireToken with a bare gRPC unary call
// (the health service) over the same in-memory connection: the difference
// is what the limiter adds to gRPC's own cost, client and server together.
func BenchmarkUnary(b *testing.B) {
	b.Run("bare", func(b *testing.B) {
		lis := bufconn.Listen(1 << 20)
		s := grpc.NewServer()
		hs := health.NewServer()
		healthpb.RegisterHealthServer(s, hs)
		go s.Serve(lis)
		defer s.Stop()
		conn := dialBuf(b, lis)
		c := healthpb.NewHealthClient(conn)
		req := &healthpb.HealthCheckRequest{}
		runParallel(b, func(ctx context.Context) error { _, err := c.Check(ctx, req); return err })
	})
	b.Run("acquire", func(b *testing.B) {
		tn := newTestNode(b, nil)
		tn.put(b, &pb.Rule{Name: "bench", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 1 << 40, Period: durationpb.New(time.Second)})
		keys := make([]string, 10000)
		for i := range keys {
			keys[i] = fmt.Sprint("user-", i)
		}
		i := 0
		runParallel(b, func(ctx context.Context) error {
			i++
			_, err := tn.token.AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: "bench", Key: keys[i%len(keys)]})
			return err
		})
	})
}

func dialBuf(b *testing.B, lis *bufconn.Listener) *grpc.ClientConn {
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	return conn
}

// runParallel runs call from one goroutine per P with a deadline, as the
// SDK and tokenctl bench do.
func runParallel(b *testing.B, call func(ctx context.Context) error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := call(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
