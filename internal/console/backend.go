package console

import (
	"context"
	"crypto/tls"
	"time"
)

// Credential is what the console knows of the caller, passed unchanged to
// every Backend call. The Backend authenticates it and decides roles; the
// console never grants anything itself.
type Credential struct {
	// Token is the bearer token given at the login form, kept in the
	// server-side session; "" when the caller did not log in with one.
	Token string
	// TLS is the request's TLS connection state (nil without TLS). A
	// verified client certificate in it is a credential of its own.
	TLS *tls.ConnectionState
	// RemoteAddr is the request's remote address, for a Backend that
	// admits loopback callers without a credential.
	RemoteAddr string
}

// Principal is the caller as the Backend sees it.
type Principal struct {
	// Name identifies the caller (a certificate name or a token's
	// principal); "" for an anonymous loopback caller.
	Name string
	// Roles are the caller's roles as the node names them ("viewer",
	// "editor", "admin"), shown in the header and in permission messages.
	Roles []string
}

// Member is one node of the cluster.
type Member struct {
	ID      string
	Address string
	Leader  bool
	// Voter is false for a non-voter.
	Voter bool
	// Ready is the node's readiness (/readyz).
	Ready bool
	// Live reports whether the member is in the routing view.
	Live bool
	// Health is the node's health as text ("SERVING", "NOT_SERVING", or
	// "unreachable").
	Health string
	// Epoch is the routing view's epoch as this member knows it.
	Epoch uint64
	// BucketBytes is the memory its buckets use; BucketBudget the cap
	// (0: unknown).
	BucketBytes, BucketBudget int64
	// DecisionsPerSecond is the member's recent decision rate.
	DecisionsPerSecond float64
}

// Cluster is the cluster's status.
type Cluster struct {
	Members []Member
	// Epoch is the routing view's epoch on the answering node.
	Epoch uint64
}

// RuleSummary is one rule with its live figures, for the rules list.
type RuleSummary struct {
	Name      string
	Algorithm string
	Limit     int64
	Period    time.Duration
	Version   uint64
	Shadow    bool
	// DecisionsPerSecond, DeniedRatio (0..1) and Utilisation (admitted ÷
	// limit) are over the last few seconds.
	DecisionsPerSecond float64
	DeniedRatio        float64
	Utilisation        float64
	// Sparkline is the decision rate over the last hour, oldest first
	// (one point a minute is plenty).
	Sparkline []float64
	// Durable says the rule's buckets are replicated and checkpointed.
	Durable bool
	// Bound is the rule's over-admission bound now, in permits, summed
	// over the nodes (tokenserver_overadmission_bound_permits).
	Bound int64
}

// Rule is one rule's definition.
type Rule struct {
	Name    string
	Version uint64
	// Definition is the rule as YAML or JSON, as `tokenctl rule apply -f`
	// takes it.
	Definition string
	// Cost is the rule's cost and durability fields, also in Definition.
	Cost Cost
}

// Point is one second of a rule's series.
type Point struct {
	Time         time.Time
	Admitted     int64
	Denied       int64
	ShadowDenied int64
	Permits      int64
	// Utilisation is admitted ÷ limit.
	Utilisation float64
}

// TopKey is one heavy hitter of a rule.
type TopKey struct {
	Key   string
	Count int64
	// ErrorBound is how much Count may overstate the true count.
	ErrorBound int64
}

// RuleVersion is one stored version of a rule.
type RuleVersion struct {
	Version   uint64
	Principal string
	Time      time.Time
	// Change says what happened ("create", "update", "rollback to 3",
	// "delete").
	Change string
	// Definition is the rule as it was at this version ("" once deleted).
	Definition string
}

// Override is a runtime per-key override of a rule.
type Override struct {
	Rule string
	// Key is an exact key or a prefix ending in one "*".
	Key   string
	Limit int64
	// Burst is the override's capacity (0: its limit).
	Burst int64
	// Period is the rule's period, which the override keeps (0: unknown).
	Period  time.Duration
	Expires time.Time // zero: never
	// Version and UpdatedBy are set by the node.
	Version   uint64
	UpdatedBy string
}

// EnvoyDomain is one Envoy rate-limit domain.
type EnvoyDomain struct {
	Domain      string
	Version     uint64
	Descriptors int
	Definition  string
	// History is the domain's stored versions, newest first (empty when
	// the node keeps none).
	History []EnvoyVersion
}

// EnvoyVersion is one stored version of an Envoy domain.
type EnvoyVersion struct {
	Version   uint64
	Principal string
	Time      time.Time
	// Change is what happened ("PUT", "DELETE", "SYNC" from a watched
	// file or xDS source).
	Change string
}

// Backend is what the console shows and changes. The node implements it
// over its AdminService; tests use a fake. Every method receives the
// caller's credential, authenticates and authorizes it, and returns errors
// with gRPC status codes (google.golang.org/grpc/status): Unauthenticated,
// PermissionDenied, InvalidArgument (its message is shown verbatim),
// NotFound, FailedPrecondition (a stale expected version), Unavailable.
// Methods are called concurrently.
type Backend interface {
	// WhoAmI authenticates c and names its principal and roles.
	WhoAmI(ctx context.Context, c Credential) (Principal, error)
	// ClusterStatus returns every member.
	ClusterStatus(ctx context.Context, c Credential) (Cluster, error)
	// ListRules returns every rule with its live figures.
	ListRules(ctx context.Context, c Credential) ([]RuleSummary, error)
	// GetRule returns one rule.
	GetRule(ctx context.Context, c Credential, name string) (Rule, error)
	// RuleSeries returns a rule's 1 s points with from <= Time < to,
	// oldest first, merged across nodes.
	RuleSeries(ctx context.Context, c Credential, name string, from, to time.Time) ([]Point, error)
	// TopKeys returns a rule's n hottest keys over window (a minute or an
	// hour), by admitted or by denied permits, hottest first.
	TopKeys(ctx context.Context, c Credential, rule string, n int, window time.Duration, denied bool) ([]TopKey, error)
	// RuleHistory returns a rule's stored versions, newest first.
	RuleHistory(ctx context.Context, c Credential, name string) ([]RuleVersion, error)
	// PutRule creates or replaces the rule that definition (YAML or JSON)
	// describes; expectedVersion 0 means any. It returns the rule as
	// stored, with its new version.
	PutRule(ctx context.Context, c Credential, definition string, expectedVersion uint64) (Rule, error)
	// RollbackRule writes a new version of name equal to toVersion and
	// returns the new version.
	RollbackRule(ctx context.Context, c Credential, name string, toVersion uint64) (uint64, error)
}

// OverrideLister is implemented by a Backend whose node supports runtime
// overrides; the console then shows an Overrides page. It may still
// return codes.Unimplemented.
type OverrideLister interface {
	// ListOverrides returns the overrides of rule ("" for every rule).
	ListOverrides(ctx context.Context, c Credential, rule string) ([]Override, error)
}

// OverrideEditor is implemented by a Backend whose overrides can be
// changed from the console (editors only; the Backend authorizes).
type OverrideEditor interface {
	// PutOverride creates or replaces an override and returns it as
	// stored. An invalid one fails with InvalidArgument and the API's
	// message.
	PutOverride(ctx context.Context, c Credential, o Override) (Override, error)
	// DeleteOverride removes the override of rule for key.
	DeleteOverride(ctx context.Context, c Credential, rule, key string) error
}

// EnvoyDomainLister is implemented by a Backend whose node serves Envoy
// rate-limit domains; the console then shows an Envoy page. It may still
// return codes.Unimplemented.
type EnvoyDomainLister interface {
	// ListEnvoyDomains returns every Envoy domain.
	ListEnvoyDomains(ctx context.Context, c Credential) ([]EnvoyDomain, error)
}
