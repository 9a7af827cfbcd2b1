//go:build multiprocess

package e2e

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"testing"
)

// Ports for the processes the tests start. A port handed to a child
// process must stay free until the child binds it, which a port the kernel
// picked for 127.0.0.1:0 and released does not: the kernel hands it out
// again as another listener's :0 port or an outgoing connection's source
// port (issue 20, item 24: "address already in use", duplicate ports in a
// cluster). So ports come from below the kernel's ephemeral range, which
// neither ever uses, each at most once per test process, and are checked
// free by binding them.

// portBook is the test process's record of the ports it handed out. It is
// the one package-level variable of the tests: ports are a resource of the
// process, shared by every test in it.
var portBook = struct {
	sync.Mutex
	used map[int]bool
	rng  *rand.Rand
}{used: map[int]bool{}, rng: rand.New(rand.NewPCG(uint64(os.Getpid()), 0x7a11))}

// portFloor is the lowest port handed out; ephemeralLow the kernel's
// ephemeral range's first port (Linux's default when unknown).
const portFloor = 10000

func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	var lo, hi int
	if err == nil {
		if _, err := fmt.Sscan(string(b), &lo, &hi); err == nil && lo > portFloor+1000 {
			return lo
		}
	}
	return 32768
}

// freePort returns a 127.0.0.1 address that no other part of this test
// process was given, outside the ephemeral range, free when checked.
func freePort(t *testing.T) string {
	t.Helper()
	top := ephemeralLow()
	portBook.Lock()
	defer portBook.Unlock()
	for range 1000 {
		p := portFloor + portBook.rng.IntN(top-portFloor)
		if portBook.used[p] {
			continue
		}
		portBook.used[p] = true // never again, taken or not
		addr := fmt.Sprintf("127.0.0.1:%d", p)
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		l.Close()
		return addr
	}
	t.Fatal("no free port below the ephemeral range after 1000 tries")
	return ""
}

// TestIssue20Item24_FreePortsAreDistinct checks that freePort never hands
// out a port twice, nor one of the ephemeral range (where :0 listeners
// and outgoing connections take theirs).
func TestIssue20Item24_FreePortsAreDistinct(t *testing.T) {
	seen := map[string]bool{}
	top := ephemeralLow()
	for range 2000 {
		a := freePort(t)
		if seen[a] {
			t.Fatalf("port %s handed out twice", a)
		}
		seen[a] = true
		_, ps, _ := net.SplitHostPort(a)
		var p int
		fmt.Sscan(ps, &p)
		if p < portFloor || p >= top {
			t.Fatalf("port %d outside [%d, %d)", p, portFloor, top)
		}
	}
}
