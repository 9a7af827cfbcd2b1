package auth

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/tokenserver/tokenserver/internal/tlsutil"
	peerv1 "github.com/tokenserver/tokenserver/proto/tokenserver/peer/v1"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// Tokens of the test token file.
const (
	clientTok = "client-token-0123456789"
	viewerTok = "viewer-token-0123456789"
	editorTok = "editor-token-0123456789"
	adminTok  = "admin-token-0123456789"
)

func writeTokens(t testing.TB, dir string, lines ...string) string {
	t.Helper()
	name := filepath.Join(dir, "tokens")
	if err := os.WriteFile(name, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return name
}

func testTokenFile(t *testing.T) string {
	t.Helper()
	return writeTokens(t, t.TempDir(),
		"# tokens of the test",
		TokenLine(clientTok, "svc", RoleClient),
		TokenLine(viewerTok, "dash", RoleViewer),
		"",
		TokenLine(editorTok, "ci", RoleEditor),
		TokenLine(adminTok, "ops", RoleAdmin),
	)
}

func newAuth(t testing.TB, o Options) *Authenticator {
	t.Helper()
	if o.ReloadInterval == 0 {
		o.ReloadInterval = -1
	}
	a, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	return a
}

// withToken is a server-side incoming context with an authorization header.
func withToken(ctx context.Context, header string) context.Context {
	return metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", header))
}

// withCert is a server-side context of a connection whose principal p was
// identified at the handshake.
func withCert(ctx context.Context, p *Principal) context.Context {
	return peer.NewContext(ctx, &peer.Peer{AuthInfo: AuthInfo{Principal: p}})
}

// TestMethodTable: every method of the two services has its own entry (a
// new RPC must be placed deliberately), and the table says what the issue
// says.
func TestMethodTable(t *testing.T) {
	for _, sd := range []grpc.ServiceDesc{pb.TokenService_ServiceDesc, pb.AdminService_ServiceDesc, peerv1.HandoffService_ServiceDesc, peerv1.ReplicaService_ServiceDesc} {
		var names []string
		for _, m := range sd.Methods {
			names = append(names, m.MethodName)
		}
		for _, s := range sd.Streams {
			names = append(names, s.StreamName)
		}
		for _, n := range names {
			full := "/" + sd.ServiceName + "/" + n
			if _, ok := methods[full]; !ok {
				t.Errorf("%s has no entry in the role table", full)
			}
		}
	}
	want := map[string]string{
		pb.TokenService_AcquireToken_FullMethodName:                 "client",
		pb.TokenService_WatchClusterView_FullMethodName:             "client",
		pb.AdminService_GetRule_FullMethodName:                      "viewer",
		pb.AdminService_NodeStatus_FullMethodName:                   "viewer",
		pb.AdminService_SnapshotSave_FullMethodName:                 "viewer",
		pb.AdminService_PutRule_FullMethodName:                      "editor",
		pb.AdminService_DeleteRule_FullMethodName:                   "editor",
		pb.AdminService_JoinCluster_FullMethodName:                  "admin",
		pb.AdminService_RemoveMember_FullMethodName:                 "admin",
		pb.AdminService_SnapshotRestore_FullMethodName:              "admin",
		peerv1.HandoffService_Transfer_FullMethodName:               "admin",
		"/grpc.health.v1.Health/Check":                              "open",
		"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo": "authenticated",
		"/tokenserver.v1.AdminService/SomethingNew":                 "admin",
	}
	for m, w := range want {
		if got := Requirement(m); got != w {
			t.Errorf("Requirement(%s) = %s, want %s", m, got, w)
		}
	}
	if !IsWrite(pb.AdminService_PutRule_FullMethodName) || IsWrite(pb.AdminService_GetRule_FullMethodName) {
		t.Error("IsWrite")
	}
}

func TestParseTokens(t *testing.T) {
	good := TokenLine("x", "alice", RoleEditor|RoleClient)
	tests := []struct {
		name, file, wantErr string
	}{
		{"ok", "# c\n\n" + good + "\n", ""},
		{"a raw token", "x alice editor", "sha256:"},
		{"short hex", "sha256:abcd alice editor", "64 hex"},
		{"bad role", strings.Replace(good, "client,editor", "root", 1), "unknown role"},
		{"two fields", "sha256:" + strings.Repeat("a", 64) + " alice", "fields"},
		{"duplicate", good + "\n" + strings.Replace(good, "alice", "bob", 1), "twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tab, err := parseTokens([]byte(tt.file), "tokens")
			if tt.wantErr == "" {
				if err != nil || len(tab) != 1 {
					t.Fatalf("parse: %v, %d entries", err, len(tab))
				}
				for _, p := range tab {
					if p.Name != "alice" || !p.Has(RoleEditor) || !p.Has(RoleViewer) || p.Has(RoleAdmin) {
						t.Errorf("principal %+v", p)
					}
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error %v, want %q", err, tt.wantErr)
			}
		})
	}
}

func TestAuthorize(t *testing.T) {
	tokens := testTokenFile(t)
	on := newAuth(t, Options{TokenFile: tokens, ClientCerts: true})
	tokensOnly := newAuth(t, Options{TokenFile: tokens})
	off := newAuth(t, Options{})
	peerP := &Principal{Name: "node:n2", Roles: AllRoles, Source: SourcePeer, NodeID: "n2", have: AllRoles}
	editorCert := newPrincipal("tokenserver://client/ci", RoleEditor, SourceCertificate)
	bg := context.Background()
	const (
		put     = pb.AdminService_PutRule_FullMethodName
		get     = pb.AdminService_GetRule_FullMethodName
		restore = pb.AdminService_SnapshotRestore_FullMethodName
		join    = pb.AdminService_JoinCluster_FullMethodName
		acquire = pb.TokenService_AcquireToken_FullMethodName
		reflect = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
	)
	tests := []struct {
		name     string
		a        *Authenticator
		ctx      context.Context
		method   string
		want     codes.Code
		wantName string // the principal in the returned context
		msg      string // in the error
	}{
		{"auth off", off, bg, restore, codes.OK, "", ""},
		{"no credential", on, bg, acquire, codes.Unauthenticated, "", "no credential"},
		{"health is open", on, bg, "/grpc.health.v1.Health/Check", codes.OK, "", ""},
		{"reflection needs a principal", on, bg, reflect, codes.Unauthenticated, "", ""},
		{"reflection with a client token", on, withToken(bg, "Bearer "+clientTok), reflect, codes.OK, "svc", ""},
		{"client acquires", on, withToken(bg, "Bearer "+clientTok), acquire, codes.OK, "svc", ""},
		{"client cannot put", on, withToken(bg, "Bearer "+clientTok), put, codes.PermissionDenied, "", "lacks role editor"},
		{"viewer reads", on, withToken(bg, "Bearer "+viewerTok), get, codes.OK, "dash", ""},
		{"viewer cannot put", on, withToken(bg, "bearer "+viewerTok), put, codes.PermissionDenied, "", "editor"},
		{"editor puts", on, withToken(bg, "Bearer "+editorTok), put, codes.OK, "ci", ""},
		{"editor reads", on, withToken(bg, "Bearer "+editorTok), get, codes.OK, "ci", ""},
		{"editor cannot restore", on, withToken(bg, "Bearer "+editorTok), restore, codes.PermissionDenied, "", "lacks role admin"},
		{"editor cannot join", on, withToken(bg, "Bearer "+editorTok), join, codes.PermissionDenied, "", "admin"},
		{"editor cannot acquire", on, withToken(bg, "Bearer "+editorTok), acquire, codes.PermissionDenied, "", "client"},
		{"admin restores", on, withToken(bg, "Bearer "+adminTok), restore, codes.OK, "ops", ""},
		{"admin acquires", on, withToken(bg, "Bearer "+adminTok), acquire, codes.OK, "ops", ""},
		{"unknown token", on, withToken(bg, "Bearer nope"), acquire, codes.Unauthenticated, "", "not in the server's token file"},
		{"basic auth", on, withToken(bg, "Basic "+adminTok), acquire, codes.Unauthenticated, "", "Bearer"},
		{"unknown method needs admin", on, withToken(bg, "Bearer "+editorTok), "/x.Y/Z", codes.PermissionDenied, "", "admin"},
		{"cert principal", on, withCert(bg, editorCert), put, codes.OK, "tokenserver://client/ci", ""},
		{"cert without the role", on, withCert(bg, editorCert), restore, codes.PermissionDenied, "", "admin"},
		{"a token decides over a cert", on, withToken(withCert(bg, editorCert), "Bearer "+clientTok), put, codes.PermissionDenied, "", "svc"},
		{"a bad token is not saved by a cert", on, withToken(withCert(bg, editorCert), "Bearer nope"), put, codes.Unauthenticated, "", ""},
		{"certs off: a cert is no credential", tokensOnly, withCert(bg, editorCert), put, codes.Unauthenticated, "", ""},
		{"peer holds every role", tokensOnly, withCert(bg, peerP), join, codes.OK, "node:n2", ""},
		{"peer despite a bad token", on, withToken(withCert(bg, peerP), "Bearer nope"), restore, codes.OK, "node:n2", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, err := tt.a.Authorize(tt.ctx, tt.method)
			if got := status.Code(err); got != tt.want {
				t.Fatalf("code %v (%v), want %v", got, err, tt.want)
			}
			if err != nil {
				if !strings.Contains(err.Error(), tt.msg) {
					t.Errorf("error %q does not say %q", err, tt.msg)
				}
				return
			}
			p, ok := FromContext(ctx)
			if tt.wantName == "" {
				if ok {
					t.Errorf("principal %v in an unauthenticated context", p)
				}
				return
			}
			if !ok || p.Name != tt.wantName {
				t.Errorf("principal %v, want %s", p, tt.wantName)
			}
		})
	}
}

// TestForwardedAuthor: a write a peer forwards carries its author, which
// counts only from a peer.
func TestForwardedAuthor(t *testing.T) {
	a := newAuth(t, Options{TokenFile: testTokenFile(t), ClientCerts: true})
	bg := context.Background()
	// The follower: the editor's call, forwarded on.
	ctx, err := a.Authorize(withToken(bg, "Bearer "+editorTok), pb.AdminService_PutRule_FullMethodName)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := metadata.FromOutgoingContext(ForwardContext(ctx))
	author := out.Get(PrincipalHeader)
	if len(author) != 1 || author[0] != "token:ci" {
		t.Fatalf("forwarded author %v, want token:ci", author)
	}
	// The leader: the follower's peer connection with the header.
	peerP := newPrincipal("node:n2", AllRoles, SourcePeer)
	in := metadata.NewIncomingContext(withCert(bg, peerP), metadata.Pairs(PrincipalHeader, author[0]))
	ctx, err = a.Authorize(in, pb.AdminService_PutRule_FullMethodName)
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := FromContext(ctx); p.Actor() != "token:ci" || !p.IsPeer() {
		t.Errorf("leader sees %+v (actor %s), want the peer acting for token:ci", p, p.Actor())
	}
	// From a client the header is ignored.
	in = metadata.NewIncomingContext(bg, metadata.Pairs(PrincipalHeader, "token:ops", "authorization", "Bearer "+editorTok))
	ctx, err = a.Authorize(in, pb.AdminService_PutRule_FullMethodName)
	if err != nil {
		t.Fatal(err)
	}
	if p, _ := FromContext(ctx); p.Actor() != "token:ci" {
		t.Errorf("a client claimed to be %s", p.Actor())
	}
}

func TestIsPeer(t *testing.T) {
	bg := context.Background()
	peerP := newPrincipal("node:n2", AllRoles, SourcePeer)
	client := newPrincipal("x", AllRoles, SourceCertificate)
	tests := []struct {
		name string
		ctx  context.Context
		want bool
	}{
		{"nothing", bg, false},
		{"peer connection", withCert(bg, peerP), true},
		{"admin client connection", withCert(bg, client), false},
		{"authorized peer", NewContext(bg, peerP), true},
		{"authorized token over a peer connection", NewContext(withCert(bg, peerP), newPrincipal("ops", RoleAdmin, SourceToken)), false},
		{"plain TLS info", peer.NewContext(bg, &peer.Peer{AuthInfo: credentials.TLSInfo{}}), false},
	}
	for _, tt := range tests {
		if got := IsPeer(tt.ctx); got != tt.want {
			t.Errorf("%s: IsPeer = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// TestCertPrincipal: the name is the URI SAN, then the DNS SAN, then the
// CN; roles come from OU values that name roles.
func TestCertPrincipal(t *testing.T) {
	ca, err := tlsutil.NewCA("ca", 0)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		req   tlsutil.CertRequest
		name  string
		roles Role
	}{
		{tlsutil.CertRequest{CommonName: "cn", DNSNames: []string{"d.example"}, URIs: []*url.URL{tlsutil.ClientURI("u")}, OrganizationalUnits: []string{"editor", "ops"}, Client: true}, "tokenserver://client/u", RoleEditor},
		{tlsutil.CertRequest{CommonName: "cn", DNSNames: []string{"d.example"}, Client: true}, "d.example", 0},
		{tlsutil.CertRequest{CommonName: "cn", OrganizationalUnits: []string{"client", "viewer"}, Client: true}, "cn", RoleClient | RoleViewer},
	}
	for _, tt := range tests {
		kp, err := ca.Issue(tt.req)
		if err != nil {
			t.Fatal(err)
		}
		p := identify(&tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{kp.Cert, ca.Cert}}}, nil)
		if p.Name != tt.name || p.Roles != tt.roles || p.Source != SourceCertificate {
			t.Errorf("principal %+v, want %s with %v", p, tt.name, tt.roles)
		}
	}
}

func TestTokenReload(t *testing.T) {
	dir := t.TempDir()
	name := writeTokens(t, dir, TokenLine("old", "a", RoleClient))
	a := newAuth(t, Options{TokenFile: name})
	ctx := func(tok string) context.Context { return withToken(context.Background(), "Bearer "+tok) }
	if _, err := a.Authorize(ctx("old"), pb.TokenService_AcquireToken_FullMethodName); err != nil {
		t.Fatal(err)
	}
	writeTokens(t, dir, TokenLine("new", "b", RoleClient))
	if err := a.Reload(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Authorize(ctx("old"), pb.TokenService_AcquireToken_FullMethodName); status.Code(err) != codes.Unauthenticated {
		t.Errorf("a removed token still works: %v", err)
	}
	if _, err := a.Authorize(ctx("new"), pb.TokenService_AcquireToken_FullMethodName); err != nil {
		t.Errorf("the new token: %v", err)
	}
	writeTokens(t, dir, "garbage")
	if err := a.Reload(); err == nil {
		t.Error("a bad file loaded")
	}
	if _, err := a.Authorize(ctx("new"), pb.TokenService_AcquireToken_FullMethodName); err != nil {
		t.Errorf("a bad file dropped the tokens in use: %v", err)
	}
	if _, err := New(Options{TokenFile: filepath.Join(dir, "missing")}); err == nil {
		t.Error("a missing token file was accepted")
	}
}

func TestNewToken(t *testing.T) {
	tok, line, err := NewToken("ci", RoleEditor)
	if err != nil {
		t.Fatal(err)
	}
	tab, err := parseTokens([]byte(line), "line")
	if err != nil || len(tab) != 1 {
		t.Fatalf("line %q: %v", line, err)
	}
	if strings.Contains(line, tok) || len(tok) < 40 {
		t.Errorf("token %q, line %q", tok, line)
	}
	if _, _, err := NewToken("a b", RoleEditor); err == nil {
		t.Error("a principal with a space")
	}
}

// token context shared by the benchmarks.
func benchCtx(b *testing.B) (*Authenticator, context.Context, context.Context, context.Context) {
	var lines []string
	for i := range 100 {
		lines = append(lines, TokenLine(clientTok+string(rune('a'+i%26))+strings.Repeat("x", i), "svc", RoleClient))
	}
	tok, line, _ := NewToken("bench", RoleClient)
	lines = append(lines, line)
	a := newAuth(b, Options{TokenFile: writeTokens(b, b.TempDir(), lines...), ClientCerts: true})
	bg := context.Background()
	token := withToken(withCert(bg, nil), "Bearer "+tok)
	cert := withCert(bg, newPrincipal("tokenserver://client/x", RoleClient, SourceCertificate))
	peerCtx := withCert(bg, newPrincipal("node:n1", AllRoles, SourcePeer))
	return a, token, cert, peerCtx
}

// BenchmarkAuthorize is the per-call cost of auth in the server's
// interceptor, by credential.
func BenchmarkAuthorize(b *testing.B) {
	a, token, cert, peerCtx := benchCtx(b)
	off := newAuth(b, Options{})
	for _, bc := range []struct {
		name string
		a    *Authenticator
		ctx  context.Context
	}{{"token", a, token}, {"cert", a, cert}, {"peer", a, peerCtx}, {"off", off, token}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb_ *testing.PB) {
				for pb_.Next() {
					if _, err := bc.a.Authorize(bc.ctx, pb.TokenService_AcquireToken_FullMethodName); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkAuthorizeSerial is the same on one goroutine (the latency one
// call adds).
func BenchmarkAuthorizeSerial(b *testing.B) {
	a, token, _, _ := benchCtx(b)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := a.Authorize(token, pb.TokenService_AcquireToken_FullMethodName); err != nil {
			b.Fatal(err)
		}
	}
}
