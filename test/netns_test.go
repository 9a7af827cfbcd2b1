//go:build multiprocess

package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// netLab is a set of network namespaces the test creates: one per node,
// each joined by a veth pair to a router namespace that forwards between
// them. Faults are blackholes in the router: a node cut off loses every
// packet to and from it, silently, as behind a real partition (this kernel
// has no netem and there is no iptables). The test process stays in its
// own namespace and reaches a node from inside the node's namespace
// (dial), so the lab changes nothing outside the namespaces it creates,
// and removes them in t.Cleanup, whatever the test's outcome.
type netLab struct {
	t      *testing.T
	router string
	nodes  []string // namespace of node i
}

// labSeq numbers the labs of one test process (namespace names must be
// unique on the host).
var labSeq atomic.Int64

// newNetLab creates n node namespaces and the router, or skips the test
// saying why it cannot.
func newNetLab(t *testing.T, n int) *netLab {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("network namespaces are Linux's")
	}
	if os.Geteuid() != 0 {
		t.Skip("partition tests create network namespaces: they need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("partition tests need iproute2's ip command: " + err.Error())
	}
	prefix := fmt.Sprintf("tsp%d%d", os.Getpid()%100000, labSeq.Add(1))
	l := &netLab{t: t, router: prefix + "r"}
	t.Cleanup(l.destroy)
	if out, err := exec.Command("ip", "netns", "add", l.router).CombinedOutput(); err != nil {
		t.Skipf("cannot create a network namespace here: %v: %s", err, out)
	}
	l.must("ip", "netns", "exec", l.router, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward")
	for i := range n {
		ns := fmt.Sprintf("%sn%d", prefix, i)
		l.must("ip", "netns", "add", ns)
		l.nodes = append(l.nodes, ns)
		in, out := fmt.Sprintf("%sv%d", prefix, i), fmt.Sprintf("%sp%d", prefix, i)
		l.must("ip", "link", "add", in, "netns", ns, "type", "veth", "peer", "name", out, "netns", l.router)
		l.must("ip", "-n", ns, "link", "set", "lo", "up")
		l.must("ip", "-n", ns, "addr", "add", l.ip(i)+"/24", "dev", in)
		l.must("ip", "-n", ns, "link", "set", in, "up")
		l.must("ip", "-n", l.router, "addr", "add", fmt.Sprintf("10.77.%d.1/24", i), "dev", out)
		l.must("ip", "-n", l.router, "link", "set", out, "up")
		l.must("ip", "-n", ns, "route", "add", "default", "via", fmt.Sprintf("10.77.%d.1", i))
	}
	return l
}

// ip is node i's address.
func (l *netLab) ip(i int) string { return fmt.Sprintf("10.77.%d.2", i) }

func (l *netLab) must(args ...string) {
	l.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput(); err != nil {
		l.t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// destroy deletes the namespaces (their veths go with them).
func (l *netLab) destroy() {
	for _, ns := range append(append([]string(nil), l.nodes...), l.router) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if out, err := exec.CommandContext(ctx, "ip", "netns", "del", ns).CombinedOutput(); err != nil && !strings.Contains(string(out), "No such file") {
			l.t.Logf("delete namespace %s: %v: %s", ns, err, out)
		}
		cancel()
	}
}

// cut drops every packet to and from node i in the router; heal ends it.
func (l *netLab) cut(i int) {
	l.must("ip", "-n", l.router, "route", "add", "blackhole", l.ip(i)+"/32")
	l.must("ip", "-n", l.router, "rule", "add", "from", l.ip(i)+"/32", "blackhole", "priority", "100")
}

func (l *netLab) heal(i int) {
	l.must("ip", "-n", l.router, "route", "del", "blackhole", l.ip(i)+"/32")
	l.must("ip", "-n", l.router, "rule", "del", "from", l.ip(i)+"/32", "blackhole", "priority", "100")
}

// command runs a binary in node i's namespace.
func (l *netLab) command(i int, name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", l.nodes[i], name}, args...)...)
}

// dialer dials from inside node i's namespace: a socket belongs to the
// namespace of the thread that creates it, so the dial runs on a locked
// thread switched into the namespace and back.
func (l *netLab) dialer(i int) func(ctx context.Context, addr string) (net.Conn, error) {
	return func(ctx context.Context, addr string) (net.Conn, error) {
		type result struct {
			c   net.Conn
			err error
		}
		ch := make(chan result, 1)
		go func() {
			runtime.LockOSThread()
			// The thread is unlocked only once it is back in its own
			// namespace; otherwise it ends with the goroutine.
			self, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				ch <- result{err: fmt.Errorf("open own netns: %w", err)}
				return
			}
			defer unix.Close(self)
			target, err := unix.Open("/run/netns/"+l.nodes[i], unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				ch <- result{err: fmt.Errorf("open netns %s: %w", l.nodes[i], err)}
				runtime.UnlockOSThread()
				return
			}
			defer unix.Close(target)
			if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
				ch <- result{err: fmt.Errorf("enter netns %s: %w", l.nodes[i], err)}
				runtime.UnlockOSThread()
				return
			}
			var d net.Dialer
			c, err := d.DialContext(ctx, "tcp", addr)
			if unix.Setns(self, unix.CLONE_NEWNET) == nil {
				runtime.UnlockOSThread()
			}
			ch <- result{c, err}
		}()
		r := <-ch
		return r.c, r.err
	}
}

// httpClient is an HTTP client that dials from node i's namespace.
func (l *netLab) httpClient(i int) *http.Client {
	d := l.dialer(i)
	return &http.Client{Timeout: time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) { return d(ctx, addr) }}}
}
