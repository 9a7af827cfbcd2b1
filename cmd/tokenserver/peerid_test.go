package main

import (
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/server"
	"github.com/tokenserver/tokenserver/internal/testcluster"
	"github.com/tokenserver/tokenserver/internal/tlsutil"
)

// TestPeerIDPatternAndDenySerialsFlags: --peer-id-pattern lets a SPIFFE
// certificate be node ID's peer certificate, and the node refuses to start
// under another id, naming the flag and the URI it lacks; a bad pattern
// and the TLS-only flags without --tls-cert are refused; --tls-deny-serials
// reaches the reloader that auth asks.
func TestPeerIDPatternAndDenySerialsFlags(t *testing.T) {
	pki := testcluster.NewPKI(t, "n0")
	spiffe, _ := url.Parse("spiffe://td/ns/x/n0")
	kp, err := pki.CA.Issue(tlsutil.CertRequest{CommonName: "n0", DNSNames: []string{"localhost"}, URIs: []*url.URL{spiffe}, Server: true, Client: true, Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	cert, key := filepath.Join(pki.Dir, "spiffe.crt"), filepath.Join(pki.Dir, "spiffe.key")
	if err := kp.WriteFiles(cert, key); err != nil {
		t.Fatal(err)
	}
	deny := filepath.Join(pki.Dir, "deny")
	if err := os.WriteFile(deny, []byte(fmt.Sprintf("# revoked\n%X\n", kp.Cert.SerialNumber)), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	base := []string{"--data-dir", filepath.Join(dir, "data"), "--http-addr", "", "--raft-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0",
		"--tls-client-ca", pki.CAFile, "--auth-tokens", pki.TokenFile}
	args := func(prefix []string, more ...string) []string { return append(append([]string{}, prefix...), more...) }
	withTLS := args(base, "--tls-cert", cert, "--tls-key", key)
	for _, tc := range []struct {
		name string
		args []string
		want []string // empty: accepted
	}{
		{"SPIFFE ID matching the pattern", args(withTLS, "--node-id", "n0", "--peer-id-pattern", "spiffe://td/ns/x/{id}"), nil},
		{"SPIFFE ID of another node", args(withTLS, "--node-id", "n1", "--peer-id-pattern", "spiffe://td/ns/x/{id}"),
			[]string{"--tls-cert", "spiffe://td/ns/x/n1", "tokenserver://node/n1"}},
		{"SPIFFE ID without a pattern", args(withTLS, "--node-id", "n0"),
			[]string{"--tls-cert", "tokenserver://node/n0", "--peer-id-pattern"}},
		{"a pattern that is no URI", args(withTLS, "--node-id", "n0", "--peer-id-pattern", "node-{id}"), []string{"--peer-id-pattern"}},
		{"a deny list without TLS", args(base[:len(base)-4], "--node-id", "n0", "--tls-deny-serials", deny), []string{"--tls-cert"}},
		{"a pattern without TLS", args(base[:len(base)-4], "--node-id", "n0", "--peer-id-pattern", "spiffe://td/{id}"), []string{"--tls-cert"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := parseFlags(tc.args, io.Discard, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			closeSec, err := o.security(slog.New(slog.DiscardHandler))
			if err == nil {
				defer closeSec()
				err = server.CheckPeerCert(&o.cfg.Security, o.raft.NodeID)
			}
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q does not mention %q", err, w)
				}
			}
		})
	}
	o, err := parseFlags(args(withTLS, "--node-id", "n0", "--tls-deny-serials", deny), io.Discard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	closeSec, err := o.security(slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer closeSec()
	if !o.cfg.Security.TLS.SerialDenied(kp.Cert) {
		t.Fatal("--tls-deny-serials: the listed serial is not denied")
	}
	other := pki.IssueNode(t, "n2")
	if o.cfg.Security.TLS.SerialDenied(other.Cert) {
		t.Fatal("--tls-deny-serials: a serial not listed is denied")
	}
}
