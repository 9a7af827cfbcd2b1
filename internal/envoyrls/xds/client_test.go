package xds

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	cachetypes "github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cache "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resource "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconf "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/tokenserver/tokenserver/internal/envoyrls"
	"github.com/tokenserver/tokenserver/internal/tlsutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"
)

// waitFor bounds every wait on a channel.
const waitFor = 10 * time.Second

// mgmt is go-control-plane's own xDS server, in process on 127.0.0.1, with
// a snapshot cache as its examples use it. Every DiscoveryRequest it
// receives is copied to reqs.
type mgmt struct {
	t     *testing.T
	cache cache.SnapshotCache
	creds credentials.TransportCredentials
	addr  string
	reqs  chan *discovery.DiscoveryRequest
	peers chan *peer.Peer
	srv   *grpc.Server
	done  chan struct{}
}

func newMgmt(t *testing.T, creds credentials.TransportCredentials) *mgmt {
	t.Helper()
	m := &mgmt{
		t:     t,
		cache: cache.NewSnapshotCache(true, cache.IDHash{}, nil),
		creds: creds,
		reqs:  make(chan *discovery.DiscoveryRequest, 1024),
		peers: make(chan *peer.Peer, 64),
	}
	m.serve("127.0.0.1:0")
	t.Cleanup(m.stop)
	return m
}

// serve starts a fresh gRPC and xDS server over the same cache on addr.
func (m *mgmt) serve(addr string) {
	m.t.Helper()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		m.t.Fatalf("listen %s: %v", addr, err)
	}
	m.addr = lis.Addr().String()
	var opts []grpc.ServerOption
	if m.creds != nil {
		opts = append(opts, grpc.Creds(m.creds))
	}
	m.srv = grpc.NewServer(opts...)
	cb := serverv3.CallbackFuncs{
		StreamOpenFunc: func(ctx context.Context, _ int64, _ string) error {
			if p, ok := peer.FromContext(ctx); ok {
				select {
				case m.peers <- p:
				default:
				}
			}
			return nil
		},
		StreamRequestFunc: func(_ int64, req *discovery.DiscoveryRequest) error {
			select {
			case m.reqs <- proto.Clone(req).(*discovery.DiscoveryRequest):
			default:
				m.t.Errorf("request buffer full")
			}
			return nil
		},
	}
	discovery.RegisterAggregatedDiscoveryServiceServer(m.srv, serverv3.NewServer(context.Background(), m.cache, cb))
	m.done = make(chan struct{})
	go func(srv *grpc.Server, done chan struct{}) {
		defer close(done)
		_ = srv.Serve(lis)
	}(m.srv, m.done)
}

// stop ends the server and every stream on it.
func (m *mgmt) stop() {
	if m.srv == nil {
		return
	}
	m.srv.Stop()
	<-m.done
	m.srv = nil
}

// set makes rcs, at version, the snapshot for node.
func (m *mgmt) set(node, version string, rcs ...*rlsconf.RateLimitConfig) {
	m.t.Helper()
	res := make([]cachetypes.Resource, len(rcs))
	for i, rc := range rcs {
		res[i] = rc
	}
	snap, err := cache.NewSnapshot(version, map[resource.Type][]cachetypes.Resource{resource.RateLimitConfigType: res})
	if err != nil {
		m.t.Fatal(err)
	}
	if err := m.cache.SetSnapshot(context.Background(), node, snap); err != nil {
		m.t.Fatal(err)
	}
}

// waitReq returns the first request (discarding others) that satisfies ok.
func (m *mgmt) waitReq(what string, ok func(*discovery.DiscoveryRequest) bool) *discovery.DiscoveryRequest {
	m.t.Helper()
	timeout := time.After(waitFor)
	for {
		select {
		case r := <-m.reqs:
			if ok(r) {
				return r
			}
		case <-timeout:
			m.t.Fatalf("no %s within %v", what, waitFor)
		}
	}
}

func (m *mgmt) waitACK(version string) {
	m.t.Helper()
	m.waitReq("ACK of "+version, func(r *discovery.DiscoveryRequest) bool {
		return r.GetVersionInfo() == version && r.GetResponseNonce() != "" && r.GetErrorDetail() == nil
	})
}

// delivery is one call of the callback.
type delivery struct {
	cfg     *envoyrls.Config
	version string
}

// sink is the callback's end: deliveries arrive on sets; reject, when set,
// decides the callback's error by version.
type sink struct {
	sets   chan delivery
	reject func(version string) error
}

func (s *sink) apply(ctx context.Context, cfg *envoyrls.Config, version string) error {
	if s.reject != nil {
		if err := s.reject(version); err != nil {
			return err
		}
	}
	select {
	case s.sets <- delivery{cfg, version}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *sink) next(t *testing.T) delivery {
	t.Helper()
	select {
	case d := <-s.sets:
		return d
	case <-time.After(waitFor):
		t.Fatalf("no set delivered within %v", waitFor)
		return delivery{}
	}
}

// expect waits for the next delivery and checks its version.
func (s *sink) expect(t *testing.T, version string) *envoyrls.Config {
	t.Helper()
	d := s.next(t)
	if d.version != version {
		t.Fatalf("delivered version %q, want %q", d.version, version)
	}
	return d.cfg
}

func (s *sink) none(t *testing.T) {
	t.Helper()
	select {
	case d := <-s.sets:
		t.Fatalf("unexpected delivery of version %q", d.version)
	default:
	}
}

func testConfig(addr, node string) Config {
	c := DefaultConfig()
	c.Server, c.NodeID = addr, node
	c.Backoff = backoff.Config{BaseDelay: 10 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 100 * time.Millisecond}
	return c
}

// start runs a client until the test ends.
func start(t *testing.T, cfg Config, s *sink) *Client {
	t.Helper()
	c, err := New(cfg, s.apply, slog.New(slog.NewTextHandler(tWriter{t}, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(waitFor):
			t.Errorf("Run did not return within %v of cancel", waitFor)
		}
	})
	return c
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// limits builds a RateLimitConfig with one descriptor per key=n pair, per
// second.
func limits(name, domain string, keyLimits map[string]uint32) *rlsconf.RateLimitConfig {
	rc := &rlsconf.RateLimitConfig{Name: name, Domain: domain}
	for k, n := range keyLimits {
		rc.Descriptors = append(rc.Descriptors, &rlsconf.RateLimitDescriptor{Key: k, RateLimit: rl(rlsconf.RateLimitUnit_SECOND, n)})
	}
	return rc
}

func limitOf(t *testing.T, cfg *envoyrls.Config, domain, key string) uint32 {
	t.Helper()
	l := cfg.Resolve(domain, desc(key, "x"))
	if l == nil {
		t.Fatalf("%s/%s: no limit", domain, key)
	}
	return l.RequestsPerUnit
}

func TestClientDeliversACKsAndNACKs(t *testing.T) {
	m := newMgmt(t, nil)
	m.set("gw-node", "v1", limits("rl-a", "gw", map[string]uint32{"user": 5}))
	// Another node's snapshot must not reach this client.
	m.set("other", "o1", limits("rl-o", "other", map[string]uint32{"user": 1}))
	cfg := testConfig(m.addr, "gw-node")
	cfg.NodeMetadata = "zone=a,team=edge"
	s := &sink{sets: make(chan delivery, 8)}
	c := start(t, cfg, s)

	first := m.waitReq("subscription", func(r *discovery.DiscoveryRequest) bool { return r.GetResponseNonce() == "" })
	if first.GetTypeUrl() != TypeURL || first.GetVersionInfo() != "" || len(first.GetResourceNames()) != 0 {
		t.Errorf("subscription = %v", first)
	}
	md := first.GetNode().GetMetadata().GetFields()
	if first.GetNode().GetId() != "gw-node" || md["zone"].GetStringValue() != "a" || md["team"].GetStringValue() != "edge" || len(md) != 2 {
		t.Errorf("node = %v", first.GetNode())
	}

	got := s.expect(t, "v1")
	if got.Len() != 1 || limitOf(t, got, "gw", "user") != 5 {
		t.Fatalf("v1 = %d domains, %v", got.Len(), got.Domains())
	}
	m.waitACK("v1")

	// A changed set: a new limit and a second domain.
	m.set("gw-node", "v2", limits("rl-a", "gw", map[string]uint32{"user": 10}), limits("rl-b", "gw2", map[string]uint32{"ip": 3}))
	got = s.expect(t, "v2")
	if got.Len() != 2 || limitOf(t, got, "gw", "user") != 10 || limitOf(t, got, "gw2", "ip") != 3 {
		t.Fatalf("v2 = %v", got.Domains())
	}
	m.waitACK("v2")

	// A bad set is NACKed naming the problem, and v2 stays in force.
	bad := limits("rl-a", "gw", map[string]uint32{"user": 1})
	bad.Descriptors[0].RateLimit.Unit = rlsconf.RateLimitUnit_UNKNOWN
	m.set("gw-node", "v3", bad)
	nack := m.waitReq("NACK of v3", func(r *discovery.DiscoveryRequest) bool { return r.GetErrorDetail() != nil })
	if nack.GetVersionInfo() != "v2" || nack.GetResponseNonce() == "" ||
		!strings.Contains(nack.GetErrorDetail().GetMessage(), `RateLimitConfig "rl-a"`) ||
		!strings.Contains(nack.GetErrorDetail().GetMessage(), "invalid rate limit unit 'UNKNOWN'") ||
		nack.GetErrorDetail().GetCode() != int32(codes.InvalidArgument) {
		t.Errorf("NACK = %v", nack)
	}
	s.none(t) // the NACK is sent after the decision: no call can be pending
	if st := c.Status(); st.Accepted != "v2" || st.Rejected != "v3" || !strings.Contains(st.RejectReason, "UNKNOWN") || !st.Connected {
		t.Errorf("Status = %+v", st)
	}

	// The next good set is delivered and clears the rejection.
	m.set("gw-node", "v4", limits("rl-a", "gw", map[string]uint32{"user": 7}))
	if got := s.expect(t, "v4"); limitOf(t, got, "gw", "user") != 7 {
		t.Fatal("v4 not in force")
	}
	m.waitACK("v4")
	if st := c.Status(); st.Accepted != "v4" || st.Rejected != "" {
		t.Errorf("Status = %+v", st)
	}

	// An empty set is a state of the world too: no domains.
	m.set("gw-node", "v5")
	if got := s.expect(t, "v5"); got.Len() != 0 {
		t.Fatalf("v5 = %v, want no domains", got.Domains())
	}
}

func TestClientCallbackErrors(t *testing.T) {
	m := newMgmt(t, nil)
	m.set("n", "v1", limits("rl", "gw", map[string]uint32{"k": 1}))
	retried := make(chan struct{})
	s := &sink{sets: make(chan delivery, 8), reject: func(version string) error {
		switch version {
		case "v1":
			select {
			case <-retried: // second time: accept
				return nil
			default:
				close(retried)
				return fmt.Errorf("raft: %w", ErrRetry)
			}
		case "v2":
			return errors.New("refused by the leader")
		}
		return nil
	}}
	c := start(t, testConfig(m.addr, "n"), s)

	// ErrRetry: NACK (Unavailable), new stream, the server sends v1 again.
	nack := m.waitReq("NACK of v1", func(r *discovery.DiscoveryRequest) bool { return r.GetErrorDetail() != nil })
	if nack.GetErrorDetail().GetCode() != int32(codes.Unavailable) || nack.GetVersionInfo() != "" {
		t.Errorf("NACK = %v", nack)
	}
	s.expect(t, "v1")
	m.waitACK("v1")

	// A final error: NACK, no retry, v1 stays.
	m.set("n", "v2", limits("rl", "gw", map[string]uint32{"k": 2}))
	nack = m.waitReq("NACK of v2", func(r *discovery.DiscoveryRequest) bool { return r.GetErrorDetail() != nil })
	if !strings.Contains(nack.GetErrorDetail().GetMessage(), "refused by the leader") || nack.GetVersionInfo() != "v1" ||
		nack.GetErrorDetail().GetCode() != int32(codes.InvalidArgument) {
		t.Errorf("NACK = %v", nack)
	}
	s.none(t)
	if st := c.Status(); st.Accepted != "v1" || st.Rejected != "v2" {
		t.Errorf("Status = %+v", st)
	}
}

func TestClientReconnectsAfterServerRestart(t *testing.T) {
	m := newMgmt(t, nil)
	m.set("n", "v1", limits("rl", "gw", map[string]uint32{"k": 1}))
	s := &sink{sets: make(chan delivery, 8)}
	start(t, testConfig(m.addr, "n"), s)
	s.expect(t, "v1")
	m.waitACK("v1")

	// The server goes away mid-stream; the set changes while it is down.
	m.stop()
	m.set("n", "v2", limits("rl", "gw", map[string]uint32{"k": 2}))
	m.serve(m.addr)

	resub := m.waitReq("resubscription", func(r *discovery.DiscoveryRequest) bool { return r.GetResponseNonce() == "" })
	if resub.GetVersionInfo() != "v1" || resub.GetNode().GetId() != "n" {
		t.Errorf("resubscription = %v, want version v1 from node n", resub)
	}
	if got := s.expect(t, "v2"); limitOf(t, got, "gw", "k") != 2 {
		t.Fatal("v2 not in force")
	}
	m.waitACK("v2")
}

func TestClientMutualTLS(t *testing.T) {
	dir := t.TempDir()
	ca, err := tlsutil.NewCA("xds test CA", 0)
	if err != nil {
		t.Fatal(err)
	}
	// The server's certificate names only xds.test, not the address dialed:
	// the handshake passes only if the client verifies that name.
	srvCert, err := ca.Issue(tlsutil.CertRequest{CommonName: "xds-server", DNSNames: []string{"xds.test"}, Server: true})
	if err != nil {
		t.Fatal(err)
	}
	cliCert, err := ca.Issue(tlsutil.CertRequest{CommonName: "xds-client", Client: true})
	if err != nil {
		t.Fatal(err)
	}
	caFile, certFile, keyFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	if err := os.WriteFile(caFile, ca.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := cliCert.WriteFiles(certFile, keyFile); err != nil {
		t.Fatal(err)
	}
	srvTLS, err := srvCert.TLSCertificate()
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	m := newMgmt(t, credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{srvTLS},
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
	}))
	m.set("n", "v1", limits("rl", "gw", map[string]uint32{"k": 1}))

	cfg := testConfig(m.addr, "n")
	cfg.TLSCA, cfg.TLSCert, cfg.TLSKey, cfg.TLSServerName = caFile, certFile, keyFile, "xds.test"
	s := &sink{sets: make(chan delivery, 8)}
	start(t, cfg, s)
	s.expect(t, "v1")

	select {
	case p := <-m.peers:
		info, ok := p.AuthInfo.(credentials.TLSInfo)
		if !ok || len(info.State.PeerCertificates) == 0 || info.State.PeerCertificates[0].Subject.CommonName != "xds-client" {
			t.Errorf("server saw peer %+v, want the client certificate xds-client", p.AuthInfo)
		}
	case <-time.After(waitFor):
		t.Fatal("no stream opened")
	}
}
