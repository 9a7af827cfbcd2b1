package server

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/tokenserver/tokenserver/internal/auth"
	"github.com/tokenserver/tokenserver/internal/console"
	"github.com/tokenserver/tokenserver/internal/rulefile"
	"github.com/tokenserver/tokenserver/internal/rulepb"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// consoleHandler is the web console (internal/console) at /ui/ over this
// node's own services: every Backend call goes through the node's unary
// interceptor with the caller's credential (the session's bearer token or
// the request's TLS client certificate), so the console's roles, audit
// log and errors are exactly the API's. Without auth the console asks for
// no login, as the API asks for no credential.
func (n *Node) consoleHandler() http.Handler {
	return console.New(&consoleBackend{n: n, admin: &adminService{n: n}}, console.Options{NoAuth: n.auth == nil, Logger: n.log})
}

// consoleBackend adapts the node to console.Backend.
type consoleBackend struct {
	n     *Node
	admin *adminService
	rates ruleRatesCache // the rules list's figures (visibility_rates.go)
}

var (
	_ console.Backend = (*consoleBackend)(nil)
	_ net.Addr        = consoleAddr("")
)

// consoleAddr is a caller's remote address for the peer of a console call.
type consoleAddr string

func (a consoleAddr) Network() string { return "tcp" }
func (a consoleAddr) String() string  { return string(a) }

// incoming makes the context of an in-process call as the gRPC server
// would for a remote caller with c's credential.
func incoming(ctx context.Context, c console.Credential) context.Context {
	md := metadata.MD{}
	if c.Token != "" {
		md.Set("authorization", "Bearer "+c.Token)
	}
	ctx = metadata.NewIncomingContext(ctx, md)
	p := &peer.Peer{Addr: consoleAddr(c.RemoteAddr)}
	if c.TLS != nil {
		p.AuthInfo = credentials.TLSInfo{State: *c.TLS, CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}}
	}
	return peer.NewContext(ctx, p)
}

// invoke calls handler h of method through the node's unary interceptor
// with c's credential.
func invoke[Req, Resp any](ctx context.Context, n *Node, c console.Credential, method string, req Req, h func(context.Context, Req) (Resp, error)) (Resp, error) {
	var zero Resp
	out, err := n.unary(incoming(ctx, c), req, &grpc.UnaryServerInfo{FullMethod: method}, func(ctx context.Context, req any) (any, error) {
		return h(ctx, req.(Req))
	})
	if err != nil {
		return zero, err
	}
	return out.(Resp), nil
}

// authenticatedMethod is a method any principal may call: WhoAmI asks the
// authorizer about it to learn the caller's principal without a role.
const authenticatedMethod = "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"

// WhoAmI implements console.Backend.
func (b *consoleBackend) WhoAmI(ctx context.Context, c console.Credential) (console.Principal, error) {
	if b.n.auth == nil {
		return console.Principal{Roles: []string{"viewer", "editor", "admin"}}, nil
	}
	ctx, err := b.n.auth.Authorize(incoming(ctx, c), authenticatedMethod)
	if err != nil {
		return console.Principal{}, err
	}
	p, _ := auth.FromContext(ctx)
	out := console.Principal{Name: p.Actor()}
	for _, r := range []struct {
		role auth.Role
		name string
	}{{auth.RoleViewer, "viewer"}, {auth.RoleEditor, "editor"}, {auth.RoleAdmin, "admin"}} {
		if p.Has(r.role) {
			out.Roles = append(out.Roles, r.name)
		}
	}
	return out, nil
}

// ClusterStatus implements console.Backend. Bucket memory and decision
// rates are this node's own (ClusterStatus does not carry other members').
func (b *consoleBackend) ClusterStatus(ctx context.Context, c console.Credential) (console.Cluster, error) {
	resp, err := invoke(ctx, b.n, c, pb.AdminService_ClusterStatus_FullMethodName, &pb.ClusterStatusRequest{}, b.admin.ClusterStatus)
	if err != nil {
		return console.Cluster{}, err
	}
	out := console.Cluster{Epoch: resp.GetEpoch()}
	self := b.n.data.ID()
	for _, m := range resp.GetMembers() {
		health := "NOT_SERVING"
		switch {
		case m.GetRole() == "unreachable":
			health = "unreachable"
		case m.GetHealthy():
			health = "SERVING"
		}
		cm := console.Member{ID: m.GetId(), Address: m.GetGrpcAddr(), Leader: m.GetId() == resp.GetLeader(), Voter: m.GetVoter(),
			Ready: m.GetReady(), Live: m.GetLive(), Health: health, Epoch: resp.GetEpoch()}
		if m.GetId() == self {
			cm.BucketBytes = b.n.buckets.Bytes()
			cm.BucketBudget = b.n.cfg.MaxBucketMemory
			cm.DecisionsPerSecond = b.n.localDecisionRate()
		}
		out.Members = append(out.Members, cm)
	}
	return out, nil
}

// rateWindow is the span the rules list averages its live figures over.
const rateWindow = 10 * time.Second

// localDecisionRate is this node's decisions per second over rateWindow,
// over every rule.
func (n *Node) localDecisionRate() float64 {
	if n.vis == nil {
		return 0
	}
	now := n.vis.wall()
	var total int64
	for _, rv := range n.decisions.visible() {
		for _, p := range rv.series.Range(now, now-int64(rateWindow)+1, now) {
			total += p.Admitted + p.Denied + p.ShadowDenied
		}
	}
	return float64(total) / rateWindow.Seconds()
}

// ListRules implements console.Backend. The live figures are the
// cluster's: one ListRuleRates (one call per member, whatever the number
// of rules), reused for ruleRatesTTL across page loads and callers. When
// it fails, the rules are listed without figures.
func (b *consoleBackend) ListRules(ctx context.Context, c console.Credential) ([]console.RuleSummary, error) {
	var rules []*pb.Rule
	req := &pb.ListRulesRequest{PageSize: maxListPage}
	for {
		resp, err := invoke(ctx, b.n, c, pb.AdminService_ListRules_FullMethodName, req, b.admin.ListRules)
		if err != nil {
			return nil, err
		}
		rules = append(rules, resp.GetRules()...)
		if resp.GetNextPageToken() == "" {
			break
		}
		req = &pb.ListRulesRequest{PageSize: maxListPage, PageToken: resp.GetNextPageToken()}
	}
	rates, window, _, err := b.rates.get(time.Now(), func() (*pb.ListRuleRatesResponse, error) {
		return invoke(ctx, b.n, c, pb.AdminService_ListRuleRates_FullMethodName, &pb.ListRuleRatesRequest{}, b.admin.ListRuleRates)
	})
	if err != nil {
		b.n.log.Debug("console: rule rates", "err", err)
	}
	out := make([]console.RuleSummary, len(rules))
	for i, r := range rules {
		out[i] = summary(r, rates[r.GetName()], window)
	}
	return out, nil
}

// summary is one rule of the rules list with the cluster's figures rr
// over window seconds (nil rr: no decisions in the last hour).
func summary(r *pb.Rule, rr *pb.RuleRate, window int64) console.RuleSummary {
	s := console.RuleSummary{Name: r.GetName(), Algorithm: r.GetAlgorithm().String(), Limit: r.GetLimit(),
		Period: r.GetPeriod().AsDuration(), Version: r.GetVersion(), Shadow: r.GetShadow(), Durable: r.GetDurable(),
		Bound: rr.GetOveradmissionBoundPermits()}
	if rr == nil || window <= 0 {
		return s
	}
	steps := len(rr.GetSparkline())
	if steps > 0 {
		width := float64(hourSeconds / steps)
		s.Sparkline = make([]float64, steps)
		for i, v := range rr.GetSparkline() {
			s.Sparkline[i] = float64(v) / width
		}
	}
	all := rr.GetAdmitted() + rr.GetDenied() + rr.GetShadowDenied()
	s.DecisionsPerSecond = float64(all) / float64(window)
	if all > 0 {
		s.DeniedRatio = float64(rr.GetDenied()+rr.GetShadowDenied()) / float64(all)
	}
	s.Utilisation = utilisationOf(rr, window, r.GetLimit(), r.GetPeriod().AsDuration())
	return s
}

// definition is r as the console edits it: the proto's JSON, which rule
// apply -f reads, without the fields the server sets.
func definition(r *pb.Rule) (string, error) {
	if r == nil {
		return "", nil
	}
	c := rulepb.ToProto(rulepb.FromProto(r))
	c.Version, c.Generation, c.UpdatedBy = 0, 0, ""
	b, err := protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(c)
	if err != nil {
		return "", fmt.Errorf("rule %q as JSON: %w", r.GetName(), err)
	}
	return string(b), nil
}

// GetRule implements console.Backend.
func (b *consoleBackend) GetRule(ctx context.Context, c console.Credential, name string) (console.Rule, error) {
	r, err := invoke(ctx, b.n, c, pb.AdminService_GetRule_FullMethodName, &pb.GetRuleRequest{Name: name}, b.admin.GetRule)
	if err != nil {
		return console.Rule{}, err
	}
	return consoleRule(r)
}

// RuleSeries implements console.Backend.
func (b *consoleBackend) RuleSeries(ctx context.Context, c console.Credential, name string, from, to time.Time) ([]console.Point, error) {
	req := &pb.RuleSeriesRequest{Rule: name, FromUnix: from.Unix(), ToUnix: to.Add(-time.Nanosecond).Unix()}
	resp, err := invoke(ctx, b.n, c, pb.AdminService_RuleSeries_FullMethodName, req, b.admin.RuleSeries)
	if err != nil {
		return nil, err
	}
	out := make([]console.Point, len(resp.GetPoints()))
	for i, p := range resp.GetPoints() {
		out[i] = console.Point{Time: time.Unix(p.GetUnix(), 0), Admitted: p.GetAdmitted(), Denied: p.GetDenied(),
			ShadowDenied: p.GetShadowDenied(), Permits: p.GetPermits(), Utilisation: p.GetUtilisation()}
	}
	return out, nil
}

// TopKeys implements console.Backend: a window up to a minute reads the
// minute sketch, a longer one the hour's.
func (b *consoleBackend) TopKeys(ctx context.Context, c console.Credential, rule string, n int, window time.Duration, denied bool) ([]console.TopKey, error) {
	w := pb.TopKeysWindow_MINUTE
	if window > time.Minute {
		w = pb.TopKeysWindow_HOUR
	}
	req := &pb.TopKeysRequest{Rule: rule, N: int32(min(n, maxTopKeys)), Window: w, Denied: denied}
	resp, err := invoke(ctx, b.n, c, pb.AdminService_TopKeys_FullMethodName, req, b.admin.TopKeys)
	if err != nil {
		return nil, err
	}
	out := make([]console.TopKey, len(resp.GetKeys()))
	for i, k := range resp.GetKeys() {
		out[i] = console.TopKey{Key: k.GetKey(), Count: k.GetCount(), ErrorBound: k.GetError()}
	}
	return out, nil
}

// RuleHistory implements console.Backend.
func (b *consoleBackend) RuleHistory(ctx context.Context, c console.Credential, name string) ([]console.RuleVersion, error) {
	resp, err := invoke(ctx, b.n, c, pb.AdminService_RuleHistory_FullMethodName, &pb.RuleHistoryRequest{Name: name}, b.admin.RuleHistory)
	if err != nil {
		return nil, err
	}
	out := make([]console.RuleVersion, len(resp.GetVersions()))
	for i, v := range resp.GetVersions() {
		def, err := definition(v.GetRule())
		if err != nil {
			return nil, err
		}
		out[i] = console.RuleVersion{Version: v.GetVersion(), Principal: v.GetPrincipal(), Change: v.GetChange(), Definition: def}
		if v.GetTimeUnixNs() != 0 {
			out[i].Time = time.Unix(0, v.GetTimeUnixNs())
		}
	}
	return out, nil
}

// PutRule implements console.Backend: definition is read as rule apply -f
// reads a file, and must hold one rule.
func (b *consoleBackend) PutRule(ctx context.Context, c console.Credential, def string, expectedVersion uint64) (console.Rule, error) {
	rs, err := rulefile.Parse("definition", []byte(def))
	if err != nil {
		return console.Rule{}, toError(failf(ErrBadRequest, "%v", err))
	}
	if len(rs) != 1 {
		return console.Rule{}, toError(failf(ErrBadRequest, "the definition holds %d rules; give exactly one", len(rs)))
	}
	req := &pb.PutRuleRequest{Rule: rulepb.ToProto(rs[0].Rule)}
	if expectedVersion != 0 {
		req.ExpectedVersion = &expectedVersion
	}
	resp, err := invoke(ctx, b.n, c, pb.AdminService_PutRule_FullMethodName, req, b.admin.PutRule)
	if err != nil {
		return console.Rule{}, err
	}
	return consoleRule(resp.GetRule())
}

// RollbackRule implements console.Backend.
func (b *consoleBackend) RollbackRule(ctx context.Context, c console.Credential, name string, toVersion uint64) (uint64, error) {
	req := &pb.RollbackRuleRequest{Name: name, ToVersion: toVersion}
	resp, err := invoke(ctx, b.n, c, pb.AdminService_RollbackRule_FullMethodName, req, b.admin.RollbackRule)
	if err != nil {
		return 0, err
	}
	return resp.GetRule().GetVersion(), nil
}
