package main

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// TestFailFastProbe: the probe's verdicts, step by step on a fake clock: a
// refusal is forgiven for refusedGrace, a missing host and a recorded TLS
// failure are final at once, anything else is retried, and a connection
// that succeeds restarts the grace.
func TestFailFastProbe(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	nxdomain := &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "x.invalid", IsNotFound: true}}
	dnsTimeout := &net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "i/o timeout", Name: "x", IsTimeout: true}}
	type step struct {
		at      time.Duration // since the start
		dialErr error         // nil: the dial succeeds
		tlsErr  error         // recorded before the step
		want    string        // "" for not permanent, else in the error
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"refused within the grace", []step{{0, refused, nil, ""}, {refusedGrace - time.Millisecond, refused, nil, ""}}},
		{"refused past the grace", []step{{0, refused, nil, ""}, {refusedGrace, refused, nil, "connection refused"}}},
		{"a success restarts the grace", []step{{0, refused, nil, ""}, {2 * time.Second, nil, nil, ""}, {refusedGrace, refused, nil, ""}, {2 * refusedGrace, refused, nil, "refused for 3s"}}},
		{"no such host", []step{{0, nxdomain, nil, "no such host: check --server"}}},
		{"DNS timeout is retried", []step{{0, dnsTimeout, nil, ""}, {time.Hour, dnsTimeout, nil, ""}}},
		{"TLS verification", []step{{0, nil, tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}, "does not speak TLS"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Unix(1000, 0)
			now := start
			p := newConnProbe("127.0.0.1:7070")
			p.now = func() time.Time { return now }
			var dialErr error
			p.dial = func(context.Context, string, string) (net.Conn, error) {
				if dialErr != nil {
					return nil, dialErr
				}
				c1, c2 := net.Pipe()
				c2.Close()
				return c1, nil
			}
			for i, s := range tt.steps {
				now, dialErr = start.Add(s.at), s.dialErr
				if s.tlsErr != nil {
					p.tlsErr = s.tlsErr
				}
				err := p.permanent(context.Background())
				var perm *permanentError
				switch {
				case s.want == "" && err != nil:
					t.Fatalf("step %d: %v, want not permanent", i, err)
				case s.want != "" && (!errors.As(err, &perm) || !strings.Contains(err.Error(), s.want)):
					t.Fatalf("step %d: %v, want a permanent error with %q", i, err, s.want)
				}
			}
		})
	}
}

// failsFast runs tokenctl with a long --timeout and wants it to fail with
// Unavailable, "not retrying" and want, well before the timeout.
func failsFast(t *testing.T, within time.Duration, want string, args ...string) {
	t.Helper()
	start := time.Now()
	r := tokenctl(t, "", append([]string{"--timeout", "60s"}, args...)...)
	elapsed := time.Since(start)
	if status.Code(r.err) != codes.Unavailable || !strings.Contains(r.err.Error(), "not retrying") || !strings.Contains(r.err.Error(), want) {
		t.Fatalf("error %v, want Unavailable, not retrying, %q", r.err, want)
	}
	if elapsed > within {
		t.Errorf("failed after %v, want within %v", elapsed, within)
	}
}

// TestFailFastConnectionRefused: a port nobody listens on fails once
// refusals outlast the grace, not after --timeout.
func TestFailFastConnectionRefused(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	failsFast(t, refusedGrace+10*time.Second, "connection refused", "--server", addr, "rule", "get", "api")
}

// TestFailFastUnknownHost: a host name that does not exist fails at once.
func TestFailFastUnknownHost(t *testing.T) {
	t.Parallel()
	const host = "no-such-node.invalid"
	var dnsErr *net.DNSError
	if _, err := net.DefaultResolver.LookupHost(context.Background(), host); !errors.As(err, &dnsErr) || !dnsErr.IsNotFound {
		t.Skipf("this machine's resolver does not answer NXDOMAIN for %s: %v", host, err)
	}
	failsFast(t, 10*time.Second, "no such host", "--server", host+":7070", "rule", "get", "api")
}

// TestFailFastTLSVerification: a server certificate of another CA, a
// certificate that does not name the host, and a plaintext server end the
// call at once, each with the flag to check.
func TestFailFastTLSVerification(t *testing.T) {
	t.Parallel()
	dir, other := t.TempDir(), t.TempDir()
	for _, args := range [][]string{
		{"--out-dir", dir, "create-ca"}, {"--out-dir", dir, "create-node", "n1", "--ip", "127.0.0.1"},
		{"--out-dir", other, "create-ca"},
	} {
		if r := tokenctl(t, "", append([]string{"certs"}, args...)...); r.err != nil {
			t.Fatal(r.err)
		}
	}
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, "n1.crt"), filepath.Join(dir, "n1.key"))
	if err != nil {
		t.Fatal(err)
	}
	tlsAddr := serveAdmin(t, grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{pair}})))
	plainAddr := serveAdmin(t)

	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown authority", []string{"--server", tlsAddr, "--tls-ca", filepath.Join(other, "ca.crt")}, "not signed by --tls-ca"},
		{"host name", []string{"--server", tlsAddr, "--tls-ca", filepath.Join(dir, "ca.crt"), "--tls-server-name", "n1.example"}, "--tls-server-name"},
		{"plaintext server", []string{"--server", plainAddr, "--tls-ca", filepath.Join(dir, "ca.crt")}, "does not speak TLS"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			failsFast(t, 10*time.Second, tt.want, append(tt.args, "rule", "list")...)
		})
	}
	// The same server with the right CA answers: the wrapper records, it
	// does not get in the way.
	if r := tokenctl(t, "", "--server", tlsAddr, "--tls-ca", filepath.Join(dir, "ca.crt"), "--timeout", "10s", "rule", "list"); r.err != nil {
		t.Fatalf("rule list with the right CA: %v", r.err)
	}
}

// serveAdmin serves rulesStub on 127.0.0.1:0 with opts until the test ends.
func serveAdmin(t *testing.T, opts ...grpc.ServerOption) string {
	t.Helper()
	srv := grpc.NewServer(opts...)
	pb.RegisterAdminServiceServer(srv, rulesStub{})
	return serveWith(t, srv)
}

// serveWith serves srv on 127.0.0.1:0 until the test ends.
func serveWith(t *testing.T, srv *grpc.Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}
