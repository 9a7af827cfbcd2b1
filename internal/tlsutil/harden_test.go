package tlsutil

// Regression tests of issue 20: client auth none, expiry, the serial deny
// list, peer identity on dial and at start, metrics.

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestClientAuthNoneIgnoresCerts (item 10): in mode none a client is not
// asked for a certificate, so the one it has is neither sent nor used,
// even one of the client CA; only a connection asking for PeerServerName
// is asked, and then only a peer's certificate is accepted.
func TestClientAuthNoneIgnoresCerts(t *testing.T) {
	p := newPKI(t, "main")
	foreign := newPKI(t, "foreign")
	r := newReloader(t, p.files())
	cfg, err := r.ServerConfig(ClientAuthNone)
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := serve(t, cfg)
	asked := false
	cc := clientConfig(p, p.client)
	pair := tlsCert(t, p.client)
	cc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { asked = true; return &pair, nil }
	c, err := dial(addr, cc)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if asked {
		t.Error("mode none asked a client for its certificate")
	}
	peerTests := []struct {
		name   string
		cert   *KeyPair
		wantOK bool
	}{
		{"peer without certificate", nil, true},
		{"peer certificate", p.node, true},
		{"client certificate of the same CA", p.client, false},
		{"foreign client certificate", foreign.client, false},
		{"foreign node certificate", foreign.node, false},
	}
	for _, tt := range peerTests {
		t.Run(tt.name, func(t *testing.T) {
			cc := clientConfig(p, tt.cert)
			cc.ServerName = PeerServerName
			cc.InsecureSkipVerify = true // the peer certificate names no host
			c, err := dial(addr, cc)
			if (err == nil) != tt.wantOK {
				t.Fatalf("handshake error %v, want ok=%v", err, tt.wantOK)
			}
			if err == nil {
				c.Close()
			}
		})
	}
}

// TestExpiredCertWarnsAndExports (item 11): a certificate that is expired,
// or not valid yet, loads with a warning naming it, and its expiry is
// exported.
func TestExpiredCertWarnsAndExports(t *testing.T) {
	p := newPKI(t, "main")
	notAfter := p.node.Cert.NotAfter
	tests := []struct {
		name string
		now  time.Time
		want string
	}{
		{"expired", notAfter.Add(time.Hour), "certificate expired"},
		{"not yet valid", p.node.Cert.NotBefore.Add(-time.Hour), "certificate not valid yet"},
		{"valid", notAfter.Add(-time.Hour), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs bytes.Buffer
			r, err := New(p.files(), Options{Interval: -1, Logger: slog.New(slog.NewTextHandler(&logs, nil)), Now: func() time.Time { return tt.now }})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			out := logs.String()
			if tt.want == "" {
				if strings.Contains(out, "level=WARN") {
					t.Errorf("a valid certificate warned:\n%s", out)
				}
			} else if !strings.Contains(out, "level=WARN msg=\"tls: "+tt.want) || !strings.Contains(out, "cert=server") {
				t.Errorf("no warning %q naming the certificate:\n%s", tt.want, out)
			}
			reg := prometheus.NewRegistry()
			if err := r.RegisterMetrics(reg); err != nil {
				t.Fatal(err)
			}
			want := fmt.Sprintf(`
# HELP tokenserver_tls_cert_not_after_seconds Unix time at which a certificate in use expires (for a CA bundle, its first CA to expire).
# TYPE tokenserver_tls_cert_not_after_seconds gauge
tokenserver_tls_cert_not_after_seconds{cert="client_ca"} %d
tokenserver_tls_cert_not_after_seconds{cert="peer"} %d
tokenserver_tls_cert_not_after_seconds{cert="peer_ca"} %d
tokenserver_tls_cert_not_after_seconds{cert="server"} %d
`, p.ca.Cert.NotAfter.Unix(), notAfter.Unix(), p.ca.Cert.NotAfter.Unix(), notAfter.Unix())
			if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "tokenserver_tls_cert_not_after_seconds"); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestTLSReloadMetrics (item 8): the reload state of the certificates is
// exported: OK and the time of the last success, not OK after a refused
// content.
func TestTLSReloadMetrics(t *testing.T) {
	p := newPKI(t, "main")
	now := time.Unix(1_700_000_000, 0)
	r, err := New(p.files(), Options{Interval: -1, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	reg := prometheus.NewRegistry()
	if err := r.RegisterMetrics(reg); err != nil {
		t.Fatal(err)
	}
	check := func(ok int, last int64) {
		t.Helper()
		want := fmt.Sprintf(`
# HELP tokenserver_tls_certs_last_reload_success_timestamp_seconds Unix time of the last successful look at the TLS files.
# TYPE tokenserver_tls_certs_last_reload_success_timestamp_seconds gauge
tokenserver_tls_certs_last_reload_success_timestamp_seconds %d
# HELP tokenserver_tls_certs_reload_ok 1 when the last look at the TLS files loaded them or found them unchanged; 0 after a failed read or a refused content (the previous certificates stay in use).
# TYPE tokenserver_tls_certs_reload_ok gauge
tokenserver_tls_certs_reload_ok %d
`, last, ok)
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "tokenserver_tls_certs_reload_ok", "tokenserver_tls_certs_last_reload_success_timestamp_seconds"); err != nil {
			t.Error(err)
		}
	}
	check(1, 1_700_000_000)
	now = now.Add(time.Minute)
	writeFile(t, p.path("node.crt"), []byte("not a certificate"))
	if err := r.Reload(); err == nil {
		t.Fatal("a bad certificate loaded")
	}
	check(0, 1_700_000_000)
}

// TestDenySerials (item 9): a certificate whose serial is on the deny list
// is refused at the handshake, client and peer alike, both ways; the list
// is reloaded like the certificates, and its bad lines are left out
// (reported) while the good ones apply.
func TestDenySerials(t *testing.T) {
	p := newPKI(t, "main")
	f := p.files()
	f.DenySerialsFile = p.path("deny")
	writeFile(t, f.DenySerialsFile, []byte("# nothing denied yet\n"))
	r := newReloader(t, f)
	cfg, err := r.ServerConfig(ClientAuthRequest)
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := serve(t, cfg)
	psrv, _ := r.PeerServerConfig()
	paddr, _ := serve(t, psrv)
	pcli, _ := r.PeerClientConfig()
	for _, c := range []struct {
		addr string
		cfg  *tls.Config
	}{{addr, clientConfig(p, p.client)}, {paddr, pcli}} {
		conn, err := dial(c.addr, c.cfg)
		if err != nil {
			t.Fatalf("before the deny: %v", err)
		}
		conn.Close()
	}
	if r.SerialDenied(p.client.Cert) {
		t.Fatal("denied before the list names it")
	}
	// The client's serial with colons, the node's in plain hex, a bad line.
	hexColons := func(b []byte) string {
		var parts []string
		for _, x := range b {
			parts = append(parts, fmt.Sprintf("%02X", x))
		}
		return strings.Join(parts, ":")
	}
	writeFile(t, f.DenySerialsFile, []byte(hexColons(p.client.Cert.SerialNumber.Bytes())+"\nnot-hex\n0x"+p.node.Cert.SerialNumber.Text(16)+"\n"))
	if err := r.Reload(); err == nil || !strings.Contains(err.Error(), "deny:2") {
		t.Fatalf("Reload = %v, want the bad line 2 reported", err)
	}
	if !r.SerialDenied(p.client.Cert) || !r.SerialDenied(p.node.Cert) {
		t.Fatal("the good lines do not apply")
	}
	if c, err := dial(addr, clientConfig(p, p.client)); err == nil {
		c.Close()
		t.Error("a denied client certificate was served")
	}
	if c, err := dial(paddr, pcli); err == nil {
		c.Close()
		t.Error("a denied peer certificate was served")
	}
	if c, err := dial(addr, clientConfig(p, nil)); err != nil {
		t.Errorf("a client without a certificate: %v", err)
	} else {
		c.Close()
	}
	if _, err := New(f, Options{Interval: -1}); err == nil {
		t.Error("a deny list with a bad line was accepted at start")
	}
}

// TestPeerDialChecksNodeID (item 9): dialing node n2, a server whose
// certificate names n1 is refused; dialing n1 it is accepted.
func TestPeerDialChecksNodeID(t *testing.T) {
	p := newPKI(t, "main")
	r := newReloader(t, p.files())
	srv, _ := r.PeerServerConfig()
	addr, _ := serve(t, srv)
	for _, tt := range []struct {
		id     string
		wantOK bool
	}{{"n1", true}, {"n2", false}, {"", true}} {
		cfg, err := r.PeerClientConfigFor(tt.id)
		if err != nil {
			t.Fatal(err)
		}
		c, err := dial(addr, cfg)
		if (err == nil) != tt.wantOK {
			t.Errorf("dialing %q: %v, want ok=%v", tt.id, err, tt.wantOK)
		}
		if err == nil {
			c.Close()
		}
		if err != nil && !strings.Contains(err.Error(), `dialed node "n2"`) {
			t.Errorf("the error does not say which node was expected: %v", err)
		}
	}
}

// TestPeerIdentityCheck (item 13): the node's own peer certificate must
// name its id; the error names the flag and the missing URI. A SPIFFE
// pattern recognizes peers by their SPIFFE IDs.
func TestPeerIdentityCheck(t *testing.T) {
	p := newPKI(t, "main")
	r := newReloader(t, p.files())
	if err := r.CheckPeerIdentity("n1"); err != nil {
		t.Errorf("n1's own certificate: %v", err)
	}
	err := r.CheckPeerIdentity("n2")
	if err == nil || !strings.Contains(err.Error(), "--tls-cert") || !strings.Contains(err.Error(), "tokenserver://node/n2") {
		t.Errorf("another node's certificate: %v, want the flag and the missing URI named", err)
	}

	const pattern = "spiffe://cluster.local/ns/ts/node/{id}"
	spiffe, err := p.ca.Issue(CertRequest{CommonName: "s", URIs: []*url.URL{mustURL(t, "spiffe://cluster.local/ns/ts/node/n3")}, Server: true, Client: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := spiffe.WriteFiles(p.path("s.crt"), p.path("s.key")); err != nil {
		t.Fatal(err)
	}
	f := Files{CertFile: p.path("s.crt"), KeyFile: p.path("s.key"), ClientCAFile: p.path("ca.crt")}
	without := newReloader(t, f)
	if err := without.CheckPeerIdentity("n3"); err == nil || !strings.Contains(err.Error(), "spiffe://cluster.local/ns/ts/node/n3") {
		t.Errorf("a SPIFFE certificate without the pattern: %v", err)
	}
	with, err := New(f, Options{Interval: -1, PeerIDPattern: pattern})
	if err != nil {
		t.Fatal(err)
	}
	defer with.Close()
	if err := with.CheckPeerIdentity("n3"); err != nil {
		t.Errorf("with the pattern: %v", err)
	}
	if err := with.CheckPeerIdentity("n4"); err == nil || !strings.Contains(err.Error(), "spiffe://cluster.local/ns/ts/node/n4") {
		t.Errorf("with the pattern, another id: %v", err)
	}
	srv, _ := with.PeerServerConfig()
	addr, _ := serve(t, srv)
	cli, _ := with.PeerClientConfigFor("n3")
	if c, err := dial(addr, cli); err != nil {
		t.Errorf("SPIFFE peer to peer: %v", err)
	} else {
		c.Close()
	}
	if _, err := New(f, Options{Interval: -1, PeerIDPattern: "not a uri {id} {id}"}); err == nil {
		t.Error("a bad pattern was accepted")
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func TestMatchPeerIDPattern(t *testing.T) {
	tests := []struct {
		pattern, uri, id string
		ok               bool
	}{
		{"spiffe://td/ns/x/{id}", "spiffe://td/ns/x/n1", "n1", true},
		{"spiffe://td/ns/x/{id}", "spiffe://td/ns/x/", "", false},
		{"spiffe://td/ns/x/{id}", "spiffe://td/ns/x/a/b", "", false},
		{"spiffe://td/{id}/node", "spiffe://td/n2/node", "n2", true},
		{"spiffe://td/sa/ts", "spiffe://td/sa/ts", "", true},
		{"spiffe://td/sa/ts", "spiffe://td/sa/other", "", false},
		{"", "spiffe://td/sa/ts", "", false},
	}
	for _, tt := range tests {
		id, ok := MatchPeerIDPattern(tt.pattern, tt.uri)
		if id != tt.id || ok != tt.ok {
			t.Errorf("MatchPeerIDPattern(%q, %q) = %q, %v; want %q, %v", tt.pattern, tt.uri, id, ok, tt.id, tt.ok)
		}
	}
}
