//go:build multiprocess && figures

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
	"unsafe"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// TestFiguresEnvoyRLS measures, over loopback with 64 concurrent callers as
// scripts/bench-e2e.sh does, the calls per second of a bare gRPC unary call
// (tokenctl bench-server), of AcquireToken (the calibration: the issue
// measured 0.92 of bare with scripts/bench-e2e.sh) and of ShouldRateLimit
// with 1 and 10 descriptors on a one-node tokenserver (fixed windows, never
// over). Reported, never asserted. As in scripts/bench-e2e.sh, the servers
// run on core 0 (taskset) and the load generator, this test's process, on
// core 1, when the machine has two cores and taskset. BENCH_ROUNDS (default
// 1) repeats the four measures in turn, each BENCH_DURATION (default 5 s).
func TestFiguresEnvoyRLS(t *testing.T) {
	pinned := false
	if _, err := exec.LookPath("taskset"); err == nil && runtime.NumCPU() >= 2 {
		pinned = pinThreads(t, 1)
	}
	command := func(name string, args ...string) *exec.Cmd {
		if pinned {
			return exec.Command("taskset", append([]string{"-c", "0", name}, args...)...)
		}
		return exec.Command(name, args...)
	}
	dir := t.TempDir()
	conf := "domain: bench\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 4000000000}\n"
	if err := os.WriteFile(filepath.Join(dir, "bench.yaml"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startServerCmd(t, command(bin(t, "tokenserver"), "--log-format", "json", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0",
		"--data-dir", t.TempDir(), "--envoy-config-dir", dir))
	deadline := time.Now().Add(30 * time.Second)
	for !readyz(s.httpAddr) {
		if time.Now().After(deadline) {
			t.Fatal("not ready within 30s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	bareAddr := freePort(t)
	bare := command(bin(t, "tokenctl"), "bench-server", "--addr", bareAddr, "--duration", "5m")
	if err := bare.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bare.Process.Kill(); _ = bare.Wait() })

	dial := func(addr string) *grpc.ClientConn {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	health := healthpb.NewHealthClient(dial(bareAddr))
	rls := rlpb.NewRateLimitServiceClient(dial(s.grpcAddr))
	ctx := context.Background()
	for time.Now().Before(deadline) {
		if _, err := health.Check(ctx, &healthpb.HealthCheckRequest{}); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	reqs := func(n int) []*rlpb.RateLimitRequest {
		out := make([]*rlpb.RateLimitRequest, 10000)
		for i := range out {
			out[i] = &rlpb.RateLimitRequest{Domain: "bench"}
			for j := 0; j < n; j++ {
				out[i].Descriptors = append(out[i].Descriptors, &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
					{Key: "remote_address", Value: fmt.Sprintf("10.%d.%d.%d", j, i/256, i%256)}}})
			}
		}
		return out
	}
	one, ten := reqs(1), reqs(10)
	tsConn := dial(s.grpcAddr)
	if _, err := pb.NewAdminServiceClient(tsConn).PutRule(ctx, &pb.PutRuleRequest{Rule: rulePB("bench", 1_000_000_000)}); err != nil {
		t.Fatal(err)
	}
	token := pb.NewTokenServiceClient(tsConn)
	keys := make([]string, 10000)
	for i := range keys {
		keys[i] = fmt.Sprint("user-", i)
	}
	dur := 5 * time.Second
	if d, err := time.ParseDuration(os.Getenv("BENCH_DURATION")); err == nil {
		dur = d
	}
	rate := func(call func(i int) error) float64 {
		var n atomic.Int64
		stop := time.Now().Add(dur)
		var wg sync.WaitGroup
		for w := 0; w < 64; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; time.Now().Before(stop); i += 64 {
					if err := call(i); err != nil {
						t.Errorf("call: %v", err)
						return
					}
					n.Add(1)
				}
			}()
		}
		wg.Wait()
		return float64(n.Load()) / dur.Seconds()
	}
	rounds := 1
	if r, err := strconv.Atoi(os.Getenv("BENCH_ROUNDS")); err == nil && r > 0 {
		rounds = r
	}
	t.Logf("pinned (servers on core 0, load on core 1): %v", pinned)
	// CPU time per call of the serving process: throughput on a shared
	// machine swings with the neighbours' load; what a call costs the
	// server does much less, and on a core of its own the ratio of
	// throughputs is the inverse ratio of these.
	measure := func(pid int, call func(i int) error) (perSecond, cpuPerCall float64) {
		before := procCPU(t, pid)
		perSecond = rate(call)
		return perSecond, (procCPU(t, pid) - before).Seconds() / (perSecond * dur.Seconds())
	}
	srv, bench := s.cmd.Process.Pid, bare.Process.Pid
	for range rounds {
		bareRate, bareCPU := measure(bench, func(int) error { _, err := health.Check(ctx, &healthpb.HealthCheckRequest{}); return err })
		acqRate, acqCPU := measure(srv, func(i int) error {
			_, err := token.AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: "bench", Key: keys[i%len(keys)]})
			return err
		})
		oneRate, oneCPU := measure(srv, func(i int) error { _, err := rls.ShouldRateLimit(ctx, one[i%len(one)]); return err })
		tenRate, tenCPU := measure(srv, func(i int) error { _, err := rls.ShouldRateLimit(ctx, ten[i%len(ten)]); return err })
		t.Logf("bare %.0f calls/s; AcquireToken %.0f/s (%.2f of bare); ShouldRateLimit 1 descriptor %.0f/s (%.2f of bare, %.2f of AcquireToken); 10 descriptors %.0f/s (%.2f of bare, a call costs %.2f× one)",
			bareRate, acqRate, acqRate/bareRate, oneRate, oneRate/bareRate, oneRate/acqRate, tenRate, tenRate/bareRate, oneRate/tenRate)
		t.Logf("server CPU per call: bare %.1f µs; AcquireToken %.1f µs (bare/this %.2f); ShouldRateLimit 1 descriptor %.1f µs (bare/this %.2f); 10 descriptors %.1f µs (%.2f× one)",
			bareCPU*1e6, acqCPU*1e6, bareCPU/acqCPU, oneCPU*1e6, bareCPU/oneCPU, tenCPU*1e6, tenCPU/oneCPU)
	}
}

// pinThreads pins every thread of this process to core cpu, as taskset
// would (threads started later inherit it from their parent thread), and
// restores the whole machine in t.Cleanup. It reports whether it did.
func pinThreads(t *testing.T, cpu int) bool {
	t.Helper()
	setAll := func(mask *[16]uint64) bool {
		tasks, err := os.ReadDir("/proc/self/task")
		if err != nil {
			return false
		}
		for _, task := range tasks {
			tid, err := strconv.Atoi(task.Name())
			if err != nil {
				continue
			}
			if _, _, e := syscall.RawSyscall(syscall.SYS_SCHED_SETAFFINITY, uintptr(tid), unsafe.Sizeof(*mask), uintptr(unsafe.Pointer(mask))); e != 0 {
				return false
			}
		}
		return true
	}
	var one, all [16]uint64
	one[cpu/64] = 1 << (cpu % 64)
	for c := range runtime.NumCPU() {
		all[c/64] |= 1 << (c % 64)
	}
	t.Cleanup(func() { setAll(&all) })
	return setAll(&one)
}
