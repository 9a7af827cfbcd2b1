package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/tokenserver/tokenserver/internal/auth"
	"github.com/tokenserver/tokenserver/internal/tlsutil"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// TestRevokedTokenEndsViewStream: a WatchClusterView stream opened with a
// token ends Unauthenticated once a reload drops that token from the
// token file, while a stream of a token that stays keeps running.
func TestRevokedTokenEndsViewStream(t *testing.T) {
	file := filepath.Join(t.TempDir(), "tokens")
	aliceTok, aliceLine, err := auth.NewToken("alice", auth.RoleClient)
	if err != nil {
		t.Fatal(err)
	}
	bobTok, bobLine, err := auth.NewToken("bob", auth.RoleClient)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte(aliceLine+"\n"+bobLine+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	az, err := auth.New(auth.Options{TokenFile: file, ReloadInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(az.Close)
	tn := newTestNode(t, func(c *Config) { c.Security.Auth = az })
	open := func(tok string) pb.TokenService_WatchClusterViewClient {
		t.Helper()
		c := metadata.AppendToOutgoingContext(ctx(t), "authorization", "Bearer "+tok)
		w, err := tn.token.WatchClusterView(c, &pb.GetClusterViewRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Recv(); err != nil {
			t.Fatalf("first view: %v", err)
		}
		return w
	}
	alice, bob := open(aliceTok), open(bobTok)
	if n := az.LiveStreams(); n != 2 {
		t.Fatalf("%d live streams, want 2", n)
	}
	if err := os.WriteFile(file, []byte(bobLine+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := az.Reload(); err != nil {
		t.Fatal(err)
	}
	for {
		_, err := alice.Recv()
		if err == nil {
			continue // a view sent before the end
		}
		if status.Code(err) != codes.Unauthenticated {
			t.Fatalf("alice's stream ended with %v, want Unauthenticated", err)
		}
		break
	}
	if _, err := bob.Recv(); err != nil {
		t.Fatalf("bob's stream: %v", err)
	}
	if n := az.LiveStreams(); n != 1 {
		t.Fatalf("%d live streams after the revocation, want 1", n)
	}
}

// TestMembershipFollowsRaftConfiguration: Security.Members admits every
// id until the node has read its configuration, then only its members.
func TestMembershipFollowsRaftConfiguration(t *testing.T) {
	m := &Membership{}
	if !m.Contains("node-9") {
		t.Fatal("an empty Membership refuses an id")
	}
	tn := newTestNode(t, func(c *Config) { c.Security.Members = m })
	tn.node.refreshMembers() // as watchAuth does at each view change
	if m.Contains("node-9") {
		t.Fatal("node-9 is a member after the configuration was read")
	}
	if !m.Contains("node-1") {
		t.Fatal("the node itself is not a member")
	}
	for _, tc := range []struct {
		ids     []string
		changed bool
	}{{[]string{"a", "b"}, true}, {[]string{"b", "a"}, false}, {[]string{"a"}, true}} {
		if got := m.set(tc.ids); got != tc.changed {
			t.Errorf("set(%v) changed=%v, want %v", tc.ids, got, tc.changed)
		}
	}
}

// nodeSecurity issues node id a certificate from ca, in dir, and returns
// its Security: TLS on, the CA both client and peer CA.
func nodeSecurity(t *testing.T, ca *tlsutil.CA, dir, id string) *Security {
	t.Helper()
	kp, err := ca.Issue(tlsutil.CertRequest{CommonName: id, DNSNames: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)},
		URIs: []*url.URL{tlsutil.NodeURI(id)}, Server: true, Client: true, Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	cert, key, caFile := filepath.Join(dir, id+".crt"), filepath.Join(dir, id+".key"), filepath.Join(dir, "ca.crt")
	if err := kp.WriteFiles(cert, key); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(caFile, ca.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	rl, err := tlsutil.New(tlsutil.Files{CertFile: cert, KeyFile: key, ClientCAFile: caFile}, tlsutil.Options{Interval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rl.Close)
	return &Security{TLS: rl, ClientAuth: tlsutil.ClientAuthRequest}
}

// TestPeerDialChecksNodeID: a node dialing a member it knows by id
// refuses a server whose certificate names another node, and accepts the
// member's own.
func TestPeerDialChecksNodeID(t *testing.T) {
	ca, err := tlsutil.NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	self, other := nodeSecurity(t, ca, dir, "node-0"), nodeSecurity(t, ca, dir, "node-1")
	cfg, err := other.TLS.ServerConfig(tlsutil.ClientAuthRequest)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(cfg)))
	hs := health.NewServer()
	hs.SetServingStatus(MemberHealthService, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	_, cli := self.peerTLS()
	p := NewPeers(cli)
	p.expectIDs(self)
	t.Cleanup(p.close)
	addr := lis.Addr().String()
	for _, tc := range []struct {
		id   string
		want bool
	}{{"node-1", true}, {"", true}, {"node-2", false}} {
		c, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		if got := p.healthOf(c, tc.id, addr); got != tc.want {
			t.Errorf("dialing %q at node-1's address: healthy=%v, want %v", tc.id, got, tc.want)
		}
		cancel()
	}
}

// TestAuditNamesPrincipalAndVia: a write a peer forwarded is audited as
// principal=<caller> via=<peer>; a direct one names the caller alone.
func TestAuditNamesPrincipalAndVia(t *testing.T) {
	var buf bytes.Buffer
	n := &Node{log: slog.New(slog.NewTextHandler(&buf, nil))} // audit needs only the logger
	for _, tc := range []struct {
		p    *auth.Principal
		want string
		not  string
	}{
		{&auth.Principal{Name: "node:n2", Source: auth.SourcePeer, NodeID: "n2", OnBehalfOf: "token:alice"},
			"principal=token:alice via=peer:node:n2", ""},
		{&auth.Principal{Name: "alice", Source: auth.SourceToken}, "principal=token:alice", "via="},
	} {
		buf.Reset()
		n.audit(auth.NewContext(context.Background(), tc.p), "/tokenserver.v1.AdminService/PutRule", nil)
		line := buf.String()
		if !strings.Contains(line, tc.want) || (tc.not != "" && strings.Contains(line, tc.not)) {
			t.Errorf("audit line %q: want %q, without %q", line, tc.want, tc.not)
		}
	}
}

// TestDeniedCertificateEndsViewStream: a WatchClusterView stream opened
// with a client certificate ends Unauthenticated once its serial is added
// to the deny list (--tls-deny-serials) and the TLS files are reloaded:
// the node rechecks live streams after a TLS reload.
func TestDeniedCertificateEndsViewStream(t *testing.T) {
	ca, err := tlsutil.NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	node, err := ca.Issue(tlsutil.CertRequest{CommonName: "node-1", IPs: []net.IP{net.IPv4(127, 0, 0, 1)},
		URIs: []*url.URL{tlsutil.NodeURI("node-1")}, Server: true, Client: true, Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	alice, err := ca.Issue(tlsutil.CertRequest{CommonName: "alice", OrganizationalUnits: []string{"client"}, Client: true, Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	cert, key, caFile, deny := filepath.Join(dir, "n.crt"), filepath.Join(dir, "n.key"), filepath.Join(dir, "ca.crt"), filepath.Join(dir, "deny")
	if err := node.WriteFiles(cert, key); err != nil {
		t.Fatal(err)
	}
	for f, b := range map[string][]byte{caFile: ca.CertPEM, deny: []byte("# none yet\n")} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	rl, err := tlsutil.New(tlsutil.Files{CertFile: cert, KeyFile: key, ClientCAFile: caFile, DenySerialsFile: deny}, tlsutil.Options{Interval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rl.Close)
	az, err := auth.New(auth.Options{ClientCerts: true, CertDenied: rl.SerialDenied})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(az.Close)
	cfg := DefaultConfig()
	cfg.HTTPAddr = ""
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.Security = Security{TLS: rl, ClientAuth: tlsutil.ClientAuthRequest, Auth: az}
	n, err := New(cfg, NewStandalone("node-1", "127.0.0.1:0", inmem(t, cfg.MaxRules)).Deps())
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- n.Serve(sctx, Listeners{GRPC: lis}) }()
	t.Cleanup(func() { cancel(); <-done })
	pair, err := alice.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{
		RootCAs: pool, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	w, err := pb.NewTokenServiceClient(conn).WatchClusterView(ctx(t), &pb.GetClusterViewRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Recv(); err != nil {
		t.Fatalf("first view: %v", err)
	}
	if err := os.WriteFile(deny, []byte(alice.Cert.SerialNumber.Text(16)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := rl.Reload(); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := w.Recv(); err != nil {
			if status.Code(err) != codes.Unauthenticated {
				t.Fatalf("the denied certificate's stream ended with %v, want Unauthenticated", err)
			}
			return
		}
	}
}
