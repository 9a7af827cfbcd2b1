package server

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tokenserver/tokenserver/internal/auth"
)

const benchJSON = `{"domain":"bench","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.1"}]}]}`

// postJSON posts body to n's /json with the Authorization header auth
// ("" for none) and returns the status and the body.
func postJSON(n *Node, authorization, body string) (int, string) {
	req := httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(body))
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	rec := httptest.NewRecorder()
	n.httpHandler().ServeHTTP(rec, req)
	return rec.Code, strings.TrimSpace(rec.Body.String())
}

// TestEnvoyJSONRemovedNodeRefuses: /json on a node removed from the
// cluster refuses as ShouldRateLimit on gRPC does, with the same message
// (HTTP 400, the reference's status for a call that fails), and counts
// nothing (regression: /json skipped the gRPC interceptors and kept
// deciding).
func TestEnvoyJSONRemovedNodeRefuses(t *testing.T) {
	n, conn := envoyTestNode(t, nil, func(s *Standalone) DataPlane { return removedData{s} })
	_, err := rlpb.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx(t), &rlpb.RateLimitRequest{Domain: "bench"})
	st := status.Convert(err)
	if st.Code() != codes.FailedPrecondition || !strings.HasPrefix(st.Message(), "this node was removed from the cluster; ") {
		t.Fatalf("gRPC: %v", err)
	}
	code, body := postJSON(n, "", benchJSON)
	if code != http.StatusBadRequest || body != st.Message() {
		t.Fatalf("/json on a removed node: %d %q, want 400 %q", code, body, st.Message())
	}
	if live := n.buckets.Live(); live != 0 {
		t.Fatalf("/json on a removed node made %d buckets", live)
	}
}

// TestEnvoyJSONAuth: with authentication on, /json asks for the
// credential ShouldRateLimit on gRPC asks for (the client role), and
// counts only what it lets through (regression: /json served anyone).
func TestEnvoyJSONAuth(t *testing.T) {
	file := filepath.Join(t.TempDir(), "tokens")
	client, clientLine, err := auth.NewToken("gw", auth.RoleClient)
	if err != nil {
		t.Fatal(err)
	}
	viewer, viewerLine, err := auth.NewToken("ops", auth.RoleViewer)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte(clientLine+"\n"+viewerLine+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	az, err := auth.New(auth.Options{TokenFile: file, ReloadInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(az.Close)
	n, _ := envoyTestNode(t, func(c *Config) { c.Security.Auth = az }, nil)
	for _, tc := range []struct {
		name, authorization string
		code                int
		says                string
	}{
		{"no credential", "", http.StatusUnauthorized, "Bearer"},
		{"unknown token", "Bearer nope", http.StatusUnauthorized, ""},
		{"a token past the size limit", "Bearer " + strings.Repeat("x", MaxAuthorizationBytes), http.StatusUnauthorized, "bearer token is at most"},
		{"no client role", "Bearer " + viewer, http.StatusForbidden, "client"},
		{"the client role", "Bearer " + client, http.StatusOK, `"overallCode":"OK"`},
	} {
		code, body := postJSON(n, tc.authorization, benchJSON)
		if code != tc.code || !strings.Contains(body, tc.says) {
			t.Errorf("%s: %d %q, want %d saying %q", tc.name, code, body, tc.code, tc.says)
		}
	}
	if live := n.buckets.Live(); live != 1 {
		t.Errorf("%d buckets, want the one of the call let through", live)
	}
}
