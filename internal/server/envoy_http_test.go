package server_test

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/tokenserver/tokenserver/internal/envoyrls"
	"github.com/tokenserver/tokenserver/internal/server"
	"github.com/tokenserver/tokenserver/internal/testcluster"
)

// httpPost returns the status and body of POST url (GET when body is
// empty).
func httpPost(t *testing.T, url, body string) (int, []byte) {
	t.Helper()
	c := http.Client{Timeout: 5 * time.Second}
	var resp *http.Response
	var err error
	if body == "" {
		resp, err = c.Get(url)
	} else {
		resp, err = c.Post(url, "application/json", strings.NewReader(body))
	}
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// TestEnvoyConfigDirReadiness: a node started with an --envoy-config-dir
// that does not load is not ready, and /readyz names the directory, the
// file, the line and the problem; once the directory is fixed the node is
// ready and serves it. Then /json on the node's HTTP port answers as the
// reference's handler over MemDecider does, for the same files and
// requests (bodies and HTTP statuses: 200, 429, 400).
func TestEnvoyConfigDirReadiness(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "edge.yaml")
	bad := "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"
	if err := os.WriteFile(file, []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	c := testcluster.NewWith(t, 1, func(o *server.Options) {
		o.Server.HTTPAddr = "127.0.0.1:0"
		o.Server.Envoy.ConfigDir, o.Server.Envoy.PollInterval = dir, 20*time.Millisecond
	})
	base := "http://" + c.Nodes[0].HTTPAddr()
	var why string
	c.WaitFor("/readyz to say why", func() bool {
		code, body := httpPost(t, base+"/readyz", "")
		why = string(body)
		return code == http.StatusServiceUnavailable && strings.Contains(why, "fortnight")
	})
	for _, want := range []string{"--envoy-config-dir " + dir, "edge.yaml: line 3", "fortnight"} {
		if !strings.Contains(why, want) {
			t.Errorf("/readyz says %q, which does not name %q", why, want)
		}
	}
	if err := os.WriteFile(file, []byte(envoyYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	c.WaitFor("ready once the directory loads", func() bool {
		code, _ := httpPost(t, base+"/readyz", "")
		return code == http.StatusOK
	})
	c.WaitFor("the domain replicated", func() bool { return len(c.Nodes[0].Cluster().EnvoyDomains().Domains) == 1 })

	cfg, err := envoyrls.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	ref := envoyrls.NewService(func() *envoyrls.Config { return cfg }, envoyrls.NewMemDecider(), envoyrls.Options{})
	refSrv := httptest.NewServer(envoyrls.NewJSONHandler(ref.ShouldRateLimit))
	defer refSrv.Close()
	for i, body := range []string{
		`{"domain":"edge","descriptors":[{"entries":[{"key":"path","value":"/login"}]}]}`,
		`{"domain":"edge","descriptors":[{"entries":[{"key":"path","value":"/login"}]}]}`,
		`{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"10.1.1.1"}]},{"entries":[{"key":"tenant","value":"t"},{"key":"plan","value":"free"}]}],"hitsAddend":2}`,
		`{"domain":"other","descriptors":[{"entries":[{"key":"a","value":"b"}]}]}`,
		`{"domain":"","descriptors":[{"entries":[{"key":"a","value":"b"}]}]}`,
		`{"domain":"edge","descriptors":[{"entries":[{"key":"a","value":"b"}],"limit":{"requestsPerUnit":1}}]}`,
		`not json`,
	} {
		gotCode, got := httpPost(t, base+"/json", body)
		wantCode, want := httpPost(t, refSrv.URL, body)
		if gotCode != wantCode {
			t.Fatalf("request %d %s: HTTP %d, the reference's handler %d (%s)", i, body, gotCode, wantCode, want)
		}
		if gotCode == http.StatusBadRequest {
			if !bytes.Equal(got, want) {
				t.Fatalf("request %d: %q, want %q", i, got, want)
			}
			continue
		}
		var g, w rlpb.RateLimitResponse
		if err := protojson.Unmarshal(got, &g); err != nil {
			t.Fatalf("request %d: %v: %s", i, err, got)
		}
		if err := protojson.Unmarshal(want, &w); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(normalize(&g), normalize(&w)) {
			t.Fatalf("request %d %s:\n got %s\nwant %s", i, body, got, want)
		}
	}
}
