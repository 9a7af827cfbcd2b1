package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc/credentials"
)

// Failing fast. gRPC's waitForReady (rpc.go) waits out --timeout on a
// connection that cannot come up, whatever the reason, and grpc-go does
// not expose why a connection failed. tokenctl records the reasons itself,
// as typed errors, and ends a call at once when the reason cannot go away
// by waiting:
//   - a TLS handshake that fails verification (x509, a fatal TLS alert from
//     the server, a plaintext server): recorded by a wrapper of the
//     transport credentials, which sees gRPC's own handshakes;
//   - a host name that does not exist (DNS NXDOMAIN), and a connection
//     refused for longer than refusedGrace (a node that restarts refuses
//     for a moment): found by one TCP dial of --server, made only while the
//     connection is in TRANSIENT_FAILURE, because a custom gRPC dialer
//     would turn off gRPC's proxy support.
//
// Everything else (timeouts, resets, DNS servers that do not answer) is
// retried until --timeout as before.

// refusedGrace is how long a refused connection is retried before the
// call gives up: long enough for a node to restart.
const refusedGrace = 3 * time.Second

// probeDialTimeout bounds the TCP dial of a probe.
const probeDialTimeout = time.Second

// probeInterval is how often a connection that stays in TRANSIENT_FAILURE
// is probed again.
const probeInterval = 500 * time.Millisecond

// permanentError is a connection failure that waiting will not cure.
type permanentError struct {
	server string
	err    error
	hint   string
}

func (e *permanentError) Error() string {
	msg := fmt.Sprintf("cannot connect to %s: %v", e.server, e.err)
	if e.hint != "" {
		msg += " (" + e.hint + ")"
	}
	return msg + "; not retrying"
}

func (e *permanentError) Unwrap() error { return e.err }

// connProbe records why one client connection fails. Safe for concurrent
// use: gRPC's handshakes and the calls' watchers share it.
type connProbe struct {
	server string
	// now is the clock of the refusal grace (time.Now; tests shift it).
	now func() time.Time
	// dial is the probe's TCP dial (net.Dialer's; tests replace it).
	dial func(ctx context.Context, network, addr string) (net.Conn, error)

	mu           sync.Mutex
	tlsErr       error
	refusedSince time.Time
}

func newConnProbe(server string) *connProbe {
	d := &net.Dialer{Timeout: probeDialTimeout}
	return &connProbe{server: server, now: time.Now, dial: d.DialContext}
}

// permanent returns a *permanentError when the connection's failure cannot
// go away by waiting, else nil. It is called while the connection is in
// TRANSIENT_FAILURE.
func (p *connProbe) permanent(ctx context.Context) error {
	p.mu.Lock()
	tlsErr := p.tlsErr
	p.mu.Unlock()
	if tlsErr != nil {
		return &permanentError{server: p.server, err: tlsErr, hint: tlsHint(tlsErr)}
	}
	addr, ok := tcpTarget(p.server)
	if !ok {
		return nil
	}
	c, err := p.dial(ctx, "tcp", addr)
	if err == nil {
		c.Close()
		p.setRefused(false)
		return nil
	}
	var dnsErr *net.DNSError
	switch {
	case errors.As(err, &dnsErr) && dnsErr.IsNotFound:
		return &permanentError{server: p.server, err: err, hint: "no such host: check --server"}
	case errors.Is(err, syscall.ECONNREFUSED):
		if since := p.setRefused(true); p.now().Sub(since) >= refusedGrace {
			return &permanentError{server: p.server, err: err,
				hint: fmt.Sprintf("refused for %v: is a tokenserver listening there? check --server", p.now().Sub(since).Round(time.Millisecond))}
		}
	}
	return nil
}

// setRefused records whether the last probe was refused and returns since
// when refusals have lasted.
func (p *connProbe) setRefused(refused bool) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case !refused:
		p.refusedSince = time.Time{}
	case p.refusedSince.IsZero():
		p.refusedSince = p.now()
	}
	return p.refusedSince
}

// tcpTarget is the host:port of a gRPC target that names one, for the
// probe: a bare host:port, or dns:/// and passthrough:/// targets. Others
// (unix sockets, custom resolvers) are not probed.
func tcpTarget(target string) (string, bool) {
	for _, scheme := range []string{"dns:///", "passthrough:///"} {
		if rest, ok := strings.CutPrefix(target, scheme); ok {
			target = rest
			break
		}
	}
	if strings.Contains(target, "://") || strings.HasPrefix(target, "unix:") {
		return "", false
	}
	if _, _, err := net.SplitHostPort(target); err != nil {
		return "", false
	}
	return target, true
}

// permanentTLS reports whether a handshake error is one that a retry would
// meet again: verification failures on either side and a peer that does
// not speak TLS.
func permanentTLS(err error) bool {
	var (
		verify    *tls.CertificateVerificationError
		unknownCA x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
		record    tls.RecordHeaderError
		alert     tls.AlertError
	)
	switch {
	case errors.As(err, &verify), errors.As(err, &unknownCA), errors.As(err, &hostname),
		errors.As(err, &invalid), errors.As(err, &record):
		return true
	case errors.As(err, &alert):
		// Alerts a server sends when it refuses our certificate or
		// protocol; they come again on every attempt.
		switch uint8(alert) {
		case 40, 42, 43, 44, 45, 46, 48, 70, 116: // handshake_failure, bad_certificate, unsupported_certificate, certificate_revoked, certificate_expired, certificate_unknown, unknown_ca, protocol_version, certificate_required
			return true
		}
	}
	return false
}

// tlsHint says which flag to look at for a TLS error.
func tlsHint(err error) string {
	var (
		unknownCA x509.UnknownAuthorityError
		hostname  x509.HostnameError
		record    tls.RecordHeaderError
		alert     tls.AlertError
	)
	switch {
	case errors.As(err, &unknownCA):
		return "the server's certificate is not signed by --tls-ca"
	case errors.As(err, &hostname):
		return "the server's certificate does not name this host: check --server or --tls-server-name"
	case errors.As(err, &record):
		return "the server does not speak TLS: drop --tls-ca/--tls-cert, or check --server"
	case errors.As(err, &alert):
		return "the server refused the handshake: check --tls-cert/--tls-key"
	}
	return "check --tls-ca, --tls-cert and --tls-server-name"
}

// recordingCreds is TLS transport credentials that record a permanent
// handshake failure in a connProbe, and forget it after a success.
type recordingCreds struct {
	credentials.TransportCredentials
	probe *connProbe
}

// ClientHandshake runs the TLS handshake and records its outcome.
func (c *recordingCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, raw)
	c.probe.mu.Lock()
	switch {
	case err == nil:
		c.probe.tlsErr = nil
	case permanentTLS(err):
		c.probe.tlsErr = err
	}
	c.probe.mu.Unlock()
	return conn, info, err
}

// Clone keeps the recording.
func (c *recordingCreds) Clone() credentials.TransportCredentials {
	return &recordingCreds{TransportCredentials: c.TransportCredentials.Clone(), probe: c.probe}
}
