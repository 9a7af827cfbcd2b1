package tlsutil

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// pki is a CA with a node and a client certificate, written under dir.
type pki struct {
	ca           *CA
	node, client *KeyPair
	dir          string
}

func newPKI(t *testing.T, name string) *pki {
	t.Helper()
	ca, err := NewCA(name+" CA", 0)
	if err != nil {
		t.Fatal(err)
	}
	node, err := ca.Issue(CertRequest{CommonName: name + "-node", DNSNames: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)},
		URIs: nodeURIs("n1"), Server: true, Client: true})
	if err != nil {
		t.Fatal(err)
	}
	client, err := ca.Issue(CertRequest{CommonName: name + "-client", URIs: clientURIs("alice"), OrganizationalUnits: []string{"editor"}, Client: true})
	if err != nil {
		t.Fatal(err)
	}
	p := &pki{ca: ca, node: node, client: client, dir: t.TempDir()}
	writeFile(t, p.path("ca.crt"), ca.CertPEM)
	if err := node.WriteFiles(p.path("node.crt"), p.path("node.key")); err != nil {
		t.Fatal(err)
	}
	return p
}

func nodeURIs(id string) []*url.URL     { return []*url.URL{NodeURI(id)} }
func clientURIs(name string) []*url.URL { return []*url.URL{ClientURI(name)} }

func (p *pki) path(name string) string { return filepath.Join(p.dir, name) }

// files are p's node files as client-facing and peer files.
func (p *pki) files() Files {
	return Files{CertFile: p.path("node.crt"), KeyFile: p.path("node.key"), ClientCAFile: p.path("ca.crt")}
}

func writeFile(t *testing.T, name string, data []byte) {
	t.Helper()
	if err := os.WriteFile(name, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

func tlsCert(t *testing.T, k *KeyPair) tls.Certificate {
	t.Helper()
	c, err := k.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func newReloader(t *testing.T, f Files) *Reloader {
	t.Helper()
	r, err := New(f, Options{Interval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

// serve accepts TLS connections with cfg; each handshake's error (nil on
// success) goes to the returned channel, and a successful connection echoes.
func serve(t *testing.T, cfg *tls.Config) (string, <-chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	errs := make(chan error, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				tc := tls.Server(c, cfg)
				_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
				err := tc.Handshake()
				errs <- err
				if err == nil {
					_ = tc.SetDeadline(time.Time{})
					_, _ = io.Copy(tc, tc)
				}
			}()
		}
	}()
	return ln.Addr().String(), errs
}

// dial handshakes with cfg and checks an echo.
func dial(addr string, cfg *tls.Config) (*tls.Conn, error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	if err := echo(c); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func echo(c *tls.Conn) error {
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		return err
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != "ping" {
		return errors.New("bad echo " + string(buf))
	}
	return nil
}

func clientConfig(p *pki, cert *KeyPair) *tls.Config {
	roots := x509.NewCertPool()
	roots.AddCert(p.ca.Cert)
	c := &tls.Config{RootCAs: roots, ServerName: "localhost"}
	if cert != nil {
		// Offer it whatever CAs the server names (Go's Certificates would
		// stay silent for a foreign CA).
		pair, _ := cert.TLSCertificate()
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &pair, nil }
	}
	return c
}

func TestServerClientAuth(t *testing.T) {
	p := newPKI(t, "main")
	foreign := newPKI(t, "foreign")
	r := newReloader(t, p.files())
	tests := []struct {
		mode   ClientAuth
		cert   *KeyPair // offered by the client
		wantOK bool
	}{
		{ClientAuthNone, nil, true},
		{ClientAuthNone, p.node, true},         // a peer proves itself
		{ClientAuthNone, foreign.client, true}, // not asked for, so never sent (issue 20 item 10; see TestClientAuthNoneIgnoresCerts)
		{ClientAuthRequest, nil, true},
		{ClientAuthRequest, p.client, true},
		{ClientAuthRequest, foreign.client, false},
		{ClientAuthRequire, nil, false},
		{ClientAuthRequire, p.client, true},
		{ClientAuthRequire, p.node, true},
		{ClientAuthRequire, foreign.client, false},
		{ClientAuthRequire, foreign.node, false},
	}
	for _, tt := range tests {
		name := tt.mode.String() + "/none"
		if tt.cert != nil {
			name = tt.mode.String() + "/" + tt.cert.Cert.Subject.CommonName
		}
		t.Run(name, func(t *testing.T) {
			cfg, err := r.ServerConfig(tt.mode)
			if err != nil {
				t.Fatal(err)
			}
			addr, _ := serve(t, cfg)
			c, err := dial(addr, clientConfig(p, tt.cert))
			if (err == nil) != tt.wantOK {
				t.Fatalf("handshake error %v, want ok=%v", err, tt.wantOK)
			}
			if err != nil {
				return
			}
			defer c.Close()
			if c.ConnectionState().NegotiatedProtocol != "" {
				t.Errorf("ALPN %q without a client offer", c.ConnectionState().NegotiatedProtocol)
			}
		})
	}
}

func TestServerRefusesPlaintextAndOldTLS(t *testing.T) {
	p := newPKI(t, "main")
	r := newReloader(t, p.files())
	cfg, err := r.ServerConfig(ClientAuthNone)
	if err != nil {
		t.Fatal(err)
	}
	addr, errs := serve(t, cfg)

	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = c.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
	if err := <-errs; err == nil {
		t.Error("a plaintext client completed a handshake")
	}

	old := clientConfig(p, nil)
	old.MaxVersion = tls.VersionTLS11
	if _, err := dial(addr, old); err == nil {
		t.Error("a TLS 1.1 client was served")
	}
	<-errs
	cl := clientConfig(p, nil)
	cl.NextProtos = []string{"h2"}
	tc, err := dial(addr, cl)
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	if got := tc.ConnectionState().NegotiatedProtocol; got != "h2" {
		t.Errorf("ALPN %q, want h2 (gRPC needs it)", got)
	}
}

func TestServerConfigErrors(t *testing.T) {
	p := newPKI(t, "main")
	tests := []struct {
		name  string
		files Files
		mode  ClientAuth
		want  string
	}{
		{"no cert", Files{ClientCAFile: p.path("ca.crt")}, ClientAuthNone, "no server certificate"},
		{"require without CA", Files{CertFile: p.path("node.crt"), KeyFile: p.path("node.key")}, ClientAuthRequire, "needs --tls-client-ca"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newReloader(t, tt.files)
			if _, err := r.ServerConfig(tt.mode); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v, want %q", err, tt.want)
			}
		})
	}
	if _, err := New(Files{CertFile: p.path("node.crt")}, Options{Interval: -1}); err == nil {
		t.Error("a cert without a key was accepted")
	}
	if _, err := New(Files{CertFile: p.path("node.crt"), KeyFile: p.path("missing.key")}, Options{Interval: -1}); err == nil {
		t.Error("a missing key file was accepted")
	}
}

func TestParseClientAuth(t *testing.T) {
	for _, s := range []string{"none", "request", "require"} {
		a, err := ParseClientAuth(s)
		if err != nil || a.String() != s {
			t.Errorf("ParseClientAuth(%q) = %v, %v", s, a, err)
		}
	}
	if _, err := ParseClientAuth("verify"); err == nil {
		t.Error("ParseClientAuth accepted verify")
	}
}

// TestRotation swaps the files the way a Kubernetes Secret volume does (a
// ..data symlink to a new timestamped directory) and checks that the poller
// picks them up, new connections see the new certificate and a live
// connection keeps going.
func TestRotation(t *testing.T) {
	p := newPKI(t, "main")
	dir := t.TempDir()
	install := func(version string, kp *KeyPair) {
		t.Helper()
		ts := filepath.Join(dir, "..ts-"+version)
		if err := os.Mkdir(ts, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := kp.WriteFiles(filepath.Join(ts, "tls.crt"), filepath.Join(ts, "tls.key")); err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(ts, "ca.crt"), p.ca.CertPEM)
		tmp := filepath.Join(dir, "..data_tmp")
		if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	install("1", p.node)
	for _, f := range []string{"tls.crt", "tls.key", "ca.crt"} {
		if err := os.Symlink(filepath.Join("..data", f), filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	r, err := New(Files{CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key"), ClientCAFile: filepath.Join(dir, "ca.crt")},
		Options{Interval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cfg, err := r.ServerConfig(ClientAuthRequest)
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := serve(t, cfg)
	live, err := dial(addr, clientConfig(p, p.client))
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	serial := func(c *tls.Conn) string { return c.ConnectionState().PeerCertificates[0].SerialNumber.String() }
	before := serial(live)

	next, err := p.ca.Issue(CertRequest{CommonName: "main-node-2", DNSNames: []string{"localhost"}, URIs: nodeURIs("n1"), Server: true, Client: true})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	install("2", next)
	for r.Generation() < 2 {
		if time.Since(start) > 5*time.Second {
			t.Fatal("the reloader did not see the swapped files")
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("new certificate served %v after the swap", time.Since(start).Round(time.Millisecond))
	c, err := dial(addr, clientConfig(p, p.client))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := serial(c); got != next.Cert.SerialNumber.String() {
		t.Errorf("new connection sees serial %s, want the rotated %s", got, next.Cert.SerialNumber)
	}
	if err := echo(live); err != nil {
		t.Errorf("the live connection broke at rotation: %v", err)
	}
	if serial(live) != before {
		t.Error("the live connection's certificate changed")
	}
}

// TestReloadKeepsOldOnBadFiles: a key that does not match the certificate
// (caught between two writes) leaves the old pair in use.
func TestReloadKeepsOldOnBadFiles(t *testing.T) {
	p := newPKI(t, "main")
	r := newReloader(t, p.files())
	other, err := p.ca.Issue(CertRequest{CommonName: "other", Server: true})
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, p.path("node.crt"), other.CertPEM) // key not yet written
	if err := r.Reload(); err == nil {
		t.Fatal("a mismatched pair loaded")
	}
	if err := r.Reload(); err != nil {
		t.Errorf("the same bad content was reported twice: %v", err)
	}
	if g := r.Generation(); g != 1 {
		t.Errorf("generation %d after a failed reload, want 1", g)
	}
	if got := r.cur.Load().cert.Leaf.Subject.CommonName; got != "main-node" {
		t.Errorf("serving %q after a failed reload, want the old main-node", got)
	}
	writeFile(t, p.path("node.key"), other.KeyPEM)
	if err := r.Reload(); err != nil {
		t.Fatal(err)
	}
	if got := r.cur.Load().cert.Leaf.Subject.CommonName; got != "other" {
		t.Errorf("serving %q, want other", got)
	}
}

func TestPeerID(t *testing.T) {
	shared := newPKI(t, "shared")
	peersOnly := newPKI(t, "peers")
	foreign := newPKI(t, "foreign")
	noURI, err := peersOnly.ca.Issue(CertRequest{CommonName: "bare", Server: true, Client: true})
	if err != nil {
		t.Fatal(err)
	}
	clientCA := newPKI(t, "clients")
	writeFile(t, clientCA.path("peer-ca.crt"), peersOnly.ca.CertPEM)
	tests := []struct {
		name   string
		files  Files
		cert   *KeyPair
		wantID string
		wantOK bool
	}{
		{"shared CA, node cert", shared.files(), shared.node, "n1", true},
		{"shared CA, client cert", shared.files(), shared.client, "", false},
		{"peer-only CA, cert without URI", Files{CertFile: clientCA.path("node.crt"), KeyFile: clientCA.path("node.key"), ClientCAFile: clientCA.path("ca.crt"), PeerCAFile: clientCA.path("peer-ca.crt")}, noURI, "", true},
		{"peer-only CA, client CA's node cert", Files{CertFile: clientCA.path("node.crt"), KeyFile: clientCA.path("node.key"), ClientCAFile: clientCA.path("ca.crt"), PeerCAFile: clientCA.path("peer-ca.crt")}, clientCA.node, "", false},
		{"foreign", shared.files(), foreign.node, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newReloader(t, tt.files)
			m := r.cur.Load()
			chains, _ := tt.cert.Cert.Verify(x509.VerifyOptions{Roots: m.clientPool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
			id, ok := r.PeerID(&tls.ConnectionState{VerifiedChains: chains})
			if id != tt.wantID || ok != tt.wantOK {
				t.Errorf("PeerID = %q, %v; want %q, %v", id, ok, tt.wantID, tt.wantOK)
			}
		})
	}
}

// TestPeerConfigs: the Raft listener's and dialer's configs accept node
// certificates of the peer CA only, both ways.
func TestPeerConfigs(t *testing.T) {
	p := newPKI(t, "main")
	foreign := newPKI(t, "foreign")
	r := newReloader(t, p.files())
	srv, err := r.PeerServerConfig()
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := serve(t, srv)
	cli, err := r.PeerClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	if c, err := dial(addr, cli); err != nil {
		t.Errorf("peer to peer: %v", err)
	} else {
		c.Close()
	}
	refused := []struct {
		name string
		cert *KeyPair
	}{
		{"no certificate", nil},
		{"client certificate of the same CA", p.client},
		{"foreign node certificate", foreign.node},
	}
	for _, tt := range refused {
		t.Run(tt.name, func(t *testing.T) {
			if c, err := dial(addr, clientConfig(p, tt.cert)); err == nil {
				c.Close()
				t.Error("served")
			}
		})
	}
	t.Run("dialer refuses a foreign server", func(t *testing.T) {
		fr := newReloader(t, foreign.files())
		fsrv, _ := fr.PeerServerConfig()
		faddr, _ := serve(t, fsrv)
		if c, err := dial(faddr, cli); err == nil {
			c.Close()
			t.Error("the dialer accepted a foreign peer")
		}
	})
	t.Run("client-facing port serves the peer certificate to peers", func(t *testing.T) {
		// Client-facing certificate from another CA; peers still verify.
		other := newPKI(t, "public")
		f := p.files()
		f.CertFile, f.KeyFile = other.path("node.crt"), other.path("node.key")
		f.PeerCertFile, f.PeerKeyFile = p.path("node.crt"), p.path("node.key")
		f.PeerCAFile = p.path("ca.crt")
		f.ClientCAFile = ""
		mr := newReloader(t, f)
		cfg, err := mr.ServerConfig(ClientAuthNone)
		if err != nil {
			t.Fatal(err)
		}
		maddr, _ := serve(t, cfg)
		pc, err := mr.PeerClientConfig()
		if err != nil {
			t.Fatal(err)
		}
		c, err := dial(maddr, pc)
		if err != nil {
			t.Fatalf("peer dial to the client-facing port: %v", err)
		}
		c.Close()
		pc2 := clientConfig(other, nil)
		c, err = dial(maddr, pc2)
		if err != nil {
			t.Fatalf("client dial: %v", err)
		}
		if got := c.ConnectionState().PeerCertificates[0].Subject.CommonName; got != "public-node" {
			t.Errorf("a client got %q, want the client-facing public-node", got)
		}
		c.Close()
	})
}

func TestCertGen(t *testing.T) {
	p := newPKI(t, "main")
	if !HasNodeID(p.node.Cert, "n1") || HasNodeID(p.client.Cert, "n1") {
		t.Error("HasNodeID")
	}
	if ids := NodeIDs(p.node.Cert); len(ids) != 1 || ids[0] != "n1" {
		t.Errorf("NodeIDs = %v", ids)
	}
	if p.node.Cert.PublicKeyAlgorithm != x509.ECDSA || p.ca.Cert.MaxPathLen != 0 || !p.ca.Cert.IsCA {
		t.Error("key or CA constraints")
	}
	writeFile(t, p.path("ca.key"), p.ca.KeyPEM)
	ca, err := LoadCA(p.path("ca.crt"), p.path("ca.key"))
	if err != nil {
		t.Fatal(err)
	}
	if !ca.Cert.Equal(p.ca.Cert) {
		t.Error("LoadCA returned another certificate")
	}
	if _, err := LoadCA(p.path("node.crt"), p.path("node.key")); err == nil {
		t.Error("LoadCA accepted a leaf")
	}
}

// TestHTTPServer: an http.Server serves HTTPS with ServerConfig (the
// --http-tls port), over HTTP/2 and HTTP/1.1.
func TestHTTPServer(t *testing.T) {
	p := newPKI(t, "main")
	r := newReloader(t, p.files())
	cfg, err := r.ServerConfig(ClientAuthNone)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{TLSConfig: cfg, ReadHeaderTimeout: time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, r.Proto) })}
	go srv.ServeTLS(ln, "", "")
	defer srv.Close()
	for _, h2 := range []bool{true, false} {
		tr := &http.Transport{TLSClientConfig: clientConfig(p, nil), ForceAttemptHTTP2: h2}
		if !h2 {
			tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
		}
		resp, err := (&http.Client{Transport: tr, Timeout: 5 * time.Second}).Get("https://" + ln.Addr().String() + "/readyz")
		if err != nil {
			t.Fatalf("h2=%v: %v", h2, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		want := map[bool]string{true: "HTTP/2.0", false: "HTTP/1.1"}[h2]
		if string(body) != want {
			t.Errorf("served over %s, want %s", body, want)
		}
		tr.CloseIdleConnections()
	}
}
