// Package netutil makes the dialers and listeners of node-to-node
// connections (Raft and peer gRPC): TCP keepalive and TCP_USER_TIMEOUT, so
// that a peer that vanished silently (a partition, a dropped route) is
// noticed in seconds rather than after TCP's retransmission backoff of
// minutes.
//
// It is hand-written because the standard library sets keepalive but not
// TCP_USER_TIMEOUT, which bounds how long sent data may stay
// unacknowledged; golang.org/x/sys/unix provides the socket option.
package netutil

import (
	"context"
	"fmt"
	"net"
	"syscall"
	"time"
)

// Options are the liveness settings of a node-to-node connection.
type Options struct {
	// UserTimeout is TCP_USER_TIMEOUT: the connection fails when sent data
	// (keepalive probes included) stays unacknowledged this long.
	UserTimeout time.Duration
	// KeepAliveIdle is the idle time before the first keepalive probe,
	// KeepAliveInterval the time between probes and KeepAliveCount the
	// number of unanswered probes that fail the connection.
	KeepAliveIdle     time.Duration
	KeepAliveInterval time.Duration
	KeepAliveCount    int
}

// DefaultOptions notice a silent peer within about 5 s: probes after 2 s
// idle, every second, and 5 s at most for unacknowledged data.
func DefaultOptions() Options {
	return Options{UserTimeout: 5 * time.Second, KeepAliveIdle: 2 * time.Second, KeepAliveInterval: time.Second, KeepAliveCount: 3}
}

func (o Options) keepAlive() net.KeepAliveConfig {
	return net.KeepAliveConfig{Enable: true, Idle: o.KeepAliveIdle, Interval: o.KeepAliveInterval, Count: o.KeepAliveCount}
}

// control sets TCP_USER_TIMEOUT on a socket before it connects or listens
// (a listening socket's value is inherited by the sockets it accepts).
func (o Options) control(_, _ string, rc syscall.RawConn) error {
	if o.UserTimeout <= 0 {
		return nil
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = setUserTimeout(int(fd), o.UserTimeout) }); err != nil {
		return fmt.Errorf("tcp user timeout: %w", err)
	}
	return serr
}

// Dialer returns a dialer of node-to-node connections with timeout as its
// connect timeout (0: none).
func Dialer(o Options, timeout time.Duration) *net.Dialer {
	return &net.Dialer{Timeout: timeout, KeepAliveConfig: o.keepAlive(), Control: o.control}
}

// DialTimeout dials a node-to-node TCP connection to address.
func DialTimeout(o Options, address string, timeout time.Duration) (net.Conn, error) {
	return Dialer(o, timeout).Dial("tcp", address)
}

// ContextDialer is a dialer for grpc.WithContextDialer: peer gRPC
// connections with the same liveness settings as Raft's.
func ContextDialer(o Options) func(ctx context.Context, address string) (net.Conn, error) {
	d := Dialer(o, 0)
	return func(ctx context.Context, address string) (net.Conn, error) {
		return d.DialContext(ctx, "tcp", address)
	}
}

// Listen listens on a TCP address; every connection it accepts has the
// keepalive and user timeout of o.
func Listen(o Options, address string) (net.Listener, error) {
	lc := net.ListenConfig{KeepAliveConfig: o.keepAlive(), Control: o.control}
	ln, err := lc.Listen(context.Background(), "tcp", address)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", address, err)
	}
	return ln, nil
}

// UserTimeout returns a TCP connection's TCP_USER_TIMEOUT.
func UserTimeout(c net.Conn) (time.Duration, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return 0, fmt.Errorf("user timeout: %T is not a socket", c)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0, fmt.Errorf("user timeout: %w", err)
	}
	var d time.Duration
	var gerr error
	if err := rc.Control(func(fd uintptr) { d, gerr = getUserTimeout(int(fd)) }); err != nil {
		return 0, fmt.Errorf("user timeout: %w", err)
	}
	return d, gerr
}
