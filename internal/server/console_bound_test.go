package server

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokenserver/tokenserver/internal/console"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// TestConsoleRuleBoundAndCost: RuleBound names every part of a rule's
// bound, and a live concurrency lease shows in leases, in the rules list's
// figures too; the cost fields round-trip through PutRule, and a bad time
// zone comes back with PutRule's own message and changes nothing.
func TestConsoleRuleBoundAndCost(t *testing.T) {
	tn := newTestNode(t, nil)
	c := ctx(t)
	for _, r := range []*pb.Rule{
		{Name: "conc", Algorithm: pb.Algorithm_CONCURRENCY, Limit: 10, Period: durationpb.New(time.Minute)},
		{Name: "quota", Algorithm: pb.Algorithm_FIXED_WINDOW, Limit: 100, Period: durationpb.New(time.Hour)},
	} {
		if _, err := tn.admin.PutRule(c, &pb.PutRuleRequest{Rule: r}); err != nil {
			t.Fatal(err)
		}
	}
	if resp, err := tn.token.AcquireToken(c, &pb.AcquireTokenRequest{Rule: "conc", Key: "k", Permits: proto.Int64(3)}); err != nil || !resp.GetAllowed() {
		t.Fatalf("acquire: %v %v", resp, err)
	}
	b := &consoleBackend{n: tn.node, admin: &adminService{n: tn.node}}
	cred := console.Credential{RemoteAddr: "127.0.0.1:1"}
	rb, err := b.RuleBound(c, cred, "conc")
	if err != nil {
		t.Fatal(err)
	}
	if len(rb.Nodes) != 1 || rb.Durable || len(rb.Missing) != 0 {
		t.Fatalf("bound: %+v", rb)
	}
	if got := rb.PartNames(); len(got) != 4 || got[0] != "unplanned_fresh" || got[3] != "replication_lag" {
		t.Fatalf("parts: %v", got)
	}
	if rb.PartTotal("leases") != 3 || rb.Total() != 3 || rb.Nodes[0].Permits != 3 {
		t.Fatalf("a 3-permit lease: %+v", rb)
	}
	if _, err := b.RuleBound(c, cred, "nope"); status.Code(err) != codes.NotFound {
		t.Fatalf("unknown rule: %v", err)
	}
	rules, err := b.ListRules(c, cred)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rules {
		if want := map[string]int64{"conc": 3}[r.Name]; r.Bound != want {
			t.Errorf("rules list: %s bound %d, want %d", r.Name, r.Bound, want)
		}
	}

	cur, err := b.GetRule(c, cred, "quota")
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.PutRuleCost(c, cred, "quota", console.Cost{Calendar: "DAY", TimeZone: "Mars/Olympus"}, cur.Version)
	if status.Code(err) != codes.InvalidArgument || !containsAll(status.Convert(err).Message(), "Mars/Olympus") {
		t.Fatalf("bad time zone: %v", err)
	}
	_, err = b.PutRuleCost(c, cred, "quota", console.Cost{Calendar: "DAY", InlineMaxLimit: 500, InlineMaxPeriod: time.Hour}, cur.Version)
	if status.Code(err) != codes.InvalidArgument || !containsAll(status.Convert(err).Message(), "inline limits apply to period windows") {
		t.Fatalf("inline on a calendar rule: %v", err)
	}
	want := console.Cost{Calendar: "DAY", TimeZone: "Europe/Paris", ReservationTTL: 30 * time.Second, Durable: true}
	saved, err := b.PutRuleCost(c, cred, "quota", want, cur.Version)
	if err != nil {
		t.Fatal(err)
	}
	if saved.Cost != want || saved.Version <= cur.Version {
		t.Fatalf("saved %+v, want cost %+v", saved, want)
	}
	if _, err := b.PutRuleCost(c, cred, "quota", want, cur.Version); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("stale version: %v", err)
	}
	rb, err = b.RuleBound(c, cred, "quota")
	if err != nil || !rb.Durable {
		t.Fatalf("durable after save: %+v %v", rb, err)
	}
	inline := console.Cost{InlineMaxLimit: 500, InlineMaxPeriod: time.Hour}
	if got, err := b.PutRuleCost(c, cred, "quota", inline, 0); err != nil || got.Cost != inline {
		t.Fatalf("inline: %+v %v", got, err)
	}
	cleared, err := b.PutRuleCost(c, cred, "quota", console.Cost{}, 0)
	if err != nil || cleared.Cost != (console.Cost{}) {
		t.Fatalf("cleared: %+v %v", cleared, err)
	}
}

func containsAll(s string, subs ...string) bool {
	for _, x := range subs {
		if !strings.Contains(s, x) {
			return false
		}
	}
	return true
}
