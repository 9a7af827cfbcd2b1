package auth

import (
	"fmt"
	"strings"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	peerv1 "github.com/tokenserver/tokenserver/proto/tokenserver/peer/v1"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// Role is one role, or a set of roles as a bit mask.
type Role uint8

// The roles. Admin implies every role; editor implies viewer.
const (
	// RoleClient calls TokenService: acquire, refill, renew, cluster view.
	RoleClient Role = 1 << iota
	// RoleViewer reads rules, cluster and node status, and saves snapshots.
	RoleViewer
	// RoleEditor puts, applies and deletes rules.
	RoleEditor
	// RoleAdmin joins and removes members, restores snapshots, and holds
	// every other role.
	RoleAdmin

	// AllRoles is what a peer holds.
	AllRoles = RoleClient | RoleViewer | RoleEditor | RoleAdmin
)

var roleNames = [...]struct {
	r    Role
	name string
}{{RoleClient, "client"}, {RoleViewer, "viewer"}, {RoleEditor, "editor"}, {RoleAdmin, "admin"}}

// ParseRole parses client, viewer, editor or admin.
func ParseRole(s string) (Role, error) {
	for _, n := range roleNames {
		if s == n.name {
			return n.r, nil
		}
	}
	return 0, fmt.Errorf("unknown role %q (want client, viewer, editor or admin)", s)
}

// ParseRoles parses a comma-separated list of roles.
func ParseRoles(s string) (Role, error) {
	var set Role
	for _, f := range strings.Split(s, ",") {
		r, err := ParseRole(strings.TrimSpace(f))
		if err != nil {
			return 0, err
		}
		set |= r
	}
	return set, nil
}

// String returns the role names of r, comma-separated.
func (r Role) String() string {
	var names []string
	for _, n := range roleNames {
		if r&n.r != 0 {
			names = append(names, n.name)
		}
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ",")
}

// expand adds the roles that r implies.
func (r Role) expand() Role {
	if r&RoleAdmin != 0 {
		return AllRoles
	}
	if r&RoleEditor != 0 {
		r |= RoleViewer
	}
	return r
}

// access is what a method needs.
type access uint8

const (
	accessRole          access = iota // the method's role
	accessOpen                        // anyone, credential or not (health probes)
	accessAuthenticated               // any principal (reflection)
)

type methodRule struct {
	access access
	role   Role
	write  bool // audited: logged with its principal
}

// methods maps each full gRPC method name to what it needs. A method not
// listed needs admin.
var methods = map[string]methodRule{
	pb.TokenService_AcquireToken_FullMethodName:     {role: RoleClient},
	pb.TokenService_AcquireTokens_FullMethodName:    {role: RoleClient},
	pb.TokenService_RefillToken_FullMethodName:      {role: RoleClient},
	pb.TokenService_RenewLease_FullMethodName:       {role: RoleClient},
	pb.TokenService_GetClusterView_FullMethodName:   {role: RoleClient},
	pb.TokenService_WatchClusterView_FullMethodName: {role: RoleClient},
	pb.TokenService_CommitToken_FullMethodName:      {role: RoleClient},

	"/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit": {role: RoleClient},

	pb.AdminService_GetRule_FullMethodName:         {role: RoleViewer},
	pb.AdminService_ListRules_FullMethodName:       {role: RoleViewer},
	pb.AdminService_ClusterStatus_FullMethodName:   {role: RoleViewer},
	pb.AdminService_NodeStatus_FullMethodName:      {role: RoleViewer},
	pb.AdminService_SnapshotSave_FullMethodName:    {role: RoleViewer},
	pb.AdminService_PutRule_FullMethodName:         {role: RoleEditor, write: true},
	pb.AdminService_DeleteRule_FullMethodName:      {role: RoleEditor, write: true},
	pb.AdminService_JoinCluster_FullMethodName:     {role: RoleAdmin, write: true},
	pb.AdminService_RemoveMember_FullMethodName:    {role: RoleAdmin, write: true},
	pb.AdminService_DrainMember_FullMethodName:     {role: RoleAdmin, write: true},
	pb.AdminService_SnapshotRestore_FullMethodName: {role: RoleAdmin, write: true},

	pb.AdminService_ListOverrides_FullMethodName:     {role: RoleViewer},
	pb.AdminService_TopKeys_FullMethodName:           {role: RoleViewer},
	pb.AdminService_RuleSeries_FullMethodName:        {role: RoleViewer},
	pb.AdminService_RuleHistory_FullMethodName:       {role: RoleViewer},
	pb.AdminService_DiffRules_FullMethodName:         {role: RoleViewer},
	pb.AdminService_GetEnvoyDomain_FullMethodName:    {role: RoleViewer},
	pb.AdminService_ListEnvoyDomains_FullMethodName:  {role: RoleViewer},
	pb.AdminService_PutOverride_FullMethodName:       {role: RoleEditor, write: true},
	pb.AdminService_DeleteOverride_FullMethodName:    {role: RoleEditor, write: true},
	pb.AdminService_RollbackRule_FullMethodName:      {role: RoleEditor, write: true},
	pb.AdminService_PutEnvoyDomain_FullMethodName:    {role: RoleEditor, write: true},
	pb.AdminService_DeleteEnvoyDomain_FullMethodName: {role: RoleEditor, write: true},

	pb.AdminService_EnvoyDomainHistory_FullMethodName: {role: RoleViewer},
	pb.AdminService_ListRuleRates_FullMethodName:      {role: RoleViewer},
	pb.AdminService_RuleBound_FullMethodName:          {role: RoleViewer},

	// Node to node: bucket handoff. Only a peer holds admin with a
	// certificate; the service itself also refuses any caller without a
	// peer certificate when TLS is on.
	peerv1.HandoffService_Prepare_FullMethodName:  {role: RoleAdmin},
	peerv1.HandoffService_Transfer_FullMethodName: {role: RoleAdmin},

	// Node to node: peers hold every role, and the handler also refuses
	// a caller without a peer certificate.
	peerv1.ReplicaService_Replicate_FullMethodName: {role: RoleAdmin},

	healthpb.Health_Check_FullMethodName: {access: accessOpen},
	healthpb.Health_Watch_FullMethodName: {access: accessOpen},
	healthpb.Health_List_FullMethodName:  {access: accessOpen},

	"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo":      {access: accessAuthenticated},
	"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": {access: accessAuthenticated},
}

func rule(fullMethod string) methodRule {
	if m, ok := methods[fullMethod]; ok {
		return m
	}
	return methodRule{role: RoleAdmin, write: true}
}

// Requirement describes what a method needs, for documentation and tests:
// open (no credential), any principal, or a role.
func Requirement(fullMethod string) string {
	m := rule(fullMethod)
	switch m.access {
	case accessOpen:
		return "open"
	case accessAuthenticated:
		return "authenticated"
	}
	return m.role.String()
}

// IsWrite reports whether a method changes the cluster (rule writes,
// membership, snapshot restore): the server logs those at info with their
// principal.
func IsWrite(fullMethod string) bool { return rule(fullMethod).write }
