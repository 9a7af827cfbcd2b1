package main

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/tokenserver/tokenserver/internal/auth"
	"github.com/tokenserver/tokenserver/internal/tlsutil"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

func readCert(t *testing.T, name string) *x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(data)
	if b == nil {
		t.Fatalf("%s: no PEM", name)
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestCerts: create-ca, create-node and create-client write a CA and
// certificates that chain to it, with the node id in a URI SAN, the SANs
// asked for, roles as OU, private keys 0600, and refuse to overwrite.
func TestCerts(t *testing.T) {
	dir := t.TempDir()
	run := func(args ...string) result {
		return tokenctl(t, "", append([]string{"certs", "--out-dir", dir}, args...)...)
	}
	for _, args := range [][]string{
		{"create-ca"},
		{"create-node", "tokenserver-0", "--dns", "tokenserver-0.peers", "--dns", "localhost", "--ip", "127.0.0.1"},
		{"create-node", "shared", "--node-id", "tokenserver-0,tokenserver-1", "--node-id", "tokenserver-2"},
		{"create-client", "ci", "--role", "editor,client"},
	} {
		if r := run(args...); r.err != nil {
			t.Fatalf("certs %v: %v", args, r.err)
		}
	}
	ca := readCert(t, filepath.Join(dir, "ca.crt"))
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	node := readCert(t, filepath.Join(dir, "tokenserver-0.crt"))
	if _, err := node.Verify(x509.VerifyOptions{Roots: roots, DNSName: "tokenserver-0.peers", KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("node certificate: %v", err)
	}
	if !tlsutil.HasNodeID(node, "tokenserver-0") || len(node.IPAddresses) != 1 || !node.IPAddresses[0].Equal(net.IPv4(127, 0, 0, 1)) {
		t.Errorf("node SANs: URIs %v IPs %v", node.URIs, node.IPAddresses)
	}
	shared := readCert(t, filepath.Join(dir, "shared.crt"))
	if ids := tlsutil.NodeIDs(shared); strings.Join(ids, " ") != "tokenserver-0 tokenserver-1 tokenserver-2" || shared.DNSNames[0] != "shared" {
		t.Errorf("shared node certificate: ids %v, DNS %v", ids, shared.DNSNames)
	}
	client := readCert(t, filepath.Join(dir, "ci.crt"))
	if _, err := client.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("client certificate: %v", err)
	}
	if got := strings.Join(client.Subject.OrganizationalUnit, ","); got != "client,editor" || tlsutil.HasNodeID(client, "ci") {
		t.Errorf("client OU %q, URIs %v", got, client.URIs)
	}
	for _, k := range []string{"ca.key", "tokenserver-0.key", "ci.key"} {
		if fi, err := os.Stat(filepath.Join(dir, k)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: %v, mode %v; want 0600", k, err, fi.Mode())
		}
	}
	if r := run("create-ca"); r.err == nil || !strings.Contains(r.err.Error(), "--force") {
		t.Errorf("create-ca over an existing CA: %v, want a refusal naming --force", r.err)
	}
	if r := run("create-client", "x", "--role", "root"); r.err == nil {
		t.Error("an unknown role was accepted")
	}
	if r := tokenctl(t, "", "certs", "--out-dir", t.TempDir(), "create-node", "n1"); r.err == nil || !strings.Contains(r.err.Error(), "create-ca") {
		t.Errorf("create-node without a CA: %v", r.err)
	}
}

// TestCertsKubernetesSecret: --kubernetes-secret prints a Secret that
// decodes strictly into a kubernetes.io/tls Secret with the three keys.
func TestCertsKubernetesSecret(t *testing.T) {
	dir := t.TempDir()
	if r := tokenctl(t, "", "certs", "--out-dir", dir, "create-ca"); r.err != nil {
		t.Fatal(r.err)
	}
	r := tokenctl(t, "", "certs", "--out-dir", dir, "create-node", "n1", "--kubernetes-secret", "tokenserver-tls", "--namespace", "rl")
	if r.err != nil {
		t.Fatal(r.err)
	}
	var s corev1.Secret
	if err := yaml.UnmarshalStrict([]byte(r.stdout), &s); err != nil {
		t.Fatalf("not a Secret: %v\n%s", err, r.stdout)
	}
	if s.Kind != "Secret" || s.Name != "tokenserver-tls" || s.Namespace != "rl" || s.Type != corev1.SecretTypeTLS {
		t.Errorf("Secret %s/%s kind %s type %s", s.Namespace, s.Name, s.Kind, s.Type)
	}
	crt, _ := os.ReadFile(filepath.Join(dir, "n1.crt"))
	ca, _ := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if string(s.Data["tls.crt"]) != string(crt) || string(s.Data["ca.crt"]) != string(ca) || len(s.Data["tls.key"]) == 0 {
		t.Error("the Secret's data are not the files")
	}
}

func TestTokenCreate(t *testing.T) {
	r := tokenctl(t, "", "token", "create", "ci", "editor", "-o", "json")
	if r.err != nil {
		t.Fatal(r.err)
	}
	var out map[string]string
	decode(t, r.stdout, &out)
	if out["line"] != auth.TokenLine(out["token"], "ci", auth.RoleEditor) || strings.Contains(out["line"], out["token"]) {
		t.Errorf("token create: %v", out)
	}
	if r := tokenctl(t, "", "token", "create", "ci", "root"); r.err == nil {
		t.Error("an unknown role was accepted")
	}
}

// rulesStub answers ListRules with no rules.
type rulesStub struct {
	pb.UnimplementedAdminServiceServer
}

func (rulesStub) ListRules(context.Context, *pb.ListRulesRequest) (*pb.ListRulesResponse, error) {
	return &pb.ListRulesResponse{}, nil
}

// TestTLSAndToken: against a TLS server with token auth, tokenctl needs
// --tls-ca (or its env twin) and a viewer token; a client certificate with
// a role works in place of the token.
func TestTLSAndToken(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{{"create-ca"}, {"create-node", "n1", "--ip", "127.0.0.1"}, {"create-client", "dash", "--role", "viewer"}} {
		if r := tokenctl(t, "", append([]string{"certs", "--out-dir", dir}, args...)...); r.err != nil {
			t.Fatal(r.err)
		}
	}
	path := func(n string) string { return filepath.Join(dir, n) }
	tok, line, err := auth.NewToken("dash", auth.RoleViewer)
	if err != nil {
		t.Fatal(err)
	}
	tokens := path("tokens")
	if err := os.WriteFile(tokens, []byte(line+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	rl, err := tlsutil.New(tlsutil.Files{CertFile: path("n1.crt"), KeyFile: path("n1.key"), ClientCAFile: path("ca.crt")}, tlsutil.Options{Interval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer rl.Close()
	cfg, err := rl.ServerConfig(tlsutil.ClientAuthRequest)
	if err != nil {
		t.Fatal(err)
	}
	az, err := auth.New(auth.Options{TokenFile: tokens, ClientCerts: true, ReloadInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer az.Close()
	srv := grpc.NewServer(grpc.Creds(auth.ServerCredentials(cfg, rl)), grpc.UnaryInterceptor(az.UnaryInterceptor()))
	pb.RegisterAdminServiceServer(srv, rulesStub{})
	healthpb.RegisterHealthServer(srv, health.NewServer())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Stop()
	addr := ln.Addr().String()

	list := func(args ...string) result {
		return tokenctl(t, "", append([]string{"--server", addr, "--timeout", "2s", "rule", "list"}, args...)...)
	}
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want string // "" for success, else in the error
	}{
		{"plaintext", nil, nil, "Unavailable"},
		{"TLS without a credential", nil, []string{"--tls-ca", path("ca.crt")}, "Unauthenticated"},
		{"TLS and token", nil, []string{"--tls-ca", path("ca.crt"), "--token", tok}, ""},
		{"env twins", map[string]string{tlsCAEnv: path("ca.crt"), tokenEnv: tok}, nil, ""},
		{"server name", nil, []string{"--tls-ca", path("ca.crt"), "--tls-server-name", "n1.example", "--token", tok}, "Unavailable"},
		{"client certificate", nil, []string{"--tls-ca", path("ca.crt"), "--tls-cert", path("dash.crt"), "--tls-key", path("dash.key")}, ""},
		{"cert without key", nil, []string{"--tls-ca", path("ca.crt"), "--tls-cert", path("dash.crt")}, "go together"},
		{"wrong token", nil, []string{"--tls-ca", path("ca.crt"), "--token", "nope"}, "Unauthenticated"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			r := list(tt.args...)
			switch {
			case tt.want == "" && r.err != nil:
				t.Errorf("rule list: %v", r.err)
			case tt.want != "" && (r.err == nil || !strings.Contains(r.err.Error(), tt.want)):
				t.Errorf("rule list: %v, want an error with %q", r.err, tt.want)
			}
		})
	}
}

// TestTokenCreateAppend: --append adds the new line to the token file,
// keeping the other lines byte for byte and the file's mode, creates a
// missing file 0600, and the server's parser reads the result.
func TestTokenCreateAppend(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "tokens")
	_, old, err := auth.NewToken("old", auth.RoleViewer)
	if err != nil {
		t.Fatal(err)
	}
	orig := "# ops tokens\n\n" + old // no final newline
	if err := os.WriteFile(file, []byte(orig), 0o640); err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, p := range []string{"ci", "svc"} {
		r := tokenctl(t, "", "token", "create", p, "editor", "--append", file, "-o", "json")
		if r.err != nil {
			t.Fatal(r.err)
		}
		var out map[string]string
		decode(t, r.stdout, &out)
		if out["file"] != file || out["line"] != auth.TokenLine(out["token"], p, auth.RoleEditor) {
			t.Fatalf("token create --append: %v", out)
		}
		lines = append(lines, out["line"])
	}
	got, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if want := orig + "\n" + lines[0] + "\n" + lines[1] + "\n"; string(got) != want {
		t.Errorf("file after two appends:\n%q\nwant\n%q", got, want)
	}
	if fi, _ := os.Stat(file); fi.Mode().Perm() != 0o640 {
		t.Errorf("mode %v, want 0640 kept", fi.Mode().Perm())
	}
	az, err := auth.New(auth.Options{TokenFile: file, ReloadInterval: -1})
	if err != nil {
		t.Fatalf("the server does not read the appended file: %v", err)
	}
	az.Close()
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("temporary files left beside the token file: %v", entries)
	}

	fresh := filepath.Join(dir, "new-tokens")
	if r := tokenctl(t, "", "token", "create", "ci", "client", "--append", fresh); r.err != nil || !strings.Contains(r.stdout, "appended the line to "+fresh) {
		t.Fatalf("token create --append to a missing file: %v\n%s", r.err, r.stdout)
	}
	if fi, err := os.Stat(fresh); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("new token file: %v, want mode 0600", err)
	}
	if r := tokenctl(t, "", "token", "create", "ci", "client", "--append", filepath.Join(dir, "no-dir", "tokens")); r.err == nil {
		t.Error("--append into a missing directory succeeded")
	}
}
