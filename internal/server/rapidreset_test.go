package server

import (
	"context"
	"io"
	"log/slog"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tokenserver/tokenserver/internal/server/h2flood"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// serveTCP runs a standalone node on 127.0.0.1:0 and returns its gRPC
// address.
func serveTCP(t *testing.T, mutate func(*Config)) (*Node, string) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.GRPCAddr, cfg.HTTPAddr = "127.0.0.1:0", ""
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if mutate != nil {
		mutate(&cfg)
	}
	n, err := New(cfg, NewStandalone("node-1", "tcp", inmem(t, cfg.MaxRules)).Deps())
	if err != nil {
		t.Fatal(err)
	}
	lis, err := Listen(cfg)
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.GRPC.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Serve(ctx, lis) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return n, addr
}

// TestRapidResetBounded floods one connection with HEADERS then
// RST_STREAM (CVE-2023-44487), 20,000 streams or 10 s at most, and checks
// the pinned grpc-go's mitigation as the node configures it: the handlers
// running at once (goroutines) stay within MaxConcurrentStreams of the
// baseline, and the node still answers afterwards.
func TestRapidResetBounded(t *testing.T) {
	const streams = 32
	_, addr := serveTCP(t, func(c *Config) { c.MaxConcurrentStreams = streams })
	c, err := h2flood.Dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	time.Sleep(50 * time.Millisecond) // the connection's own goroutines start
	base := runtime.NumGoroutine()
	var peak atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(200 * time.Microsecond)
		defer tick.Stop()
		for {
			if g := int64(runtime.NumGoroutine()); g > peak.Load() {
				peak.Store(g)
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	sent, err := c.RapidReset(pb.TokenService_AcquireToken_FullMethodName, 20000, time.Now().Add(10*time.Second))
	close(stop)
	<-sampled
	t.Logf("sent %d HEADERS+RST_STREAM pairs; goroutines: base %d, peak %d; GOAWAY %v", sent, base, peak.Load(), c.GoAway.Load())
	if err != nil && sent == 0 {
		t.Fatalf("flood: %v", err)
	}
	// Each running handler is a goroutine, plus a few of the sampler and
	// the stream workers' hand-off.
	if extra := peak.Load() - int64(base); extra > streams+40 {
		t.Fatalf("%d goroutines above the baseline during the flood: handlers are not bounded by MaxConcurrentStreams=%d", extra, streams)
	}
	tn := dialTCP(t, addr)
	if _, err := tn.GetClusterView(ctx(t), &pb.GetClusterViewRequest{}); err != nil {
		t.Fatalf("after the flood: %v", err)
	}
}

// dialTCP is a TokenService client of addr, closed at the test's end.
func dialTCP(t *testing.T, addr string) pb.TokenServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pb.NewTokenServiceClient(conn)
}
