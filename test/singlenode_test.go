//go:build multiprocess

package e2e

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestSingleNode drives one tokenserver process with tokenctl the way the
// README's tour does.
func TestSingleNode(t *testing.T) {
	s := startServer(t, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--data-dir", t.TempDir())
	// Live at once; ready once the one-node Raft cluster has elected itself
	// and set its routing view (about a second).
	for _, path := range []string{"/healthz", "/readyz"} {
		deadline := time.Now().Add(30 * time.Second)
		for {
			resp, err := http.Get(fmt.Sprintf("http://%s%s", s.httpAddr, path))
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
			if path == "/healthz" || time.Now().After(deadline) {
				t.Fatalf("GET %s: %d %s", path, resp.StatusCode, body)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	ctlJSON(t, s.grpcAddr, "rule", "put", "login", "--algorithm", "token-bucket", "--limit", "3", "--period", "1m")
	got := ctlJSON(t, s.grpcAddr, "acquire", "login", "alice", "--count", "5")
	if got["allowed"] != float64(3) || got["denied"] != float64(2) {
		t.Fatalf("acquire 5 of a limit-3 rule: %v, want 3 allowed, 2 denied", got)
	}

	rules := filepath.Join(t.TempDir(), "rules.yaml")
	yaml := `name: search
algorithm: SLIDING_WINDOW
limit: 100
period: 1s
sampleCount: 10
---
- name: uploads
  algorithm: CONCURRENCY
  limit: 2
  period: 30s
- name: ip
  algorithm: FIXED_WINDOW
  limit: 1000
  period: 1m
  deny: ["10.0.0.66"]
`
	if err := os.WriteFile(rules, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, errs, code := ctl(t, s.grpcAddr, "rule", "apply", "-f", rules); code != 0 {
		t.Fatalf("rule apply: exit %d\n%s%s", code, out, errs)
	}
	list := ctlJSON(t, s.grpcAddr, "rule", "list")
	names := []string{}
	for _, r := range list["rules"].([]any) {
		names = append(names, r.(map[string]any)["name"].(string))
	}
	if strings.Join(names, ",") != "ip,login,search,uploads" {
		t.Fatalf("rule list: %v", names)
	}

	// Errors exit non-zero with a message; denials do not.
	if _, errs, code := ctl(t, s.grpcAddr, "acquire", "nope", "k"); code == 0 || !strings.Contains(errs, "not found") {
		t.Fatalf("acquire on an unknown rule: exit %d, stderr %q", code, errs)
	}
	if _, errs, code := ctl(t, s.grpcAddr, "acquire", "login", "bob", "--permits", "4"); code == 0 || !strings.Contains(errs, "capacity") {
		t.Fatalf("acquire above capacity: exit %d, stderr %q", code, errs)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("name: x\nlimit: [1\n"), 0o644)
	if _, errs, code := ctl(t, s.grpcAddr, "rule", "apply", "-f", bad); code == 0 || !strings.Contains(errs, "line") {
		t.Fatalf("malformed YAML: exit %d, stderr %q (want the line named)", code, errs)
	}
	if out := ctlJSON(t, s.grpcAddr, "acquire", "ip", "10.0.0.66"); out["denied"] != float64(1) {
		t.Fatalf("deny-listed key: %v", out)
	}
	s.stop(t)
}
