package server

import (
	"slices"
	"testing"

	"google.golang.org/grpc/codes"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

func TestRuleHistoryRollbackDiff(t *testing.T) {
	tn := newTestNode(t, nil)
	v1 := tn.put(t, tokenBucket("api", 10))
	tn.put(t, tokenBucket("api", 20))

	h, err := tn.admin.RuleHistory(ctx(t), &pb.RuleHistoryRequest{Name: "api"})
	if err != nil {
		t.Fatal(err)
	}
	if len(h.GetVersions()) != 2 || h.GetVersions()[0].GetRule().GetLimit() != 20 || h.GetVersions()[1].GetChange() != "PUT" || h.GetVersions()[0].GetTimeUnixNs() == 0 {
		t.Fatalf("history %v, want limit 20 then 10, PUT, with times", h.GetVersions())
	}
	rb, err := tn.admin.RollbackRule(ctx(t), &pb.RollbackRuleRequest{Name: "api", ToVersion: v1.GetVersion()})
	if err != nil {
		t.Fatal(err)
	}
	if rb.GetRule().GetLimit() != 10 || rb.GetRule().GetVersion() <= v1.GetVersion() {
		t.Errorf("rollback wrote %v, want limit 10 at a new version", rb.GetRule())
	}
	h, _ = tn.admin.RuleHistory(ctx(t), &pb.RuleHistoryRequest{Name: "api"})
	if got := h.GetVersions()[0].GetChange(); got != "ROLLBACK" {
		t.Errorf("newest change %q, want ROLLBACK", got)
	}
	_, err = tn.admin.RollbackRule(ctx(t), &pb.RollbackRuleRequest{Name: "api", ToVersion: 9999})
	wantCode(t, err, codes.NotFound, "not in its history")
	_, err = tn.admin.RuleHistory(ctx(t), &pb.RuleHistoryRequest{Name: "nope"})
	wantCode(t, err, codes.NotFound, "no history")

	bad := tokenBucket("bad", 0)
	d, err := tn.admin.DiffRules(ctx(t), &pb.DiffRulesRequest{Rules: []*pb.Rule{tokenBucket("api", 10), tokenBucket("api", 30), tokenBucket("new", 1), bad}})
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		change string
		fields []string
		err    bool
	}{{"UNCHANGED", nil, false}, {"UPDATE", []string{"limit"}, false}, {"CREATE", nil, false}, {"", nil, true}}
	for i, w := range want {
		g := d.GetDiffs()[i]
		if g.GetChange() != w.change || !slices.Equal(g.GetFields(), w.fields) || (g.GetError() != "") != w.err {
			t.Errorf("diff %d: %s %v error %q, want %s %v error %v", i, g.GetChange(), g.GetFields(), g.GetError(), w.change, w.fields, w.err)
		}
	}
	// The dry run changed nothing.
	if _, err := tn.admin.GetRule(ctx(t), &pb.GetRuleRequest{Name: "new"}); codeOf(err) != codes.NotFound {
		t.Errorf("DiffRules created a rule: %v", err)
	}
}
