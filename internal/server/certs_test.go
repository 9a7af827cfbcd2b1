package server_test

import (
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/server"
	"github.com/tokenserver/tokenserver/internal/testcluster"
	"github.com/tokenserver/tokenserver/internal/tlsutil"
)

// TestMisconfiguredPeerCertRefused: a node whose peer certificate other
// nodes would refuse does not start; the error names the flag and the
// missing tokenserver://node/ID URI.
func TestMisconfiguredPeerCertRefused(t *testing.T) {
	pki := testcluster.NewPKI(t, "n0", "n1")
	spiffe, _ := url.Parse("spiffe://example.org/ns/default/sa/tokenserver")
	kp, err := pki.CA.Issue(tlsutil.CertRequest{CommonName: "n0", DNSNames: []string{"localhost"}, URIs: []*url.URL{spiffe}, Server: true, Client: true, Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	spCert, spKey := filepath.Join(pki.Dir, "spiffe.crt"), filepath.Join(pki.Dir, "spiffe.key")
	if err := kp.WriteFiles(spCert, spKey); err != nil {
		t.Fatal(err)
	}
	n1Cert, n1Key := pki.NodeFiles("n1")
	n0Cert, n0Key := pki.NodeFiles("n0")
	for _, tc := range []struct {
		name, cert, key string
		want            []string // empty: accepted
	}{
		{"a SPIFFE ID and a shared CA", spCert, spKey, []string{"--peer-tls-cert", "tokenserver://node/n0", "spiffe://example.org"}},
		{"another node's certificate", n1Cert, n1Key, []string{"--peer-tls-cert", "tokenserver://node/n1", "not tokenserver://node/n0"}},
		{"its own certificate", n0Cert, n0Key, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rl, err := tlsutil.New(tlsutil.Files{CertFile: tc.cert, KeyFile: tc.key, ClientCAFile: pki.CAFile}, tlsutil.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer rl.Close()
			err = server.CheckPeerCert(&server.Security{TLS: rl}, "n0")
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
}

// TestMetricsProtected: with MetricsAuth "token", /metrics needs a bearer
// token with the viewer role (401 without one, 403 without the role),
// and it exports the served certificate's expiry.
func TestMetricsProtected(t *testing.T) {
	c := testcluster.NewSecure(t, 1, func(o *server.Options) {
		o.Server.HTTPAddr = "127.0.0.1:0"
		o.Server.MetricsAuth = "token"
	})
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: c.PKI.ClientTLS()}, Timeout: 5 * time.Second}
	get := func(token string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", "https://"+c.Nodes[0].HTTPAddr()+"/metrics", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, tc := range []struct {
		token string
		code  int
	}{{"", 401}, {"not-a-token", 401}, {c.PKI.Tokens["client"], 403}, {c.PKI.Tokens["viewer"], 200}} {
		code, body := get(tc.token)
		if code != tc.code {
			t.Fatalf("token %q: %d, want %d: %s", tc.token, code, tc.code, body)
		}
		if code == 200 && !strings.Contains(body, `tokenserver_tls_cert_not_after_seconds{cert="server"}`) {
			t.Fatal("no tokenserver_tls_cert_not_after_seconds")
		}
	}
	if _, err := server.New(server.Config{GRPCAddr: "127.0.0.1:0", MaxRecvMsgSize: 1 << 20, DefaultDeadline: time.Second, SweepInterval: time.Second, MetricsAuth: "token"}, server.Deps{}); err == nil || !strings.Contains(err.Error(), "MetricsAuth") {
		t.Fatalf("MetricsAuth token without auth: %v", err)
	}
}
