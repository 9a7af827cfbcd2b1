package server

import (
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// limitListener caps the connections a listener holds at once, in total
// and per remote IP address: a connection past a cap is closed as soon as
// it is accepted, so that idle connections from one host (or many) cannot
// take the process's file descriptors. It also retries temporary accept
// errors (EMFILE, ENFILE) with backoff, as net/http does, instead of
// letting the server's Serve return on them.
//
// It is hand-written because golang.org/x/net/netutil.LimitListener caps
// the total alone, and blocks Accept when full (which leaves the flood in
// the kernel's backlog) rather than refusing; nothing in the standard
// library caps per address.
type limitListener struct {
	net.Listener
	total, perIP int
	// refused counts the connections closed at a cap.
	refused *atomic.Int64
	// onTemporary is told about a temporary accept error (logged).
	onTemporary func(error, time.Duration)

	mu   sync.Mutex
	open int
	byIP map[string]int
}

// newLimitListener wraps l with the caps; refused counts the refusals.
func newLimitListener(l net.Listener, total, perIP int, refused *atomic.Int64, onTemporary func(error, time.Duration)) *limitListener {
	return &limitListener{Listener: l, total: total, perIP: perIP, refused: refused, onTemporary: onTemporary, byIP: map[string]int{}}
}

// Accept returns the next connection within the caps.
func (l *limitListener) Accept() (net.Conn, error) {
	var delay time.Duration
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			var ne interface{ Temporary() bool }
			if errors.As(err, &ne) && ne.Temporary() { //nolint:staticcheck // Temporary is how accept reports EMFILE
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				if l.onTemporary != nil {
					l.onTemporary(err, delay)
				}
				time.Sleep(delay)
				continue
			}
			return nil, err
		}
		delay = 0
		ip := remoteIP(c)
		l.mu.Lock()
		if l.open >= l.total || l.byIP[ip] >= l.perIP {
			l.mu.Unlock()
			l.refused.Add(1)
			c.Close()
			continue
		}
		l.open++
		l.byIP[ip]++
		l.mu.Unlock()
		return &limitedConn{Conn: c, l: l, ip: ip}, nil
	}
}

// release forgets one connection of ip.
func (l *limitListener) release(ip string) {
	l.mu.Lock()
	l.open--
	if l.byIP[ip]--; l.byIP[ip] <= 0 {
		delete(l.byIP, ip)
	}
	l.mu.Unlock()
}

// remoteIP is the IP address of c's remote end (its whole address when
// it has no port).
func remoteIP(c net.Conn) string {
	a := c.RemoteAddr()
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.IP.String()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

// limitedConn is a connection counted by a limitListener until closed.
type limitedConn struct {
	net.Conn
	l    *limitListener
	ip   string
	once sync.Once
}

// Close implements net.Conn.
func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.ip) })
	return err
}
