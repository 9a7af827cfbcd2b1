package testcluster

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/tokenserver/tokenserver/internal/auth"
	"github.com/tokenserver/tokenserver/internal/server"
	"github.com/tokenserver/tokenserver/internal/tlsutil"
)

// PKI is a test certificate authority on disk, as `tokenctl certs` lays one
// out: ca.crt, a certificate per node (ID.crt, ID.key: 127.0.0.1,
// localhost and tokenserver://node/ID), and a token file with one token
// per role.
type PKI struct {
	// Dir holds the files.
	Dir string
	// CA signs every certificate; CAFile is its certificate.
	CA     *tlsutil.CA
	CAFile string
	// TokenFile is the --auth-tokens file; Tokens maps each role (client,
	// viewer, editor, admin) to a token it lists for principal "ROLE-user".
	TokenFile string
	Tokens    map[string]string
}

// NewPKI makes a CA, node certificates for ids and a token file in a
// temporary directory.
func NewPKI(t testing.TB, ids ...string) *PKI {
	t.Helper()
	p := &PKI{Dir: t.TempDir(), Tokens: map[string]string{}}
	var err error
	if p.CA, err = tlsutil.NewCA("test CA", time.Hour); err != nil {
		t.Fatal(err)
	}
	p.CAFile = filepath.Join(p.Dir, "ca.crt")
	if err := os.WriteFile(p.CAFile, p.CA.CertPEM, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		p.IssueNode(t, id)
	}
	var lines []string
	for _, role := range []string{"client", "viewer", "editor", "admin"} {
		r, _ := auth.ParseRole(role)
		tok, line, err := auth.NewToken(role+"-user", r)
		if err != nil {
			t.Fatal(err)
		}
		p.Tokens[role] = tok
		lines = append(lines, line)
	}
	p.TokenFile = filepath.Join(p.Dir, "tokens")
	if err := os.WriteFile(p.TokenFile, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// IssueNode (re)writes node id's certificate and key, signed by the CA.
func (p *PKI) IssueNode(t testing.TB, id string) *tlsutil.KeyPair {
	t.Helper()
	kp, err := p.CA.Issue(tlsutil.CertRequest{CommonName: id, DNSNames: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)},
		URIs: []*url.URL{tlsutil.NodeURI(id)}, Server: true, Client: true, Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	cert, key := p.NodeFiles(id)
	if err := kp.WriteFiles(cert, key); err != nil {
		t.Fatal(err)
	}
	return kp
}

// NodeFiles are node id's certificate and key files.
func (p *PKI) NodeFiles(id string) (cert, key string) {
	return filepath.Join(p.Dir, id+".crt"), filepath.Join(p.Dir, id+".key")
}

// NodeArgs are tokenserver's flags for node id: TLS with its certificate,
// client certificates requested and verified against the CA (also the peer
// CA), and the token file.
func (p *PKI) NodeArgs(id string) []string {
	cert, key := p.NodeFiles(id)
	return []string{"--tls-cert", cert, "--tls-key", key, "--tls-client-ca", p.CAFile, "--tls-client-auth", "request", "--auth-tokens", p.TokenFile}
}

// Security is what NodeArgs configure, in process: the Reloader and the
// Authenticator stop in t.Cleanup. interval is how often files are
// re-read (0: the default).
func (p *PKI) Security(t testing.TB, id string, interval time.Duration) server.Security {
	t.Helper()
	cert, key := p.NodeFiles(id)
	rl, err := tlsutil.New(tlsutil.Files{CertFile: cert, KeyFile: key, ClientCAFile: p.CAFile}, tlsutil.Options{Interval: interval})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rl.Close)
	az, err := auth.New(auth.Options{TokenFile: p.TokenFile, ClientCerts: true, ReloadInterval: interval})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(az.Close)
	return server.Security{TLS: rl, ClientAuth: tlsutil.ClientAuthRequest, HTTPTLS: true, Auth: az}
}

// ClientTLS is a client's TLS config that trusts the CA.
func (p *PKI) ClientTLS() *tls.Config {
	pool := x509.NewCertPool()
	pool.AddCert(p.CA.Cert)
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}

// DialOptions dial a node over TLS with role's bearer token.
func (p *PKI) DialOptions(role string) []grpc.DialOption {
	return []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(p.ClientTLS())),
		grpc.WithPerRPCCredentials(auth.BearerToken{Token: p.Tokens[role]})}
}
