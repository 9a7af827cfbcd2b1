package auth

import (
	"context"
	"sort"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// TestParseScopedRoles: a role field may end in one scope, a rule name or
// a prefix with one trailing `*`; admin is never scoped.
func TestParseScopedRoles(t *testing.T) {
	for _, tc := range []struct {
		in      string
		roles   Role
		scope   string
		wantErr string
	}{
		{in: "editor", roles: RoleEditor},
		{in: "editor:team-a/*", roles: RoleEditor, scope: "team-a/*"},
		{in: "client,editor:team-a/*", roles: RoleClient | RoleEditor, scope: "team-a/*"},
		{in: "viewer:billing", roles: RoleViewer, scope: "billing"},
		{in: "editor:", wantErr: "want a rule name"},
		{in: "editor:*", wantErr: "want a rule name"},
		{in: "editor:team-*/x", wantErr: "at the end"},
		{in: "editor:a**", wantErr: "at the end"},
		{in: "admin:team-a/*", wantErr: "admin cannot be scoped"},
		{in: "editor,admin:team-a/*", wantErr: "admin cannot be scoped"},
		{in: "root:team-a/*", wantErr: "root"},
	} {
		r, scope, err := parseScopedRoles(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("parseScopedRoles(%q) = %v, %q, %v; want an error containing %q", tc.in, r, scope, err, tc.wantErr)
			}
			continue
		}
		if err != nil || r != tc.roles || scope != tc.scope {
			t.Errorf("parseScopedRoles(%q) = %v, %q, %v; want %v, %q", tc.in, r, scope, err, tc.roles, tc.scope)
		}
	}
}

// TestInScope: a prefix scope covers the names that start with it, an
// exact scope its one name; nothing else, whatever it looks like.
func TestInScope(t *testing.T) {
	p := &Principal{Name: "token:team-a", Roles: RoleEditor, Scope: "team-a/*"}
	exact := &Principal{Name: "token:b", Roles: RoleEditor, Scope: "billing"}
	for _, tc := range []struct {
		p    *Principal
		name string
		want bool
	}{
		{p, "team-a/api", true},
		{p, "team-a/", true},
		{p, "team-a/x/y", true},
		{p, "team-a", false},
		{p, "team-ab/api", false},
		{p, "TEAM-A/api", false},
		{p, "team-b/api", false},
		{p, "", false},
		{exact, "billing", true},
		{exact, "billing2", false},
		{exact, "billin", false},
		{&Principal{Name: "token:x", Roles: RoleEditor}, "anything", true},
		{nil, "anything", true},
	} {
		if got := tc.p.InScope(tc.name); got != tc.want {
			t.Errorf("%v.InScope(%q) = %v, want %v", tc.p, tc.name, got, tc.want)
		}
	}
	ctx := NewContext(context.Background(), p)
	if err := CheckName(ctx, "team-a/api"); err != nil {
		t.Errorf("CheckName in scope: %v", err)
	}
	if err := CheckName(ctx, "team-b/api"); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "team-b/api") {
		t.Errorf("CheckName outside the scope = %v, want PermissionDenied naming the rule", err)
	}
}

// TestScopedMethods pins the methods a scoped principal may call: each
// one's handler checks the rule name it touches (internal/testcluster's
// TestScopedEditorManagesOnlyItsRules), and every other AdminService
// method is refused. A method added here needs that check first.
func TestScopedMethods(t *testing.T) {
	want := []string{
		pb.AdminService_DeleteOverride_FullMethodName,
		pb.AdminService_DeleteRule_FullMethodName,
		pb.AdminService_GetRule_FullMethodName,
		pb.AdminService_ListOverrides_FullMethodName,
		pb.AdminService_PutOverride_FullMethodName,
		pb.AdminService_PutRule_FullMethodName,
		pb.AdminService_RollbackRule_FullMethodName,
		pb.AdminService_RuleHistory_FullMethodName,
	}
	sort.Strings(want)
	var got []string
	for m := range scopedMethods {
		got = append(got, m)
	}
	sort.Strings(got)
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("scoped methods = %v, want %v", got, want)
	}
	p := &Principal{Name: "token:team-a", Roles: RoleEditor | RoleClient, Scope: "team-a/*"}
	for _, m := range pb.AdminService_ServiceDesc.Methods {
		full := "/" + pb.AdminService_ServiceDesc.ServiceName + "/" + m.MethodName
		err := p.scopeAllows(full)
		if scopedMethods[full] != (err == nil) {
			t.Errorf("%s: scopeAllows = %v", full, err)
		}
		if err != nil && status.Code(err) != codes.PermissionDenied {
			t.Errorf("%s: %v, want PermissionDenied", full, err)
		}
	}
	if err := p.scopeAllows(pb.TokenService_AcquireToken_FullMethodName); err != nil {
		t.Errorf("the data plane: %v", err)
	}
}
