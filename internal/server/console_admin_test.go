package server

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokenserver/tokenserver/internal/console"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// TestConsoleOverridesAndEnvoy: the console's adapter lists the runtime
// overrides of every rule (with the rule's period), saves one with the
// API's own validation message on bad input, deletes it, and lists Envoy
// domains with their descriptor count.
func TestConsoleOverridesAndEnvoy(t *testing.T) {
	tn := newTestNode(t, nil)
	c := ctx(t)
	for _, name := range []string{"api", "quiet"} {
		if _, err := tn.admin.PutRule(c, &pb.PutRuleRequest{Rule: &pb.Rule{Name: name, Algorithm: pb.Algorithm_FIXED_WINDOW, Limit: 2, Period: durationpb.New(time.Minute)}}); err != nil {
			t.Fatal(err)
		}
	}
	b := &consoleBackend{n: tn.node, admin: &adminService{n: tn.node}}
	cred := console.Credential{RemoteAddr: "127.0.0.1:1"}
	exp := time.Now().Add(time.Hour).Truncate(time.Second)
	saved, err := b.PutOverride(c, cred, console.Override{Rule: "api", Key: "vip-*", Limit: 9, Expires: exp})
	if err != nil {
		t.Fatal(err)
	}
	if saved.Version == 0 || saved.Period != time.Minute || !saved.Expires.Equal(exp) {
		t.Fatalf("saved %+v", saved)
	}
	_, apiErr := tn.admin.PutOverride(c, &pb.PutOverrideRequest{Override: &pb.RuleOverride{Rule: "api", Key: "a*b", Limit: 1}})
	_, err = b.PutOverride(c, cred, console.Override{Rule: "api", Key: "a*b", Limit: 1})
	if status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != status.Convert(apiErr).Message() {
		t.Fatalf("bad pattern: %v, want the API's %v", err, apiErr)
	}
	all, err := b.ListOverrides(c, cred, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 1 || all[0].Rule != "api" || all[0].Key != "vip-*" || all[0].Limit != 9 {
		t.Fatalf("every rule's overrides: %+v", all)
	}
	if err := b.DeleteOverride(c, cred, "api", "vip-*"); err != nil {
		t.Fatal(err)
	}
	if all, err := b.ListOverrides(c, cred, "api"); err != nil || len(all) != 0 {
		t.Fatalf("after delete: %+v, %v", all, err)
	}

	yaml := "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: b\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"
	if _, err := tn.admin.PutEnvoyDomain(c, &pb.PutEnvoyDomainRequest{Yaml: yaml}); err != nil {
		t.Fatal(err)
	}
	ds, err := b.ListEnvoyDomains(context.Background(), cred)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 1 || ds[0].Domain != "edge" || ds[0].Descriptors != 2 || ds[0].Version == 0 || !strings.Contains(ds[0].Definition, "requests_per_unit: 5") {
		t.Fatalf("envoy domains: %+v", ds)
	}
	if h := ds[0].History; len(h) != 1 || h[0].Change != "PUT" || h[0].Version != ds[0].Version || h[0].Time.IsZero() {
		t.Fatalf("envoy domain history on the page: %+v", h)
	}
}

// TestEnvoyDomainHistoryRPC: puts and a delete of a domain are served
// newest first with their changes and times; an unknown domain is
// NotFound and an empty name InvalidArgument.
func TestEnvoyDomainHistoryRPC(t *testing.T) {
	tn := newTestNode(t, nil)
	c := ctx(t)
	y := "domain: edge\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: %d}\n"
	var versions []uint64
	for _, n := range []int{1, 2} {
		put, err := tn.admin.PutEnvoyDomain(c, &pb.PutEnvoyDomainRequest{Yaml: fmt.Sprintf(y, n)})
		if err != nil {
			t.Fatal(err)
		}
		versions = append(versions, put.GetDomain().GetVersion())
	}
	if _, err := tn.admin.DeleteEnvoyDomain(c, &pb.DeleteEnvoyDomainRequest{Domain: "edge"}); err != nil {
		t.Fatal(err)
	}
	h, err := tn.admin.EnvoyDomainHistory(c, &pb.EnvoyDomainHistoryRequest{Domain: "edge"})
	if err != nil {
		t.Fatal(err)
	}
	vs := h.GetVersions()
	if len(vs) != 3 || vs[0].GetChange() != "DELETE" || vs[0].GetDomain() != nil || vs[1].GetVersion() != versions[1] || vs[2].GetVersion() != versions[0] ||
		!strings.Contains(vs[2].GetDomain().GetYaml(), "requests_per_unit: 1") || vs[1].GetTimeUnixNs() == 0 {
		t.Fatalf("history: %v", vs)
	}
	for _, tt := range []struct {
		domain string
		code   codes.Code
	}{{"nope", codes.NotFound}, {"", codes.InvalidArgument}} {
		if _, err := tn.admin.EnvoyDomainHistory(c, &pb.EnvoyDomainHistoryRequest{Domain: tt.domain}); status.Code(err) != tt.code {
			t.Errorf("history of %q: %v, want %v", tt.domain, err, tt.code)
		}
	}
}
