//go:build multiprocess

package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSecureSingleNode follows the README's "Running it safely" with the
// real binaries: tokenctl certs makes a CA and a node certificate, tokenctl
// token create a token per caller, the node serves TLS with them, and
// tokenctl reaches it only with the CA and a token of the right role; the
// rule shows who wrote it.
func TestSecureSingleNode(t *testing.T) {
	pki := t.TempDir()
	run := func(args ...string) string {
		t.Helper()
		out, errs, code := ctl(t, "127.0.0.1:1", args...)
		if code != 0 {
			t.Fatalf("tokenctl %s: exit %d: %s", strings.Join(args, " "), code, errs)
		}
		return out
	}
	run("certs", "--out-dir", pki, "create-ca")
	run("certs", "--out-dir", pki, "create-node", "n0", "--ip", "127.0.0.1", "--dns", "localhost")
	token := func(principal, roles string) (string, string) {
		var v map[string]string
		if err := json.Unmarshal([]byte(run("token", "create", principal, roles, "-o", "json")), &v); err != nil {
			t.Fatal(err)
		}
		return v["token"], v["line"]
	}
	ci, ciLine := token("ci", "editor")
	svc, svcLine := token("svc", "client")
	tokens := filepath.Join(pki, "tokens")
	if err := os.WriteFile(tokens, []byte(ciLine+"\n"+svcLine+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startServer(t, "--node-id", "n0", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--raft-addr", "127.0.0.1:0", "--data-dir", t.TempDir(),
		"--tls-cert", filepath.Join(pki, "n0.crt"), "--tls-key", filepath.Join(pki, "n0.key"), "--tls-client-ca", filepath.Join(pki, "ca.crt"), "--auth-tokens", tokens)
	ca := filepath.Join(pki, "ca.crt")

	if _, errs, code := ctl(t, s.grpcAddr, "--timeout", "3s", "rule", "list"); code == 0 {
		t.Fatal("plaintext tokenctl reached the TLS port")
	} else if !strings.Contains(errs, "Unavailable") {
		t.Logf("plaintext: %s", errs)
	}
	if _, errs, code := ctl(t, s.grpcAddr, "--tls-ca", ca, "rule", "list"); code == 0 || !strings.Contains(errs, "Unauthenticated") {
		t.Fatalf("TLS without a token: exit %d: %s", code, errs)
	}
	if _, errs, code := ctl(t, s.grpcAddr, "--tls-ca", ca, "--token", svc, "rule", "put", "login", "--algorithm", "token-bucket", "--limit", "3", "--period", "1m"); code == 0 || !strings.Contains(errs, "PermissionDenied") {
		t.Fatalf("client token: rule put: exit %d: %s", code, errs)
	}
	ctlJSON(t, s.grpcAddr, "--tls-ca", ca, "--token", ci, "rule", "put", "login", "--algorithm", "token-bucket", "--limit", "3", "--period", "1m")
	out, errs, code := ctl(t, s.grpcAddr, "--tls-ca", ca, "--token", ci, "rule", "get", "login")
	if code != 0 || !strings.Contains(out, "token:ci") {
		t.Fatalf("rule get does not show the author token:ci: exit %d\n%s%s", code, out, errs)
	}
	got := ctlJSON(t, s.grpcAddr, "--tls-ca", ca, "--token", svc, "acquire", "login", "alice", "--count", "5")
	if got["allowed"] != float64(3) || got["denied"] != float64(2) {
		t.Fatalf("acquire 5 of a limit-3 rule over TLS with a client token: %v", got)
	}
	if !strings.Contains(s.logs.String(), `"principal":"token:ci"`) {
		t.Errorf("no audit line with the principal in the logs:\n%s", s.logs.String())
	}
	s.stop(t)
}
