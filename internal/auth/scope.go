package auth

import (
	"context"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// Scoped credentials: a token file's role field may end in `:PATTERN`
// (`editor:team-a/*`), which limits the principal to rule names matching
// PATTERN: the exact name, or with a trailing `*` every name starting
// with what precedes it. A scoped principal may call only the methods of
// scopedMethods (its own rules and their overrides, and the data plane);
// every other method, reads of the cluster and snapshots included, is
// PermissionDenied, whatever its roles. The server checks the rule name
// of each scoped call (CheckName).

// scopedMethods are the methods a scoped principal may call; the handlers
// check the rule names they touch.
var scopedMethods = map[string]bool{
	pb.AdminService_PutRule_FullMethodName:        true,
	pb.AdminService_DeleteRule_FullMethodName:     true,
	pb.AdminService_GetRule_FullMethodName:        true,
	pb.AdminService_PutOverride_FullMethodName:    true,
	pb.AdminService_DeleteOverride_FullMethodName: true,
	pb.AdminService_ListOverrides_FullMethodName:  true,
	pb.AdminService_RuleHistory_FullMethodName:    true,
	pb.AdminService_RollbackRule_FullMethodName:   true,
}

// ParseRoleField reads a token file's role field as the server does:
// ROLE[,ROLE...] with an optional `:PATTERN` scope (`editor:team-a/*`);
// it returns the roles and the scope ("" for none).
func ParseRoleField(s string) (Role, string, error) { return parseScopedRoles(s) }

// parseScopedRoles reads a token file's role field: ROLE[,ROLE...] with an
// optional `:PATTERN` scope.
func parseScopedRoles(s string) (Role, string, error) {
	roles, scope, scoped := strings.Cut(s, ":")
	r, err := ParseRoles(roles)
	if err != nil {
		return 0, "", err
	}
	if !scoped {
		return r, "", nil
	}
	if err := validScope(scope); err != nil {
		return 0, "", err
	}
	if r&RoleAdmin != 0 {
		return 0, "", fmt.Errorf("role admin cannot be scoped (%q): admin covers the cluster", s)
	}
	return r, scope, nil
}

func validScope(p string) error {
	if p == "" || p == "*" {
		return fmt.Errorf("scope %q: want a rule name or a name prefix ending in * (team-a/*)", p)
	}
	if i := strings.IndexByte(p, '*'); i >= 0 && i != len(p)-1 {
		return fmt.Errorf("scope %q: `*` may appear once, at the end", p)
	}
	return nil
}

// InScope reports whether the principal may touch the rule named name:
// always for an unscoped principal.
func (p *Principal) InScope(name string) bool {
	if p == nil || p.Scope == "" {
		return true
	}
	if prefix, ok := strings.CutSuffix(p.Scope, "*"); ok {
		return strings.HasPrefix(name, prefix)
	}
	return name == p.Scope
}

// scopeAllows refuses a scoped principal a method outside scopedMethods
// (TokenService methods stay open to its client role).
func (p *Principal) scopeAllows(fullMethod string) error {
	if p == nil || p.Scope == "" || scopedMethods[fullMethod] || strings.HasPrefix(fullMethod, "/"+pb.TokenService_ServiceDesc.ServiceName+"/") {
		return nil
	}
	return status.Errorf(codes.PermissionDenied, "%s is scoped to rules %q: %s is outside its scope", p, p.Scope, fullMethod)
}

// CheckName returns PermissionDenied when the caller in ctx is scoped and
// name is outside its scope; nil without auth or for an unscoped caller.
func CheckName(ctx context.Context, name string) error {
	p, ok := FromContext(ctx)
	if !ok || p.InScope(name) {
		return nil
	}
	return status.Errorf(codes.PermissionDenied, "%s is scoped to rules %q: rule %q is outside its scope", p, p.Scope, name)
}
