package raftfsm

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"

	"github.com/tokenserver/tokenserver/internal/tlsutil"
)

// peerPKI writes a CA and a node certificate and returns a Reloader over
// them, the CA, and the node's key pair.
func peerPKI(t *testing.T, name string) (*tlsutil.Reloader, *tlsutil.CA) {
	t.Helper()
	ca, err := tlsutil.NewCA(name, 0)
	if err != nil {
		t.Fatal(err)
	}
	node, err := ca.Issue(tlsutil.CertRequest{CommonName: name + "-n1", URIs: []*url.URL{tlsutil.NodeURI("n1")}, Server: true, Client: true})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := node.WriteFiles(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), ca.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	r, err := tlsutil.New(tlsutil.Files{CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key"), ClientCAFile: filepath.Join(dir, "ca.crt")}, tlsutil.Options{Interval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r, ca
}

func peerTLS(t *testing.T, r *tlsutil.Reloader) (server, client *tls.Config) {
	t.Helper()
	server, err := r.PeerServerConfig()
	if err != nil {
		t.Fatal(err)
	}
	client, err = r.PeerClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	return server, client
}

func startLayer(t *testing.T, o streamOptions) *streamLayer {
	t.Helper()
	o.Bind = "127.0.0.1:0"
	if o.Probe == nil {
		o.Probe = func() probeInfo { return probeInfo{ID: "n1"} }
	}
	s, err := newStreamLayerWith(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// accept returns the next accepted connection, or nil after wait.
func accept(s *streamLayer, wait time.Duration) net.Conn {
	select {
	case c := <-s.conns:
		return c
	case <-time.After(wait):
		return nil
	}
}

// sendMarker writes a marker on a dialed Raft connection, and readMarker
// reads it on the accepted side: the accepted connection is that dialer's.
func sendMarker(t *testing.T, c net.Conn, m string) {
	t.Helper()
	if _, err := c.Write([]byte(m)); err != nil {
		t.Fatal(err)
	}
}

func readMarker(t *testing.T, c net.Conn) string {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil {
		t.Fatal(err)
	}
	return string(buf)
}

// TestStreamTLSRefusesStrangers: plaintext, no certificate, a client
// certificate of the peer CA without a node id and a foreign node
// certificate never reach Accept, and the bytes they send are never read;
// a peer's connection then is the first one accepted.
func TestStreamTLSRefusesStrangers(t *testing.T) {
	r, ca := peerPKI(t, "peers")
	_, foreignCA := peerPKI(t, "foreign")
	srvTLS, cliTLS := peerTLS(t, r)
	s := startLayer(t, streamOptions{ServerTLS: srvTLS, ClientTLS: cliTLS})
	addr := s.ln.Addr().String()

	client, err := ca.Issue(tlsutil.CertRequest{CommonName: "alice", URIs: []*url.URL{tlsutil.ClientURI("alice")}, Client: true})
	if err != nil {
		t.Fatal(err)
	}
	clientPair, _ := client.TLSCertificate()
	alien, err := foreignCA.Issue(tlsutil.CertRequest{CommonName: "alien", URIs: []*url.URL{tlsutil.NodeURI("n1")}, Server: true, Client: true})
	if err != nil {
		t.Fatal(err)
	}
	alienPair, _ := alien.TLSCertificate()
	// It trusts any server: only the layer's check of its certificate
	// stands in its way.
	foreignCli := &tls.Config{InsecureSkipVerify: true, GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &alienPair, nil }}
	anyServer := &tls.Config{InsecureSkipVerify: true}
	withClientCert := &tls.Config{InsecureSkipVerify: true, GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &clientPair, nil }}

	tlsDial := func(cfg *tls.Config) func() error {
		return func() error {
			c, err := dialTLS(nil2raw, cfg, addr, 2*time.Second)
			if err != nil {
				return err
			}
			defer c.Close()
			// The server may fail the handshake after our side finished
			// (TLS 1.3): the first read tells.
			_, _ = c.Write([]byte{connRaft, 'e', 'v', 'i', 'l'})
			_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
			_, err = c.Read(make([]byte, 1))
			return err
		}
	}
	tests := []struct {
		name string
		try  func() error
	}{
		{"plaintext", func() error {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				return err
			}
			defer c.Close()
			_, _ = c.Write([]byte{connRaft, 'e', 'v', 'i', 'l'})
			_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
			_, err = c.Read(make([]byte, 1))
			return err
		}},
		{"no certificate", tlsDial(anyServer)},
		{"client certificate of the peer CA", tlsDial(withClientCert)},
		{"foreign node certificate", tlsDial(foreignCli)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.try(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
				t.Errorf("the layer neither refused nor closed the connection: %v", err)
			}
		})
	}
	c, err := s.Dial(raftAddr(s), 2*time.Second)
	if err != nil {
		t.Fatalf("peer dial: %v", err)
	}
	defer c.Close()
	sendMarker(t, c, "peer")
	got := accept(s, 5*time.Second)
	if got == nil {
		t.Fatal("the peer's connection was not accepted")
	}
	defer got.Close()
	if m := readMarker(t, got); m != "peer" {
		t.Fatalf("the first accepted connection carried %q, want the peer's (a stranger got through)", m)
	}
	if _, ok := got.(*trackedConn).Conn.(*tls.Conn); !ok {
		t.Error("the accepted connection is not TLS")
	}

	// Probes go over mutual TLS too.
	if info, err := probe(s.dial, addr, 2*time.Second); err != nil || info.ID != "n1" {
		t.Errorf("TLS probe: %+v, %v", info, err)
	}
	plain := func(a string, d time.Duration) (net.Conn, error) { return net.DialTimeout("tcp", a, d) }
	if _, err := probe(plain, addr, time.Second); err == nil {
		t.Error("a plaintext probe was answered")
	}
}

// nil2raw dials plain TCP (dialTLS's raw dialer in the tests).
func nil2raw(address string, timeout time.Duration) (net.Conn, error) {
	return net.DialTimeout("tcp", address, timeout)
}

func raftAddr(s *streamLayer) raft.ServerAddress { return raft.ServerAddress(s.ln.Addr().String()) }

// TestStreamPerHostCap: past MaxConnsPerHost connections from one IP, new
// ones are closed at once, handshaking ones included; a slot frees when a
// connection closes.
func TestStreamPerHostCap(t *testing.T) {
	t.Run("plaintext", func(t *testing.T) {
		s := startLayer(t, streamOptions{MaxConnsPerHost: 3})
		var open []net.Conn
		for i := range 3 {
			c, err := s.Dial(raftAddr(s), time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			sendMarker(t, c, "ok-"+string(rune('0'+i)))
			a := accept(s, 5*time.Second)
			if a == nil {
				t.Fatalf("connection %d not accepted under the cap", i)
			}
			open = append(open, a)
		}
		extra, err := s.Dial(raftAddr(s), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer extra.Close()
		_ = extra.SetReadDeadline(time.Now().Add(2 * time.Second))
		if _, err := extra.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !isReset(err) {
			t.Errorf("the connection past the cap: read %v, want EOF", err)
		}
		if a := accept(s, 100*time.Millisecond); a != nil {
			t.Fatal("a connection past the cap was accepted")
		}
		open[0].Close()
		c, err := s.Dial(raftAddr(s), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		sendMarker(t, c, "late")
		a := accept(s, 5*time.Second)
		if a == nil || readMarker(t, a) != "late" {
			t.Fatal("a freed slot was not reused")
		}
		a.Close()
		for _, c := range open[1:] {
			c.Close()
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.total != 0 || len(s.perHost) != 0 || s.refused != 1 {
			t.Errorf("after closing all: total %d, hosts %v, refused %d; want 0, none, 1", s.total, s.perHost, s.refused)
		}
	})
	t.Run("handshaking connections count", func(t *testing.T) {
		r, _ := peerPKI(t, "peers")
		srvTLS, cliTLS := peerTLS(t, r)
		s := startLayer(t, streamOptions{ServerTLS: srvTLS, ClientTLS: cliTLS, MaxConnsPerHost: 2})
		for range 2 { // silent dialers hold their slots until the handshake timeout
			c, err := net.Dial("tcp", s.ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			s.mu.Lock()
			n := s.total
			s.mu.Unlock()
			if n == 2 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d connections counted, want 2", n)
			}
			time.Sleep(time.Millisecond)
		}
		// One attempt (Dial itself waits for a slot up to redialFor).
		if _, err := s.dial(string(raftAddr(s)), time.Second); err == nil {
			t.Error("a peer got a third slot")
		}
	})
}

func isReset(err error) bool {
	var ne *net.OpError
	return errors.As(err, &ne)
}

// TestStreamIdleAndHandshakeTimeouts: an accepted Raft connection without
// traffic ends (as EOF, which raft does not log as an error) after
// IdleTimeout and frees its slot, one with traffic lives on, and a dialer
// that never says anything is dropped after HandshakeTimeout.
func TestStreamIdleAndHandshakeTimeouts(t *testing.T) {
	const idle = 400 * time.Millisecond
	s := startLayer(t, streamOptions{IdleTimeout: idle, HandshakeTimeout: 200 * time.Millisecond, MaxConnsPerHost: 2})
	busyD, err := s.Dial(raftAddr(s), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer busyD.Close()
	sendMarker(t, busyD, "busy")
	busy := accept(s, 5*time.Second)
	if busy == nil || readMarker(t, busy) != "busy" {
		t.Fatal("busy connection not accepted")
	}
	idleD, err := s.Dial(raftAddr(s), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer idleD.Close()
	sendMarker(t, idleD, "idle")
	idleC := accept(s, 5*time.Second)
	if idleC == nil || readMarker(t, idleC) != "idle" {
		t.Fatal("idle connection not accepted")
	}
	// The busy one talks every idle/8 for 1.5 idle periods.
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 1)
		for range 12 {
			time.Sleep(idle / 8)
			if _, err := busyD.Write([]byte{'x'}); err != nil {
				done <- err
				return
			}
			if _, err := busy.Read(buf); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	start := time.Now()
	_ = idleC.SetDeadline(time.Time{})
	if _, err := idleC.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("idle read: %v, want EOF", err)
	}
	if el := time.Since(start); el < idle*3/4 || el > 10*idle {
		t.Errorf("idle connection ended after %v, want about %v", el, idle)
	}
	idleC.Close()
	if err := <-done; err != nil {
		t.Errorf("a busy connection broke: %v", err)
	}

	// A silent dialer is dropped after the handshake timeout and never
	// reaches Accept.
	silent, err := net.Dial("tcp", s.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	_ = silent.SetReadDeadline(time.Now().Add(3 * time.Second))
	start = time.Now()
	if _, err := silent.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("silent dialer: %v, want EOF", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("silent dialer dropped after %v", el)
	}
	if a := accept(s, 50*time.Millisecond); a != nil {
		t.Error("a silent dialer was accepted")
	}
}

func TestStreamOptions(t *testing.T) {
	r, _ := peerPKI(t, "peers")
	srvTLS, _ := peerTLS(t, r)
	if _, err := newStreamLayerWith(streamOptions{Bind: "127.0.0.1:0", ServerTLS: srvTLS}); err == nil {
		t.Error("a server TLS config without a client one was accepted")
	}
	s := startLayer(t, streamOptions{})
	if s.o.MaxConnsPerHost != defaultMaxConnsPerHost || s.o.IdleTimeout != defaultIdleTimeout || s.o.HandshakeTimeout != defaultHandshakeTimeout {
		t.Errorf("defaults: %+v", s.o)
	}
}

// TestStreamRogueRaftRPC: over raft's own transport, an AppendEntries with
// a higher term and a RequestVote from a dialer without a peer certificate
// (plaintext, or a node certificate of another CA) never reach the node's
// raft (its consumer sees nothing), while a peer's do.
func TestStreamRogueRaftRPC(t *testing.T) {
	r, _ := peerPKI(t, "peers")
	foreign, _ := peerPKI(t, "foreign")
	srvTLS, cliTLS := peerTLS(t, r)
	fSrv, fCli := peerTLS(t, foreign)
	victim := startLayer(t, streamOptions{ServerTLS: srvTLS, ClientTLS: cliTLS})
	vt := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{Stream: victim, MaxPool: 1, Timeout: 2 * time.Second})
	defer vt.Close()
	target := raft.ServerAddress(victim.ln.Addr().String())

	transport := func(o streamOptions) *raft.NetworkTransport {
		s := startLayer(t, o)
		tr := raft.NewNetworkTransportWithConfig(&raft.NetworkTransportConfig{Stream: s, MaxPool: 1, Timeout: 2 * time.Second})
		t.Cleanup(func() { tr.Close() })
		return tr
	}
	evil := &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte("evil"), Addr: []byte("evil")}, Term: 1 << 40,
		Entries: []*raft.Log{{Index: 1, Term: 1 << 40, Type: raft.LogCommand, Data: []byte("rule nobody wrote")}}}
	for _, rogue := range []struct {
		name string
		o    streamOptions
	}{
		{"plaintext", streamOptions{}},
		{"foreign CA", streamOptions{ServerTLS: fSrv, ClientTLS: fCli}},
	} {
		t.Run(rogue.name, func(t *testing.T) {
			tr := transport(rogue.o)
			if err := tr.AppendEntries("victim", target, evil, new(raft.AppendEntriesResponse)); err == nil {
				t.Error("AppendEntries went through")
			}
			vote := &raft.RequestVoteRequest{RPCHeader: evil.RPCHeader, Term: 1 << 40, LastLogIndex: 1 << 40, LastLogTerm: 1 << 40}
			if err := tr.RequestVote("victim", target, vote, new(raft.RequestVoteResponse)); err == nil {
				t.Error("RequestVote went through")
			}
			select {
			case rpc := <-vt.Consumer():
				t.Fatalf("a rogue RPC reached raft: %T", rpc.Command)
			case <-time.After(100 * time.Millisecond):
			}
		})
	}
	peer := transport(streamOptions{ServerTLS: srvTLS, ClientTLS: cliTLS})
	go func() {
		rpc := <-vt.Consumer()
		rpc.Respond(&raft.AppendEntriesResponse{Term: 1, Success: true}, nil)
	}()
	var resp raft.AppendEntriesResponse
	if err := peer.AppendEntries("victim", target, &raft.AppendEntriesRequest{RPCHeader: raft.RPCHeader{ID: []byte("n2"), Addr: []byte("n2")}, Term: 1}, &resp); err != nil || !resp.Success {
		t.Errorf("a peer's AppendEntries: %v, %+v", err, resp)
	}
}

// failingListener fails Accept with EMFILE its first n calls, as a process
// out of file descriptors does, then accepts.
type failingListener struct {
	net.Listener
	mu    sync.Mutex
	n     int
	calls int
}

func (l *failingListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	l.calls++
	fail := l.calls <= l.n
	l.mu.Unlock()
	if fail {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}

// TestIssue20Item1_AcceptSurvivesEMFILE checks that accept errors (one
// EMFILE used to end the accept loop, and the Raft port with it) are
// retried: after N failures, the layer accepts Raft connections again.
func TestIssue20Item1_AcceptSurvivesEMFILE(t *testing.T) {
	for _, n := range []int{1, 5} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			fl := &failingListener{Listener: ln, n: n}
			s, err := newStreamLayerWith(streamOptions{Listener: fl, Probe: func() probeInfo { return probeInfo{ID: "n1"} },
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			c, err := s.Dial(raft.ServerAddress(ln.Addr().String()), time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			got := accept(s, 10*time.Second)
			if got == nil {
				t.Fatalf("no raft connection accepted after %d EMFILE errors", n)
			}
			got.Close()
			fl.mu.Lock()
			calls := fl.calls
			fl.mu.Unlock()
			if calls < n+1 {
				t.Fatalf("accept called %d times, want at least %d", calls, n+1)
			}
		})
	}
}

// TestIssue20Item1_CloseEndsAcceptBackoff checks that Close ends an accept
// loop that is backing off (it must not wait out the backoff).
func TestIssue20Item1_CloseEndsAcceptBackoff(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fl := &failingListener{Listener: ln, n: 1 << 30}
	s, err := newStreamLayerWith(streamOptions{Listener: fl, Probe: func() probeInfo { return probeInfo{} },
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("accept loop still running after Close")
	}
}
