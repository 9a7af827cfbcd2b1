//go:build multiprocess

package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokenserver/tokenserver/internal/server/h2flood"
	"github.com/tokenserver/tokenserver/internal/testcluster"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// The attack tests of issue 20 (items 3, 4, 7): each starts one node on
// 127.0.0.1, attacks it a bounded number of times for a bounded time,
// and prints a FIGURE line with the node's peak RSS (VmHWM) or CPU, so
// that the same test run with TOKENSERVER_BIN set to an older build gives
// the "before" figure.

// procMem is a process's resident set and its peak, in bytes.
func procMem(t *testing.T, pid int) (rss, hwm int64) {
	t.Helper()
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmRSS":
			rss = kb << 10
		case "VmHWM":
			hwm = kb << 10
		}
	}
	return rss, hwm
}

// procCPU is the CPU time a process used so far (user and system).
func procCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command name in parentheses: utime is the 12th,
	// stime the 13th, in clock ticks (100 per second on Linux).
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * 10 * time.Millisecond
}

const mib = 1 << 20

// single starts one plain-text node on 127.0.0.1 with extra flags and a
// rule "r", and returns it with a connection to it.
func single(t *testing.T, extra ...string) (*serverProc, *grpc.ClientConn) {
	t.Helper()
	args := append([]string{"--node-id", "n0", "--grpc-addr", freePort(t), "--http-addr", "", "--raft-addr", freePort(t),
		"--data-dir", filepath.Join(t.TempDir(), "data")}, extra...)
	s := startServer(t, args...)
	conn, err := grpc.NewClient(s.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return s, conn
}

func withTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// hugeHeaders sends calls streams carrying one header name of size bytes
// of commas, on conns connections at once, and returns the node's growth
// of peak RSS.
func hugeHeaders(t *testing.T, s *serverProc, conns, size int, name string) int64 {
	t.Helper()
	pid := s.cmd.Process.Pid
	_, before := procMem(t, pid)
	value := strings.Repeat(",", size)
	var wg sync.WaitGroup
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := h2flood.Dial(s.grpcAddr)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			if _, err := c.Headers(pb.TokenService_GetClusterView_FullMethodName, name, value); err != nil {
				return // the node closed the connection: refused
			}
			select {
			case <-c.Closed:
			case <-time.After(3 * time.Second):
			}
		}()
	}
	wg.Wait()
	time.Sleep(500 * time.Millisecond) // let the node's handlers run
	_, after := procMem(t, pid)
	return after - before
}

// TestAvoidHeaderBounded: 16 calls with 8 MB of commas in
// x-tokenserver-avoid leave the node's peak RSS within 64 MiB of where it
// was (it took 160 MB to 4.5 GB before the header was bounded), and the
// node serves on.
func TestAvoidHeaderBounded(t *testing.T) {
	s, conn := single(t)
	grow := hugeHeaders(t, s, 16, 8<<20, "x-tokenserver-avoid")
	t.Logf("FIGURE avoid-header: 16 calls × 8 MiB: peak RSS grew %d MiB", grow/mib)
	if grow > 64*mib {
		t.Fatalf("peak RSS grew %d MiB", grow/mib)
	}
	if _, err := pb.NewTokenServiceClient(conn).GetClusterView(withTimeout(t, 5*time.Second), &pb.GetClusterViewRequest{}); err != nil {
		t.Fatal(err)
	}
}

// TestBearerTokenBounded: 16 calls with 15 MB fake bearer tokens are
// refused before they are read in full and hashed: peak RSS grows less
// than 64 MiB and the node serves on.
func TestBearerTokenBounded(t *testing.T) {
	pki := testcluster.NewPKI(t, "n0")
	s, conn := single(t, "--auth-tokens", pki.TokenFile)
	grow := hugeHeaders(t, s, 16, 15<<20, "authorization")
	t.Logf("FIGURE bearer-token: 16 calls × 15 MiB tokens: peak RSS grew %d MiB", grow/mib)
	if grow > 64*mib {
		t.Fatalf("peak RSS grew %d MiB", grow/mib)
	}
	hc := healthpb.NewHealthClient(conn)
	if _, err := hc.Check(withTimeout(t, 5*time.Second), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
}

// TestHealthWatchCapped: 4,000 health Watch streams (16 connections of
// 250) get no more than --max-health-watches served; the rest are
// RESOURCE_EXHAUSTED, RSS grows less than 64 MiB, and Check answers.
func TestHealthWatchCapped(t *testing.T) {
	s, conn := single(t)
	pid := s.cmd.Process.Pid
	before, _ := procMem(t, pid)
	ctx := withTimeout(t, 60*time.Second)
	var mu sync.Mutex
	served, refused := 0, 0
	var wg sync.WaitGroup
	for range 16 {
		c, err := grpc.NewClient(s.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		hc := healthpb.NewHealthClient(c)
		for range 250 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
				if err == nil {
					_, err = w.Recv()
				}
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					served++
				case status.Code(err) == codes.ResourceExhausted:
					refused++
				}
			}()
		}
	}
	wg.Wait()
	after, _ := procMem(t, pid)
	t.Logf("FIGURE health-watch: 4000 Watch streams: %d served, %d refused; RSS %d → %d MiB", served, refused, before/mib, after/mib)
	if served > 256 || refused < 4000-256 {
		t.Fatalf("%d Watch streams served, %d refused: want at most 256 served", served, refused)
	}
	if after-before > 64*mib {
		t.Fatalf("RSS grew %d MiB", (after-before)/mib)
	}
	if _, err := healthpb.NewHealthClient(conn).Check(withTimeout(t, 5*time.Second), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
}

// TestRapidResetCPU floods the node with HEADERS + RST_STREAM on 4
// connections (50,000 pairs each, 10 s at most) and reports its CPU use;
// the node must answer a call within 2 s once the flood ends. (The bound
// on handlers running at once is TestRapidResetBounded in
// internal/server.)
func TestRapidResetCPU(t *testing.T) {
	s, conn := single(t)
	pid := s.cmd.Process.Pid
	cpu0, start := procCPU(t, pid), time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	total, goaway := 0, 0
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := h2flood.Dial(s.grpcAddr)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			n, _ := c.RapidReset(pb.TokenService_AcquireToken_FullMethodName, 50000, time.Now().Add(10*time.Second))
			c.Sync(30 * time.Second) // the node has read the whole flood
			mu.Lock()
			total += n
			if c.GoAway.Load() {
				goaway++
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	wall, cpu := time.Since(start), procCPU(t, pid)-cpu0
	t.Logf("FIGURE rapid-reset: %d pairs in %v: node CPU %v (%.2f cores), %d of 4 connections sent GOAWAY", total, wall.Round(time.Millisecond), cpu, cpu.Seconds()/wall.Seconds(), goaway)
	if _, err := pb.NewTokenServiceClient(conn).GetClusterView(withTimeout(t, 2*time.Second), &pb.GetClusterViewRequest{}); err != nil {
		t.Fatalf("after the flood: %v", err)
	}
}

// TestMemoryLimitFromBudget floods a node of --max-bucket-memory 64MiB
// with distinct keys (batches of 1,000, until nearly every
// new key is RESOURCE_EXHAUSTED, 90 s at most) and checks that its peak
// RSS stays within 1.25 × budget + 64 MiB: without GOMEMLIMIT the node
// derives a soft memory limit from the budget.
func TestMemoryLimitFromBudget(t *testing.T) {
	// 64 MiB fills in about 10 s on 2 shared cores; 128 MiB (figure: 204
	// MiB peak, bound 224) takes 20 to over 90 s there, too slow to pin.
	for _, budget := range []int64{64 * mib} {
		t.Run(fmt.Sprintf("%dMiB", budget/mib), func(t *testing.T) { memoryFlood(t, budget) })
	}
}

func memoryFlood(t *testing.T, budget int64) {
	s, conn := single(t, "--max-bucket-memory", fmt.Sprintf("%dMiB", budget/mib))
	admin, token := pb.NewAdminServiceClient(conn), pb.NewTokenServiceClient(conn)
	for i := range 4 {
		// 100 a day: an acquired key's bucket stays (it is not back at
		// its initial state for 14 minutes), so the flood fills the budget.
		r := &pb.Rule{Name: fmt.Sprintf("r%d", i), Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 100, Period: durationpb.New(24 * time.Hour)}
		if _, err := admin.PutRule(withTimeout(t, 10*time.Second), &pb.PutRuleRequest{Rule: r}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(90 * time.Second)
	keys, full := 0, 0
	for time.Now().Before(deadline) && full < 5 {
		req := &pb.AcquireTokensRequest{}
		for i := range 1000 {
			req.Requests = append(req.Requests, &pb.AcquireTokenRequest{Rule: fmt.Sprintf("r%d", i%4), Key: fmt.Sprintf("flood-key-%012d", keys)})
			keys++
		}
		resp, err := token.AcquireTokens(withTimeout(t, 10*time.Second), req)
		if err != nil {
			t.Fatal(err)
		}
		exhausted := 0
		for _, r := range resp.GetResults() {
			if codes.Code(r.GetStatus().GetCode()) == codes.ResourceExhausted {
				exhausted++
			}
		}
		if exhausted > 900 {
			full++
		}
	}
	rss, hwm := procMem(t, s.cmd.Process.Pid)
	bound := budget + budget/4 + 64*mib
	t.Logf("FIGURE memory-limit: %d keys sent, budget %d MiB: RSS %d MiB, peak %d MiB (bound %d MiB)", keys, budget/mib, rss/mib, hwm/mib, bound/mib)
	if full < 5 {
		t.Fatalf("the budget was not reached in 90 s (%d keys)", keys)
	}
	if hwm > bound {
		t.Fatalf("peak RSS %d MiB > 1.25 × budget + 64 MiB = %d MiB", hwm/mib, bound/mib)
	}
}

// TestIdleConnectionsCapped: 300 idle TCP connections from one address
// to a node of --max-conns-per-ip 100: the ones past the cap are closed
// at once, the others when --connection-timeout (1 s) passes without an
// HTTP/2 preface, and the node serves a real client from that address
// again once they are gone (from other addresses it serves throughout).
func TestIdleConnectionsCapped(t *testing.T) {
	s, conn := single(t, "--max-conns-per-ip", "100", "--connection-timeout", "1s")
	var conns []net.Conn
	for range 300 {
		c, err := net.DialTimeout("tcp", s.grpcAddr, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	start := time.Now()
	closedBy := func(c net.Conn, d time.Duration) bool {
		c.SetReadDeadline(start.Add(d))
		_, err := io.Copy(io.Discard, c)
		return err == nil // EOF: the node closed it
	}
	early := 0
	for _, c := range conns[100:] {
		if closedBy(c, 500*time.Millisecond) {
			early++
		}
	}
	late := 0
	for _, c := range conns[:100] {
		if closedBy(c, 5*time.Second) {
			late++
		}
	}
	t.Logf("FIGURE idle-conns: of 300, %d past the cap closed at accept, %d closed by the connection timeout after %v", early, late, time.Since(start).Round(time.Millisecond))
	if early < 190 || late < 100 {
		t.Fatalf("%d of 200 past the cap closed at once, %d of 100 within the connection timeout", early, late)
	}
	if _, err := pb.NewTokenServiceClient(conn).GetClusterView(withTimeout(t, 10*time.Second), &pb.GetClusterViewRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("after the idle connections: %v", err)
	}
}
