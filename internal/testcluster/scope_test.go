package testcluster

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/tokenserver/tokenserver/internal/auth"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// tokenLine is a token file's line for token with a role field as
// written (auth.TokenLine takes roles without a scope).
func tokenLine(token, principal, roles string) string {
	d := sha256.Sum256([]byte(token))
	return fmt.Sprintf("sha256:%s %s %s\n", hex.EncodeToString(d[:]), principal, roles)
}

// addScopedToken appends a token for principal with roles (a scoped role
// field, "client,editor:team-a/*") to the cluster's token file and waits
// until the nodes accept it.
func addScopedToken(t *testing.T, c *Cluster, token, principal, roles string) []grpc.DialOption {
	t.Helper()
	f, err := os.OpenFile(c.PKI.TokenFile, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(tokenLine(token, principal, roles)); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(c.PKI.ClientTLS())),
		grpc.WithPerRPCCredentials(auth.BearerToken{Token: token})}
	for _, n := range c.Nodes {
		conn := dialWith(t, n.GRPCAddr, opts...)
		c.WaitFor(n.ID+" knows the scoped token", func() bool {
			_, err := pb.NewAdminServiceClient(conn).GetRule(ctx(t), &pb.GetRuleRequest{Name: "team-a/none"})
			return status.Code(err) != codes.Unauthenticated
		})
	}
	return opts
}

// TestScopedEditorManagesOnlyItsRules (issue 17, item 6): a token whose
// role is editor:team-a/* manages the rules and overrides named under
// team-a/ and nothing else, through the leader and through a follower
// (which forwards the writes).
func TestScopedEditorManagesOnlyItsRules(t *testing.T) {
	c := NewSecure(t, 3, nil)
	admin := pb.NewAdminServiceClient(dialWith(t, c.Leader().GRPCAddr, c.PKI.DialOptions("admin")...))
	for _, name := range []string{"team-b/api", "team-a", "team-ab/api"} {
		if _, err := admin.PutRule(ctx(t), &pb.PutRuleRequest{Rule: tokenBucket(name, 10)}); err != nil {
			t.Fatalf("admin PutRule %s: %v", name, err)
		}
	}
	opts := addScopedToken(t, c, "team-a-secret", "team-a", "client,editor:team-a/*")
	for _, n := range []*Node{c.Leader(), c.Follower()} {
		t.Run(n.ID, func(t *testing.T) {
			conn := dialWith(t, n.GRPCAddr, opts...)
			a, tc := pb.NewAdminServiceClient(conn), pb.NewTokenServiceClient(conn)
			own := "team-a/api-" + n.ID

			// Its own rule: create, read, change, roll back, delete later.
			put, err := a.PutRule(ctx(t), &pb.PutRuleRequest{Rule: tokenBucket(own, 10)})
			if err != nil {
				t.Fatalf("PutRule %s: %v", own, err)
			}
			if put.GetRule().GetUpdatedBy() != "token:team-a" {
				t.Errorf("updated_by %q, want token:team-a", put.GetRule().GetUpdatedBy())
			}
			if _, err := a.GetRule(ctx(t), &pb.GetRuleRequest{Name: own}); err != nil {
				t.Errorf("GetRule own: %v", err)
			}
			if _, err := a.PutRule(ctx(t), &pb.PutRuleRequest{Rule: tokenBucket(own, 20)}); err != nil {
				t.Fatalf("PutRule own again: %v", err)
			}
			// Regression: RollbackRule and RuleHistory were outside every
			// scope, so a team could not roll back its own rule.
			t.Run("RollbackRegression", func(t *testing.T) {
				back, err := a.RollbackRule(ctx(t), &pb.RollbackRuleRequest{Name: own, ToVersion: put.GetRule().GetVersion()})
				if err != nil || back.GetRule().GetLimit() != 10 {
					t.Errorf("RollbackRule own: %v, %v; want limit 10 again", back, err)
				}
				if h, err := a.RuleHistory(ctx(t), &pb.RuleHistoryRequest{Name: own}); err != nil || len(h.GetVersions()) < 3 {
					t.Errorf("RuleHistory own: %v, %v", h, err)
				}
			})
			// Its own overrides.
			if _, err := a.PutOverride(ctx(t), &pb.PutOverrideRequest{Override: &pb.RuleOverride{Rule: own, Key: "vip", Limit: 100}}); err != nil {
				t.Errorf("PutOverride own: %v", err)
			}
			if l, err := a.ListOverrides(ctx(t), &pb.ListOverridesRequest{Rule: own}); err != nil || len(l.GetOverrides()) != 1 {
				t.Errorf("ListOverrides own: %v, %v", l, err)
			}
			if _, err := a.DeleteOverride(ctx(t), &pb.DeleteOverrideRequest{Rule: own, Key: "vip"}); err != nil {
				t.Errorf("DeleteOverride own: %v", err)
			}
			// Its data plane.
			c.WaitForRule(own)
			if r, err := tc.AcquireToken(ctx(t), &pb.AcquireTokenRequest{Rule: own, Key: "k"}); err != nil || !r.GetAllowed() {
				t.Errorf("AcquireToken own: %v, %v", r, err)
			}

			// Everything else is PermissionDenied, and changes nothing.
			for _, other := range []string{"team-b/api", "team-a", "team-ab/api"} {
				_, err := a.PutRule(ctx(t), &pb.PutRuleRequest{Rule: tokenBucket(other, 1)})
				wantCode(t, "PutRule "+other, err, codes.PermissionDenied)
				_, err = a.GetRule(ctx(t), &pb.GetRuleRequest{Name: other})
				wantCode(t, "GetRule "+other, err, codes.PermissionDenied)
				_, err = a.DeleteRule(ctx(t), &pb.DeleteRuleRequest{Name: other})
				wantCode(t, "DeleteRule "+other, err, codes.PermissionDenied)
				_, err = a.RollbackRule(ctx(t), &pb.RollbackRuleRequest{Name: other, ToVersion: 1})
				wantCode(t, "RollbackRule "+other, err, codes.PermissionDenied)
				_, err = a.RuleHistory(ctx(t), &pb.RuleHistoryRequest{Name: other})
				wantCode(t, "RuleHistory "+other, err, codes.PermissionDenied)
				_, err = a.PutOverride(ctx(t), &pb.PutOverrideRequest{Override: &pb.RuleOverride{Rule: other, Key: "vip", Limit: 1000}})
				wantCode(t, "PutOverride "+other, err, codes.PermissionDenied)
				_, err = a.DeleteOverride(ctx(t), &pb.DeleteOverrideRequest{Rule: other, Key: "vip"})
				wantCode(t, "DeleteOverride "+other, err, codes.PermissionDenied)
				_, err = a.ListOverrides(ctx(t), &pb.ListOverridesRequest{Rule: other})
				wantCode(t, "ListOverrides "+other, err, codes.PermissionDenied)
				got, err := admin.GetRule(ctx(t), &pb.GetRuleRequest{Name: other})
				if err != nil || got.GetLimit() != 10 {
					t.Errorf("%s after the refused writes: %v, %v; want it unchanged (limit 10)", other, got, err)
				}
				if l, err := admin.ListOverrides(ctx(t), &pb.ListOverridesRequest{Rule: other}); err != nil || len(l.GetOverrides()) != 0 {
					t.Errorf("overrides of %s after the refused writes: %v, %v", other, l, err)
				}
			}
			// Cluster-wide methods are outside any scope.
			_, err = a.ListRules(ctx(t), &pb.ListRulesRequest{})
			wantCode(t, "ListRules", err, codes.PermissionDenied)
			_, err = a.DiffRules(ctx(t), &pb.DiffRulesRequest{Rules: []*pb.Rule{tokenBucket("team-b/api", 1)}})
			wantCode(t, "DiffRules", err, codes.PermissionDenied)
			_, err = a.NodeStatus(ctx(t), &pb.NodeStatusRequest{})
			wantCode(t, "NodeStatus", err, codes.PermissionDenied)
			_, err = a.ClusterStatus(ctx(t), &pb.ClusterStatusRequest{})
			wantCode(t, "ClusterStatus", err, codes.PermissionDenied)
			_, err = a.RemoveMember(ctx(t), &pb.RemoveMemberRequest{Id: "node-2"})
			wantCode(t, "RemoveMember", err, codes.PermissionDenied)

			if _, err := a.DeleteRule(ctx(t), &pb.DeleteRuleRequest{Name: own}); err != nil {
				t.Errorf("DeleteRule own: %v", err)
			}
		})
	}
}

// TestScopedRoleRefusesAdmin: admin covers the cluster and cannot be
// scoped; a token file that tries is refused as a whole.
func TestScopedRoleRefusesAdmin(t *testing.T) {
	file := t.TempDir() + "/tokens"
	if err := os.WriteFile(file, []byte(tokenLine("x", "p", "admin:team-a/*")), 0o600); err != nil {
		t.Fatal(err)
	}
	if a, err := auth.New(auth.Options{TokenFile: file, ReloadInterval: -1}); err == nil {
		a.Close()
		t.Fatal("a token file with a scoped admin role was accepted")
	}
}
