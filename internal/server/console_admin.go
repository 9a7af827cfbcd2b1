package server

import (
	"context"
	"slices"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tokenserver/tokenserver/internal/console"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// The console's Overrides and Envoy pages over the AdminService, through
// the node's interceptor like every other console call (consoleBackend in
// console.go): the roles, scopes, validation messages and audit log are
// the API's.

var (
	_ console.OverrideLister    = (*consoleBackend)(nil)
	_ console.OverrideEditor    = (*consoleBackend)(nil)
	_ console.EnvoyDomainLister = (*consoleBackend)(nil)
)

// ListOverrides implements console.OverrideLister. For every rule (rule
// ""), it asks the AdminService about each rule that holds overrides in
// this node's copy: ListOverrides takes one rule, and asking about every
// rule would cost a call per rule on each page view.
func (b *consoleBackend) ListOverrides(ctx context.Context, c console.Credential, name string) ([]console.Override, error) {
	names := []string{name}
	if name == "" {
		names = names[:0]
		for _, r := range b.n.data.Table().Rules() {
			if c := b.n.data.Table().Get(r.Name); c != nil && c.Runtime() != nil && len(c.Runtime().All()) > 0 {
				names = append(names, r.Name)
			}
		}
		slices.Sort(names)
	}
	var out []console.Override
	for _, rn := range names {
		req := &pb.ListOverridesRequest{Rule: rn, PageSize: MaxOverridePage}
		for {
			resp, err := invoke(ctx, b.n, c, pb.AdminService_ListOverrides_FullMethodName, req, b.admin.ListOverrides)
			if err != nil {
				return nil, err
			}
			for _, o := range resp.GetOverrides() {
				out = append(out, b.override(o))
			}
			if resp.GetNextPageToken() == "" {
				break
			}
			req = &pb.ListOverridesRequest{Rule: rn, PageSize: MaxOverridePage, PageToken: resp.GetNextPageToken()}
		}
	}
	return out, nil
}

// override is o for the console, with its rule's period from this node's
// copy of the rule.
func (b *consoleBackend) override(o *pb.RuleOverride) console.Override {
	out := console.Override{Rule: o.GetRule(), Key: o.GetKey(), Limit: o.GetLimit(), Burst: o.GetBurst(),
		Version: o.GetVersion(), UpdatedBy: o.GetUpdatedBy()}
	if ns := o.GetExpiresUnixNs(); ns != 0 {
		out.Expires = time.Unix(0, ns)
	}
	if c := b.n.data.Table().Get(o.GetRule()); c != nil {
		out.Period = c.Rule.Period
	}
	return out
}

// PutOverride implements console.OverrideEditor.
func (b *consoleBackend) PutOverride(ctx context.Context, c console.Credential, o console.Override) (console.Override, error) {
	in := &pb.RuleOverride{Rule: o.Rule, Key: o.Key, Limit: o.Limit, Burst: o.Burst}
	if !o.Expires.IsZero() {
		in.ExpiresUnixNs = o.Expires.UnixNano()
	}
	resp, err := invoke(ctx, b.n, c, pb.AdminService_PutOverride_FullMethodName, &pb.PutOverrideRequest{Override: in}, b.admin.PutOverride)
	if err != nil {
		return console.Override{}, err
	}
	return b.override(resp.GetOverride()), nil
}

// DeleteOverride implements console.OverrideEditor.
func (b *consoleBackend) DeleteOverride(ctx context.Context, c console.Credential, rule, key string) error {
	_, err := invoke(ctx, b.n, c, pb.AdminService_DeleteOverride_FullMethodName, &pb.DeleteOverrideRequest{Rule: rule, Key: key}, b.admin.DeleteOverride)
	return err
}

// ListEnvoyDomains implements console.EnvoyDomainLister.
func (b *consoleBackend) ListEnvoyDomains(ctx context.Context, c console.Credential) ([]console.EnvoyDomain, error) {
	resp, err := invoke(ctx, b.n, c, pb.AdminService_ListEnvoyDomains_FullMethodName, &pb.ListEnvoyDomainsRequest{}, b.admin.ListEnvoyDomains)
	if err != nil {
		return nil, err
	}
	out := make([]console.EnvoyDomain, len(resp.GetDomains()))
	for i, d := range resp.GetDomains() {
		out[i] = console.EnvoyDomain{Domain: d.GetDomain(), Version: d.GetVersion(), Descriptors: countDescriptors(d.GetYaml()), Definition: d.GetYaml()}
		hreq := &pb.EnvoyDomainHistoryRequest{Domain: d.GetDomain()}
		h, err := invoke(ctx, b.n, c, pb.AdminService_EnvoyDomainHistory_FullMethodName, hreq, b.admin.EnvoyDomainHistory)
		if err != nil {
			// The domain is listed without its history rather than not
			// at all (a node of an older release has none).
			b.n.log.Debug("console: envoy domain history", "domain", d.GetDomain(), "err", err)
			continue
		}
		for _, v := range h.GetVersions() {
			ev := console.EnvoyVersion{Version: v.GetVersion(), Principal: v.GetPrincipal(), Change: v.GetChange()}
			if ns := v.GetTimeUnixNs(); ns != 0 {
				ev.Time = time.Unix(0, ns)
			}
			out[i].History = append(out[i].History, ev)
		}
	}
	return out, nil
}

// countDescriptors is the number of top-level descriptors of an Envoy
// domain's YAML (0 if it does not parse: the server validated it).
func countDescriptors(y string) int {
	var doc struct {
		Descriptors []yaml.Node `yaml:"descriptors"`
	}
	if err := yaml.Unmarshal([]byte(y), &doc); err != nil {
		return 0
	}
	return len(doc.Descriptors)
}
