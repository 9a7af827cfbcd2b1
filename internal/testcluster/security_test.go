package testcluster

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"

	"github.com/tokenserver/tokenserver/internal/auth"
	"github.com/tokenserver/tokenserver/internal/server"
	"github.com/tokenserver/tokenserver/internal/tlsutil"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// dialWith opens a client connection to addr with opts, closed in
// t.Cleanup.
func dialWith(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// shortCtx bounds a call that is expected to fail at the handshake.
func shortCtx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	t.Cleanup(cancel)
	return c
}

func wantCode(t *testing.T, what string, err error, code codes.Code) {
	t.Helper()
	if status.Code(err) != code {
		t.Fatalf("%s: got %v, want %s", what, err, code)
	}
}

// tlsWithCert trusts p's CA and presents cert.
func tlsWithCert(p *PKI, cert *tlsutil.KeyPair) *tls.Config {
	c := p.ClientTLS()
	if cert != nil {
		pair, err := cert.TLSCertificate()
		if err != nil {
			panic(err)
		}
		// Always present it (Certificates would be withheld from a server
		// that does not list its CA as acceptable).
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &pair, nil }
	}
	return c
}

func issueClient(t *testing.T, ca *tlsutil.CA, name, role string) *tlsutil.KeyPair {
	t.Helper()
	kp, err := ca.Issue(tlsutil.CertRequest{CommonName: name, OrganizationalUnits: []string{role}, URIs: []*url.URL{tlsutil.ClientURI(name)}, Client: true})
	if err != nil {
		t.Fatal(err)
	}
	return kp
}

// TestTLSRefusesStrangers: on a TLS gRPC port a plaintext client is refused,
// a client certificate of another CA is refused, and a client that trusts
// the CA gets through to auth (which wants a credential).
func TestTLSRefusesStrangers(t *testing.T) {
	c := NewSecure(t, 1, nil)
	addr := c.Nodes[0].GRPCAddr
	plain := dialWith(t, addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	_, err := pb.NewAdminServiceClient(plain).NodeStatus(shortCtx(t), &pb.NodeStatusRequest{})
	wantCode(t, "plaintext client on the TLS port", err, codes.Unavailable)

	foreign, err := tlsutil.NewCA("foreign", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	alien := dialWith(t, addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsWithCert(c.PKI, issueClient(t, foreign, "mallory", "admin")))))
	_, err = pb.NewAdminServiceClient(alien).NodeStatus(shortCtx(t), &pb.NodeStatusRequest{})
	wantCode(t, "client certificate of another CA", err, codes.Unavailable)

	anon := dialWith(t, addr, grpc.WithTransportCredentials(credentials.NewTLS(c.PKI.ClientTLS())))
	_, err = pb.NewAdminServiceClient(anon).NodeStatus(ctx(t), &pb.NodeStatusRequest{})
	wantCode(t, "TLS without a credential", err, codes.Unauthenticated)

	// A client certificate of the CA is a credential; its OU is its role.
	viewer := dialWith(t, addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsWithCert(c.PKI, issueClient(t, c.PKI.CA, "carol", "viewer")))))
	if _, err := pb.NewAdminServiceClient(viewer).NodeStatus(ctx(t), &pb.NodeStatusRequest{}); err != nil {
		t.Fatalf("viewer certificate: NodeStatus: %v", err)
	}
	_, err = pb.NewAdminServiceClient(viewer).PutRule(ctx(t), &pb.PutRuleRequest{Rule: tokenBucket("r", 1)})
	wantCode(t, "viewer certificate: PutRule", err, codes.PermissionDenied)
}

// TestMTLSRequire: with --tls-client-auth=require a client without a
// certificate is refused at the handshake, even with a valid token; one
// with a certificate of the CA is served.
func TestMTLSRequire(t *testing.T) {
	c := NewSecure(t, 1, func(o *server.Options) { o.Server.Security.ClientAuth = tlsutil.ClientAuthRequire })
	addr := c.Nodes[0].GRPCAddr
	noCert := dialWith(t, addr, c.PKI.DialOptions("admin")...)
	_, err := pb.NewAdminServiceClient(noCert).NodeStatus(shortCtx(t), &pb.NodeStatusRequest{})
	wantCode(t, "require without a client certificate", err, codes.Unavailable)
	withCert := dialWith(t, addr, grpc.WithTransportCredentials(credentials.NewTLS(tlsWithCert(c.PKI, issueClient(t, c.PKI.CA, "dave", "admin")))))
	if _, err := pb.NewAdminServiceClient(withCert).NodeStatus(ctx(t), &pb.NodeStatusRequest{}); err != nil {
		t.Fatalf("require with a client certificate: %v", err)
	}
}

// TestRoles: no token is Unauthenticated; a client token acquires but
// cannot PutRule (PermissionDenied), an editor can; only an admin restores
// a snapshot or joins a node; the rule records who wrote it, also through
// a follower; health checks answer without a credential.
func TestRoles(t *testing.T) {
	c := NewSecure(t, 3, nil)
	leader, follower := c.Leader(), c.Follower()
	as := func(role string, n *Node) *grpc.ClientConn {
		return dialWith(t, n.GRPCAddr, c.PKI.DialOptions(role)...)
	}
	none := dialWith(t, follower.GRPCAddr, grpc.WithTransportCredentials(credentials.NewTLS(c.PKI.ClientTLS())))
	_, err := pb.NewTokenServiceClient(none).AcquireToken(ctx(t), &pb.AcquireTokenRequest{Rule: "r", Key: "k"})
	wantCode(t, "AcquireToken without a token", err, codes.Unauthenticated)
	bad := dialWith(t, follower.GRPCAddr, grpc.WithTransportCredentials(credentials.NewTLS(c.PKI.ClientTLS())), grpc.WithPerRPCCredentials(auth.BearerToken{Token: "not-a-token"}))
	_, err = pb.NewAdminServiceClient(bad).GetRule(ctx(t), &pb.GetRuleRequest{Name: "r"})
	wantCode(t, "GetRule with an unknown token", err, codes.Unauthenticated)

	client, editor, admin := as("client", follower), as("editor", follower), as("admin", follower)
	_, err = pb.NewAdminServiceClient(client).PutRule(ctx(t), &pb.PutRuleRequest{Rule: tokenBucket("r", 5)})
	wantCode(t, "client token: PutRule", err, codes.PermissionDenied)
	if !strings.Contains(status.Convert(err).Message(), "editor") {
		t.Errorf("PermissionDenied does not name the role: %v", err)
	}
	if _, err := pb.NewAdminServiceClient(editor).PutRule(ctx(t), &pb.PutRuleRequest{Rule: tokenBucket("r", 5)}); err != nil {
		t.Fatalf("editor token: PutRule through a follower: %v", err)
	}
	r, err := pb.NewAdminServiceClient(as("viewer", leader)).GetRule(ctx(t), &pb.GetRuleRequest{Name: "r"})
	if err != nil || r.GetUpdatedBy() != "token:editor-user" {
		t.Fatalf("the leader records the real author of a forwarded write: updated_by %q, %v", r.GetUpdatedBy(), err)
	}
	c.WaitForRule("r")
	if resp, err := pb.NewTokenServiceClient(client).AcquireToken(ctx(t), &pb.AcquireTokenRequest{Rule: "r", Key: "k"}); err != nil || !resp.GetAllowed() {
		t.Fatalf("client token: AcquireToken: %v %v", resp, err)
	}
	_, err = pb.NewAdminServiceClient(client).NodeStatus(ctx(t), &pb.NodeStatusRequest{})
	wantCode(t, "client token: NodeStatus", err, codes.PermissionDenied)

	// Snapshot: a viewer saves, only an admin restores.
	snap := saveSnapshot(t, pb.NewAdminServiceClient(as("viewer", follower)))
	for _, role := range []string{"client", "viewer", "editor"} {
		_, err := restoreSnapshot(t, pb.NewAdminServiceClient(as(role, follower)), snap)
		wantCode(t, role+" token: SnapshotRestore", err, codes.PermissionDenied)
	}
	if _, err := restoreSnapshot(t, pb.NewAdminServiceClient(admin), snap); err != nil {
		t.Fatalf("admin token: SnapshotRestore: %v", err)
	}

	// Join: only an admin (or a peer) gets past auth; the ghost is then
	// refused by the join probe, which finds no node at its Raft address.
	ghost := &pb.JoinClusterRequest{Id: "ghost", RaftAddr: "127.0.0.1:1", GrpcAddr: "127.0.0.1:1"}
	for _, role := range []string{"client", "viewer", "editor"} {
		_, err := pb.NewAdminServiceClient(as(role, follower)).JoinCluster(ctx(t), ghost)
		wantCode(t, role+" token: JoinCluster", err, codes.PermissionDenied)
	}
	_, err = pb.NewAdminServiceClient(none).JoinCluster(ctx(t), ghost)
	wantCode(t, "JoinCluster without a credential", err, codes.Unauthenticated)
	_, err = pb.NewAdminServiceClient(admin).JoinCluster(ctx(t), ghost)
	if c := status.Code(err); err == nil || c == codes.PermissionDenied || c == codes.Unauthenticated {
		t.Fatalf("admin token: JoinCluster of a node that does not answer: %v (want past auth, refused by the probe)", err)
	}
	if st, _ := leader.Cluster().Status(); len(st.Members) != 3 {
		t.Fatalf("members after the joins: %+v", st.Members)
	}

	// Health answers probes without a credential.
	if _, err := healthpb.NewHealthClient(none).Check(ctx(t), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("health check without a credential: %v", err)
	}
}

func saveSnapshot(t *testing.T, c pb.AdminServiceClient) []byte {
	t.Helper()
	s, err := c.SnapshotSave(ctx(t), &pb.SnapshotSaveRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	for {
		chunk, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return b.Bytes()
		}
		if err != nil {
			t.Fatalf("snapshot save: %v", err)
		}
		b.Write(chunk.GetData())
	}
}

func restoreSnapshot(t *testing.T, c pb.AdminServiceClient, data []byte) (*pb.SnapshotRestoreResponse, error) {
	t.Helper()
	s, err := c.SnapshotRestore(ctx(t))
	if err != nil {
		return nil, err
	}
	if err := s.Send(&pb.SnapshotChunk{Data: data}); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	return s.CloseAndRecv()
}

// TestPeerJoinsOnlyAsItself: a peer certificate that names node-1 cannot
// join the cluster as another node.
func TestPeerJoinsOnlyAsItself(t *testing.T) {
	c := NewSecure(t, 2, nil)
	cert, key := c.PKI.NodeFiles("node-1")
	pair, err := tls.LoadX509KeyPair(cert, key)
	if err != nil {
		t.Fatal(err)
	}
	cfg := c.PKI.ClientTLS()
	cfg.Certificates = []tls.Certificate{pair}
	conn := dialWith(t, c.Leader().GRPCAddr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	_, err = pb.NewAdminServiceClient(conn).JoinCluster(ctx(t), &pb.JoinClusterRequest{Id: "ghost", RaftAddr: c.Nodes[1].RaftAddr, GrpcAddr: c.Nodes[1].GRPCAddr})
	wantCode(t, "node-1's certificate joining as ghost", err, codes.PermissionDenied)
}

// rogueLayer is a Raft stream layer for an attacker: it dials the Raft
// port with dial and speaks raft's protocol after the connection kind byte.
type rogueLayer struct {
	net.Listener
	dial func(addr string) (net.Conn, error)
}

func (r rogueLayer) Dial(a raft.ServerAddress, _ time.Duration) (net.Conn, error) {
	c, err := r.dial(string(a))
	if err != nil {
		return nil, err
	}
	if _, err := c.Write([]byte{'R'}); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// TestRogueRaftPeer: a process that reaches the Raft port without a peer
// certificate (plaintext, TLS without a certificate, or a node certificate
// of another CA naming a member) cannot bump the term, append an entry or
// win a vote: the leader stays, the term and the applied index do not move.
func TestRogueRaftPeer(t *testing.T) {
	// Timeouts that a loaded test machine does not trip, so that no
	// election of its own moves the term while the rogue tries.
	c := NewSecure(t, 3, func(o *server.Options) {
		o.Raft.HeartbeatTimeout, o.Raft.ElectionTimeout, o.Raft.LeaderLeaseTimeout = 2*time.Second, 2*time.Second, time.Second
	})
	// The cluster commits entries of its own for a while after it forms
	// (autopilot promotions, view changes): wait until its applied index
	// has stood still for a second, so that a change below is the rogue's.
	leader := c.Leader()
	var last uint64
	steady := time.Now()
	c.WaitFor("a quiet log", func() bool {
		st, err := leader.Cluster().Status()
		if err != nil {
			return false
		}
		if st.AppliedIndex != last {
			last, steady = st.AppliedIndex, time.Now()
		}
		return time.Since(steady) > time.Second
	})
	before, err := leader.Cluster().Status()
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := tlsutil.NewCA("foreign", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	impostor, err := foreign.Issue(tlsutil.CertRequest{CommonName: "node-1", URIs: []*url.URL{tlsutil.NodeURI("node-1")}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)}, Server: true, Client: true})
	if err != nil {
		t.Fatal(err)
	}
	impostorPair, _ := impostor.TLSCertificate()
	dialTLS := func(certs []tls.Certificate) func(string) (net.Conn, error) {
		return func(a string) (net.Conn, error) {
			d := &net.Dialer{Timeout: 2 * time.Second}
			return tls.DialWithDialer(d, "tcp", a, &tls.Config{InsecureSkipVerify: true, Certificates: certs, ServerName: tlsutil.PeerServerName})
		}
	}
	rogues := []struct {
		name string
		dial func(string) (net.Conn, error)
	}{
		{"plaintext", func(a string) (net.Conn, error) { return net.DialTimeout("tcp", a, 2*time.Second) }},
		{"TLS without a certificate", dialTLS(nil)},
		{"node certificate of another CA", dialTLS([]tls.Certificate{impostorPair})},
	}
	for _, r := range rogues {
		t.Run(r.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			tr := raft.NewNetworkTransport(rogueLayer{Listener: ln, dial: r.dial}, 1, 2*time.Second, io.Discard)
			defer tr.Close()
			hdr := raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("node-1"), Addr: []byte(ln.Addr().String())}
			for _, target := range c.Nodes {
				addr := raft.ServerAddress(target.RaftAddr)
				ae := &raft.AppendEntriesRequest{RPCHeader: hdr, Term: before.Term + 100, PrevLogEntry: before.LastIndex, PrevLogTerm: before.Term, LeaderCommitIndex: before.LastIndex + 1,
					Entries: []*raft.Log{{Index: before.LastIndex + 1, Term: before.Term + 100, Type: raft.LogCommand, Data: []byte("a rule nobody wrote")}}}
				var aer raft.AppendEntriesResponse
				if err := tr.AppendEntries("node-x", addr, ae, &aer); err == nil {
					t.Errorf("%s: AppendEntries answered: %+v", target.ID, aer)
				}
				vote := &raft.RequestVoteRequest{RPCHeader: hdr, Term: before.Term + 100, LastLogIndex: 1 << 40, LastLogTerm: 1 << 40}
				var vr raft.RequestVoteResponse
				if err := tr.RequestVote("node-x", addr, vote, &vr); err == nil {
					t.Errorf("%s: RequestVote answered: %+v", target.ID, vr)
				}
			}
		})
	}
	time.Sleep(500 * time.Millisecond) // what a rogue RPC would have done is done
	after, err := c.Leader().Cluster().Status()
	if err != nil {
		t.Fatal(err)
	}
	if after.Leader != before.Leader || after.Term != before.Term || after.AppliedIndex != before.AppliedIndex {
		t.Fatalf("the rogue changed the cluster: before leader %s term %d applied %d, after leader %s term %d applied %d",
			before.Leader, before.Term, before.AppliedIndex, after.Leader, after.Term, after.AppliedIndex)
	}
	for _, n := range c.Nodes {
		st, _ := n.Cluster().Status()
		if st.Term != before.Term {
			t.Errorf("%s: term %d, was %d", n.ID, st.Term, before.Term)
		}
	}
}

// TestClientForwardedHeaderIgnored: a client that sets the forwarded
// marker is routed like any other call: a 10-per-hour rule asked on all 3
// nodes for one key admits 10, not 30.
func TestClientForwardedHeaderIgnored(t *testing.T) {
	c := NewSecure(t, 3, nil)
	if _, err := c.Leader().Admin().PutRule(ctx(t), &pb.PutRuleRequest{Rule: tokenBucket("hourly", 10)}); err != nil {
		t.Fatal(err)
	}
	var clients []pb.TokenServiceClient
	c.WaitForRule("hourly")
	for _, n := range c.Nodes {
		clients = append(clients, pb.NewTokenServiceClient(dialWith(t, n.GRPCAddr, c.PKI.DialOptions("client")...)))
	}
	allowed := 0
	for i := 0; i < 45; i++ {
		cctx := metadata.AppendToOutgoingContext(ctx(t), server.ForwardedHeader, "1")
		resp, err := clients[i%3].AcquireToken(cctx, &pb.AcquireTokenRequest{Rule: "hourly", Key: "k"})
		if err != nil {
			t.Fatalf("acquire %d: %v", i, err)
		}
		if resp.GetAllowed() {
			allowed++
		}
	}
	if allowed != 10 {
		t.Fatalf("a client's forwarded marker: %d admitted across 3 nodes, want 10", allowed)
	}
}

// TestRotation: new certificate files are served to new connections within
// the reload interval, while a connection opened before keeps working on
// the old one.
func TestRotation(t *testing.T) {
	c := NewSecure(t, 1, nil)
	n := c.Nodes[0]
	serial := func(conn *grpc.ClientConn) string {
		var p peer.Peer
		if _, err := pb.NewAdminServiceClient(conn).NodeStatus(ctx(t), &pb.NodeStatusRequest{}, grpc.Peer(&p)); err != nil {
			t.Fatalf("NodeStatus: %v", err)
		}
		return p.AuthInfo.(credentials.TLSInfo).State.PeerCertificates[0].SerialNumber.String()
	}
	old := dialWith(t, n.GRPCAddr, c.PKI.DialOptions("admin")...)
	oldSerial := serial(old)
	rotated := c.PKI.IssueNode(t, n.ID)
	start := time.Now()
	c.WaitFor("a new connection sees the new certificate", func() bool {
		conn, err := tls.Dial("tcp", n.GRPCAddr, c.PKI.ClientTLS())
		if err != nil {
			return false
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.Cmp(rotated.Cert.SerialNumber) == 0
	})
	t.Logf("rotated certificate served after %v (reload interval %v)", time.Since(start).Round(time.Millisecond), c.ReloadInterval)
	if got := serial(old); got != oldSerial {
		t.Fatalf("the connection opened before the rotation was replaced: serial %s, was %s", got, oldSerial)
	}
	fresh := dialWith(t, n.GRPCAddr, c.PKI.DialOptions("admin")...)
	if got := serial(fresh); got != rotated.Cert.SerialNumber.String() {
		t.Fatalf("a new gRPC connection got serial %s, want the rotated %s", got, rotated.Cert.SerialNumber)
	}
}

// syncBuffer is a log sink shared by goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestHTTPSAuditReflection: the HTTP port serves TLS with the node's
// certificate (and plain HTTP is refused there); /debug/pprof is not on
// it; reflection answers only an authenticated caller; a write is logged
// with its principal on the node that took it and on the leader.
func TestHTTPSAuditReflection(t *testing.T) {
	logs := &syncBuffer{}
	c := NewSecure(t, 2, func(o *server.Options) {
		o.Server.HTTPAddr = "127.0.0.1:0"
		o.Server.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	n := c.Nodes[0]
	httpAddr := n.HTTPAddr()
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: c.PKI.ClientTLS()}}
	resp, err := hc.Get("https://" + httpAddr + "/healthz")
	if err != nil {
		t.Fatalf("GET https /healthz: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET https /healthz: %s", resp.Status)
	}
	if resp, err := hc.Get("https://" + httpAddr + "/debug/pprof/"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Error("/debug/pprof/ is served on the HTTP port")
		}
	}
	if resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + httpAddr + "/healthz"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Fatal("plain HTTP answered 200 on the TLS port")
		}
	}

	anon := dialWith(t, n.GRPCAddr, grpc.WithTransportCredentials(credentials.NewTLS(c.PKI.ClientTLS())))
	listServices := func(conn *grpc.ClientConn) error {
		s, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx(t))
		if err != nil {
			return err
		}
		// A stream the server ended says why on Recv (Send sees io.EOF).
		if err := s.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		_, err = s.Recv()
		return err
	}
	wantCode(t, "reflection without a credential", listServices(anon), codes.Unauthenticated)
	if err := listServices(dialWith(t, n.GRPCAddr, c.PKI.DialOptions("client")...)); err != nil {
		t.Fatalf("reflection with a client token: %v", err)
	}

	f := c.Follower()
	if _, err := pb.NewAdminServiceClient(dialWith(t, f.GRPCAddr, c.PKI.DialOptions("editor")...)).PutRule(ctx(t), &pb.PutRuleRequest{Rule: tokenBucket("audited", 1)}); err != nil {
		t.Fatal(err)
	}
	_, err = pb.NewAdminServiceClient(dialWith(t, f.GRPCAddr, c.PKI.DialOptions("viewer")...)).DeleteRule(ctx(t), &pb.DeleteRuleRequest{Name: "audited"})
	wantCode(t, "viewer: DeleteRule", err, codes.PermissionDenied)
	// The follower audits the caller; the leader audits the caller and the
	// peer that forwarded the write (issue 20 item 9: principal=X via=node:Y).
	for _, want := range []string{
		"msg=audit method=/tokenserver.v1.AdminService/PutRule principal=token:editor-user code=OK",
		"msg=audit method=/tokenserver.v1.AdminService/PutRule principal=token:editor-user via=peer:node:" + f.ID + " code=OK",
	} {
		if got := strings.Count(logs.String(), want); got != 1 {
			t.Errorf("%d audit lines %q, want 1:\n%s", got, want, logs.String())
		}
	}
	if !strings.Contains(logs.String(), `msg="audit: write refused" method=/tokenserver.v1.AdminService/DeleteRule`) {
		t.Errorf("no log of the refused write:\n%s", logs.String())
	}
}

// TestInsecureReported: a node started with --insecure says so in
// NodeStatus.
func TestInsecureReported(t *testing.T) {
	c := NewWith(t, 1, func(o *server.Options) { o.Server.Security.Insecure = true })
	ns, err := c.Nodes[0].Admin().NodeStatus(ctx(t), &pb.NodeStatusRequest{})
	if err != nil || !ns.GetInsecure() {
		t.Fatalf("NodeStatus insecure = %v, %v", ns.GetInsecure(), err)
	}
}
