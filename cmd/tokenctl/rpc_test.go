package main

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// flakyAdmin answers Unavailable to the first failures calls of each
// method, then succeeds; or, with hang, never answers.
type flakyAdmin struct {
	pb.UnimplementedAdminServiceServer
	failures   int64
	hang       bool
	gets, puts atomic.Int64
}

func (f *flakyAdmin) GetRule(ctx context.Context, req *pb.GetRuleRequest) (*pb.Rule, error) {
	if f.hang {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if f.gets.Add(1) <= f.failures {
		return nil, status.Error(codes.Unavailable, "no leader yet")
	}
	return &pb.Rule{Name: req.GetName(), Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 1, Version: 7}, nil
}

func (f *flakyAdmin) PutRule(_ context.Context, req *pb.PutRuleRequest) (*pb.PutRuleResponse, error) {
	if f.puts.Add(1) <= f.failures {
		return nil, status.Error(codes.Unavailable, "no leader yet")
	}
	r := req.GetRule()
	r.Version = req.GetExpectedVersion() + 1
	return &pb.PutRuleResponse{Rule: r}, nil
}

func startFlaky(t *testing.T, f *flakyAdmin) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	pb.RegisterAdminServiceServer(s, f)
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	return lis.Addr().String()
}

// TestRetryUnavailable: an Unavailable answer is retried (by the service
// config's retryPolicy) until the server answers, for reads and for
// compare-and-set writes alike, and each retry is logged.
func TestRetryUnavailable(t *testing.T) {
	t.Parallel()
	f := &flakyAdmin{failures: 3}
	addr := startFlaky(t, f)

	r := tokenctl(t, "", "--server", addr, "--timeout", "5s", "rule", "get", "api")
	if r.err != nil {
		t.Fatalf("rule get: %v", r.err)
	}
	if got := f.gets.Load(); got != 4 {
		t.Errorf("GetRule called %d times, want 4 (3 Unavailable, then the answer)", got)
	}
	if n := strings.Count(r.stderr, "is unavailable (attempt"); n != 3 {
		t.Errorf("stderr logs %d retries, want 3:\n%s", n, r.stderr)
	}

	r = tokenctl(t, "", "--server", addr, "--timeout", "5s", "rule", "put", "api", "--algorithm", "token-bucket",
		"--limit", "1", "--period", "1s", "--expected-version", "7")
	if r.err != nil {
		t.Fatalf("rule put --expected-version: %v", r.err)
	}
	if got := f.puts.Load(); got != 4 {
		t.Errorf("PutRule called %d times, want 4", got)
	}
}

// TestRetryUntilTimeout: a server that keeps answering Unavailable is
// retried until --timeout, past gRPC's default of 5 attempts (5 backoffs
// take at most 1.55s).
func TestRetryUntilTimeout(t *testing.T) {
	t.Parallel()
	f := &flakyAdmin{failures: 1 << 30}
	addr := startFlaky(t, f)
	start := time.Now()
	r := tokenctl(t, "", "--server", addr, "--timeout", "2500ms", "rule", "get", "api")
	if status.Code(r.err) != codes.Unavailable {
		t.Fatalf("rule get: %v, want Unavailable", r.err)
	}
	if elapsed := time.Since(start); elapsed < 2*time.Second {
		t.Errorf("gave up after %v, want about the 2.5s timeout", elapsed)
	}
	if !strings.Contains(r.err.Error(), "no leader yet") || !strings.Contains(r.err.Error(), "attempts)") {
		t.Errorf("error %q should give the attempts and the server's last message", r.err)
	}
	if got := f.gets.Load(); got <= 5 {
		t.Errorf("GetRule called %d times, want more than 5", got)
	}
}

// TestSlowServerDeadline: a server that is reached but does not answer
// gives DeadlineExceeded, not Unavailable.
func TestSlowServerDeadline(t *testing.T) {
	t.Parallel()
	addr := startFlaky(t, &flakyAdmin{hang: true})
	r := tokenctl(t, "", "--server", addr, "--timeout", "300ms", "rule", "get", "api")
	if status.Code(r.err) != codes.DeadlineExceeded || !strings.Contains(r.err.Error(), "no answer from "+addr) {
		t.Fatalf("rule get: %v, want DeadlineExceeded naming the server", r.err)
	}
}
