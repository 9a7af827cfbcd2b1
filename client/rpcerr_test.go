package client

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"errors"
	"io"
	"math/big"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// Each fragment notSent matches is produced here by the pinned grpc-go
// against a real socket, so that a grpc-go release that changes the text
// fails a test instead of silently turning a safe retry into a refusal to
// retry, or a possible double spend into a retry. So are the errors that
// must never count as not sent: a timeout, and a connection that broke
// after the call was written to it.
func TestNotSentFragments(t *testing.T) {
	for _, tc := range []struct {
		name string
		// dial returns the target and the extra dial options of the case.
		dial func(t *testing.T) (string, []grpc.DialOption)
		// fragments are texts the error must hold (any of them).
		fragments []string
		want      bool
	}{
		{"connection refused", dialRefused, []string{"connection refused"}, true},
		{"dial error", dialMissingUnixSocket, []string{"Error while dialing"}, true},
		{"no address", dialNoAddress, []string{"produced zero addresses"}, true},
		{"client preface, reset taken", dialResetBeforeWrite(1, consumeReset), []string{"failed to write client preface", "broken pipe"}, true},
		{"client preface, reset pending", dialResetBeforeWrite(1, waitReset), []string{"failed to write client preface", "connection reset by peer"}, true},
		{"first frames, reset taken", dialResetBeforeWrite(2, consumeReset), []string{"write: broken pipe"}, true},
		{"first frames, reset pending", dialResetBeforeWrite(2, waitReset), []string{"write: connection reset by peer"}, true},
		{"server preface: closed", dialClosedAfterClientPreface, []string{"error reading server preface", "EOF"}, true},
		{"server preface: not HTTP/2", dialHTTP1Server, []string{"error reading server preface", "frame too large"}, true},
		// A plaintext client of a TLS server: the server drops the
		// connection before any preface. Which of the fragments above the
		// client sees depends on timing; each counts.
		{"plaintext client, TLS server", dialTLSServerInClear, []string{
			"error reading server preface", "failed to write client preface", "write: broken pipe", "write: connection reset by peer",
		}, true},
		// A TLS handshake that fails never sent the call either, but it is
		// a configuration error that every member repeats: the fallback
		// policy decides at once rather than after every member failed.
		{"TLS client, plaintext server", dialPlainServerWithTLS, []string{"authentication handshake failed"}, false},
		// The call was written: it may have spent, whatever came next.
		{"reset after the call was sent", dialResetDuringCall, []string{"error reading from server", "connection reset by peer"}, false},
		{"timeout after the call was sent", dialSilentServer, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			target, opts := tc.dial(t)
			conn, err := grpc.NewClient(target, append((&Client{}).dialOptions(), opts...)...)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if tc.fragments == nil { // the timeout case
				ctx, cancel = context.WithTimeout(context.Background(), 200*time.Millisecond)
			}
			defer cancel()
			_, err = pb.NewTokenServiceClient(conn).GetClusterView(ctx, &pb.GetClusterViewRequest{})
			if err == nil {
				t.Fatal("the call succeeded")
			}
			if tc.fragments == nil && status.Code(err) != codes.DeadlineExceeded {
				t.Fatalf("want DeadlineExceeded, got %v", err)
			}
			if len(tc.fragments) > 0 && !containsAny(status.Convert(err).Message(), tc.fragments) {
				t.Fatalf("error %q holds none of %q: did grpc-go change its text?", err, tc.fragments)
			}
			if got := notSent(err); got != tc.want {
				t.Fatalf("notSent(%q) = %v, want %v", err, got, tc.want)
			}
		})
	}
}

// The same rules hold for what a server answers when it could not reach a
// key's owner (it names the owner's error), and for errors that are not
// UNAVAILABLE.
func TestNotSentMessages(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{status.Error(codes.Unavailable, `owner b is unreachable: connection error: desc = "transport: Error while dialing: dial tcp 127.0.0.1:1: connect: connection refused"`), true},
		{status.Error(codes.Unavailable, `owner b is unreachable: write tcp 127.0.0.1:2->127.0.0.1:1: write: broken pipe`), true},
		{status.Error(codes.Unavailable, `owner b is unreachable: connection error: desc = "error reading from server: read tcp 127.0.0.1:2->127.0.0.1:1: read: connection reset by peer"`), false},
		{status.Error(codes.Unavailable, `connection error: desc = "error reading from server: write: broken pipe"`), false},
		{status.Error(codes.Unavailable, "transport is closing"), false},
		{status.Error(codes.DeadlineExceeded, "connection refused"), false},
		{status.Error(codes.Internal, "write: broken pipe"), false},
		{context.DeadlineExceeded, false},
		{errors.New("connection refused"), false},
		{errBreakerOpen, false},
		{nil, false},
	} {
		if got := notSent(tc.err); got != tc.want {
			t.Errorf("notSent(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// dialRefused dials a port nobody listens on.
func dialRefused(t *testing.T) (string, []grpc.DialOption) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return addr, nil
}

// dialMissingUnixSocket dials a unix socket that does not exist: a dial
// error that is not "connection refused".
func dialMissingUnixSocket(t *testing.T) (string, []grpc.DialOption) {
	return "unix://" + t.TempDir() + "/none.sock", nil
}

// dialNoAddress uses a resolver that resolves to no address.
func dialNoAddress(*testing.T) (string, []grpc.DialOption) {
	r := manual.NewBuilderWithScheme("noaddr")
	r.InitialState(resolver.State{})
	return r.Scheme() + ":///nowhere", []grpc.DialOption{grpc.WithResolvers(r)}
}

// serveRaw accepts TCP connections on 127.0.0.1 and hands each to serve
// until the test ends; every connection is closed then.
func serveRaw(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() { defer wg.Done(); serve(c) }()
		}
	}()
	t.Cleanup(func() {
		lis.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return lis.Addr().String()
}

// reset closes c with a TCP reset, as the socket of a killed process.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

// consumeReset reads the peer's reset from c, so that the next write finds
// the socket closed ("broken pipe").
func consumeReset(c *net.TCPConn) error {
	_, err := c.Read(make([]byte, 1))
	if err == nil {
		return errors.New("read data where a reset was expected")
	}
	return nil
}

// dialResetBeforeWrite has the server reset the connection before grpc-go's
// write number nth (1: the client preface; 2: the flush of its first
// frames, after the server read the preface), and settle (taking the reset
// or leaving it pending) before that write runs. grpc-go's reads wait
// until that write returned, so that they do not take the reset first.
func dialResetBeforeWrite(nth int, settle func(*net.TCPConn) error) func(t *testing.T) (string, []grpc.DialOption) {
	return func(t *testing.T) (string, []grpc.DialOption) {
		dialed, resetDone := make(chan struct{}, 8), make(chan struct{}, 8)
		addr := serveRaw(t, func(c net.Conn) {
			select { // a reset before the dial returns would fail the dial
			case <-dialed:
			case <-time.After(5 * time.Second):
				t.Error("the dial did not return")
			}
			if nth > 1 {
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				if _, err := io.ReadFull(c, make([]byte, len(clientPreface))); err != nil {
					t.Errorf("reading the client preface: %v", err)
				}
			}
			reset(c)
			resetDone <- struct{}{}
		})
		dialer := func(ctx context.Context, addr string) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, "tcp", addr)
			if err != nil {
				return nil, err
			}
			dialed <- struct{}{}
			return &orderedConn{TCPConn: c.(*net.TCPConn), gate: make(chan struct{}), before: func(n int, c *net.TCPConn) {
				if n != nth {
					return
				}
				select {
				case <-resetDone:
				case <-time.After(5 * time.Second):
					t.Error("the server did not reset the connection")
					return
				}
				if err := settle(c); errors.Is(err, errors.ErrUnsupported) {
					t.Skip("waiting for a pending reset is only written for Linux")
				} else if err != nil {
					t.Errorf("settling the reset: %v", err)
				}
			}}, nil
		}
		return addr, []grpc.DialOption{grpc.WithContextDialer(dialer)}
	}
}

// clientPreface is HTTP/2's client connection preface.
const clientPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// orderedConn runs before ahead of each write, and holds reads until a
// write failed or the second returned.
type orderedConn struct {
	*net.TCPConn
	before func(n int, c *net.TCPConn)
	writes atomic.Int32
	gate   chan struct{}
	once   sync.Once
}

func (c *orderedConn) Write(p []byte) (int, error) {
	n := int(c.writes.Add(1))
	c.before(n, c.TCPConn)
	w, err := c.TCPConn.Write(p)
	if err != nil || n >= 2 {
		c.once.Do(func() { close(c.gate) })
	}
	return w, err
}

func (c *orderedConn) Read(p []byte) (int, error) {
	<-c.gate
	return c.TCPConn.Read(p)
}

func (c *orderedConn) Close() error {
	c.once.Do(func() { close(c.gate) })
	return c.TCPConn.Close()
}

// dialClosedAfterClientPreface: the server reads the client's preface and
// first frames, then closes cleanly without its own preface.
func dialClosedAfterClientPreface(t *testing.T) (string, []grpc.DialOption) {
	return serveRaw(t, func(c net.Conn) {
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadFull(c, make([]byte, len(clientPreface))); err != nil {
			t.Errorf("reading the client preface: %v", err)
			return
		}
		// Read frames up to the connection's WINDOW_UPDATE, the last one
		// grpc-go sends before it waits for the server's preface: what is
		// left unread would make the close a reset.
		for {
			var h [9]byte
			if _, err := io.ReadFull(c, h[:]); err != nil {
				t.Errorf("reading the client's first frames: %v", err)
				return
			}
			n := int(binary.BigEndian.Uint32(append([]byte{0}, h[:3]...)))
			if _, err := io.ReadFull(c, make([]byte, n)); err != nil {
				t.Errorf("reading a frame: %v", err)
				return
			}
			if h[3] == 0x8 { // WINDOW_UPDATE
				return
			}
		}
	}), nil
}

// dialHTTP1Server: the server answers in HTTP/1.1 and keeps the connection.
func dialHTTP1Server(t *testing.T) (string, []grpc.DialOption) {
	return serveRaw(t, func(c net.Conn) {
		_, _ = c.Write([]byte("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n"))
		_, _ = io.Copy(io.Discard, c) // until the client or the test closes
	}), nil
}

// viewServer is a TokenService whose GetClusterView runs onCall.
type viewServer struct {
	pb.UnimplementedTokenServiceServer
	onCall func(ctx context.Context)
}

func (s *viewServer) GetClusterView(ctx context.Context, _ *pb.GetClusterViewRequest) (*pb.ClusterView, error) {
	s.onCall(ctx)
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	return &pb.ClusterView{}, nil
}

// connListener records the connections it accepts.
type connListener struct {
	net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func (l *connListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns = append(l.conns, c)
		l.mu.Unlock()
	}
	return c, err
}

// serveGRPC serves a viewServer on 127.0.0.1 until the test ends.
func serveGRPC(t *testing.T, onCall func(context.Context, *connListener), opts ...grpc.ServerOption) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &connListener{Listener: lis}
	s := grpc.NewServer(opts...)
	pb.RegisterTokenServiceServer(s, &viewServer{onCall: func(ctx context.Context) { onCall(ctx, cl) }})
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Serve(cl) }()
	t.Cleanup(func() { s.Stop(); <-done })
	return lis.Addr().String()
}

// dialResetDuringCall: the server resets the connection while it handles
// the call.
func dialResetDuringCall(t *testing.T) (string, []grpc.DialOption) {
	return serveGRPC(t, func(ctx context.Context, l *connListener) {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, c := range l.conns {
			reset(c)
		}
	}), nil
}

// dialSilentServer: the server never answers the call.
func dialSilentServer(t *testing.T) (string, []grpc.DialOption) {
	return serveGRPC(t, func(ctx context.Context, _ *connListener) { <-ctx.Done() }), nil
}

// dialTLSServerInClear dials a TLS server without TLS.
func dialTLSServerInClear(t *testing.T) (string, []grpc.DialOption) {
	cfg := &tls.Config{Certificates: []tls.Certificate{selfSigned(t)}}
	return serveGRPC(t, func(context.Context, *connListener) {}, grpc.Creds(credentials.NewTLS(cfg))), nil
}

// dialPlainServerWithTLS dials a plaintext server with TLS.
func dialPlainServerWithTLS(t *testing.T) (string, []grpc.DialOption) {
	addr := serveGRPC(t, func(context.Context, *connListener) {})
	return addr, []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{ServerName: "localhost"}))}
}

// selfSigned is a fresh certificate for 127.0.0.1.
func selfSigned(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
