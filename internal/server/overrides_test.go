package server

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// TestRuntimeOverrides: exact beats prefix, the longest prefix wins, the
// rule's own override applies where no runtime one does, deletes and
// expiry restore the rule's limit, and bad patterns are refused.
func TestRuntimeOverrides(t *testing.T) {
	tn := newTestNode(t, nil)
	c := ctx(t)
	if _, err := tn.admin.PutRule(c, &pb.PutRuleRequest{Rule: &pb.Rule{Name: "api", Algorithm: pb.Algorithm_FIXED_WINDOW, Limit: 2,
		Period: durationpb.New(time.Hour), Overrides: []*pb.Override{{Key: "premium-own", Limit: 7}}}}); err != nil {
		t.Fatal(err)
	}
	put := func(key string, limit int64, expires int64) error {
		_, err := tn.admin.PutOverride(c, &pb.PutOverrideRequest{Override: &pb.RuleOverride{Rule: "api", Key: key, Limit: limit, ExpiresUnixNs: expires}})
		return err
	}
	for _, o := range []struct {
		key   string
		limit int64
	}{{"premium-*", 5}, {"premium-gold-*", 9}, {"premium-x", 3}} {
		if err := put(o.key, o.limit, 0); err != nil {
			t.Fatalf("put %s: %v", o.key, err)
		}
	}
	zero := int64(0)
	capacity := func(key string) int64 {
		t.Helper()
		r, err := tn.token.AcquireToken(c, &pb.AcquireTokenRequest{Rule: "api", Key: key, Permits: &zero})
		if err != nil {
			t.Fatal(err)
		}
		return r.GetRemaining()
	}
	for key, want := range map[string]int64{"premium-x": 3, "premium-y": 5, "premium-gold-1": 9, "premium-own": 5, "other": 2} {
		if got := capacity(key); got != want {
			t.Errorf("capacity of %s = %d, want %d", key, got, want)
		}
	}
	if _, err := tn.admin.DeleteOverride(c, &pb.DeleteOverrideRequest{Rule: "api", Key: "premium-*"}); err != nil {
		t.Fatal(err)
	}
	if got := capacity("premium-own"); got != 7 {
		t.Errorf("premium-own after deleting premium-*: %d, want the rule's own 7", got)
	}
	if _, err := tn.admin.DeleteOverride(c, &pb.DeleteOverrideRequest{Rule: "api", Key: "premium-*"}); status.Code(err) != codes.NotFound {
		t.Errorf("second delete: %v, want NotFound", err)
	}
	for _, bad := range []string{"a*b", "**", ""} {
		if err := put(bad, 1, 0); status.Code(err) != codes.InvalidArgument {
			t.Errorf("pattern %q: %v, want InvalidArgument", bad, err)
		}
	}
	if err := put("x", 0, 0); status.Code(err) != codes.InvalidArgument {
		t.Errorf("limit 0: %v, want InvalidArgument", err)
	}
	if _, err := tn.admin.PutOverride(c, &pb.PutOverrideRequest{Override: &pb.RuleOverride{Rule: "nope", Key: "x", Limit: 1}}); status.Code(err) != codes.NotFound {
		t.Errorf("override of a missing rule: %v, want NotFound", err)
	}
	if err := put("soon", 4, time.Now().Add(time.Hour).UnixNano()); err != nil {
		t.Fatal(err)
	}
	l, err := tn.admin.ListOverrides(c, &pb.ListOverridesRequest{Rule: "api", PageSize: 2})
	if err != nil || len(l.GetOverrides()) != 2 || l.GetNextPageToken() == "" {
		t.Fatalf("list page 1: %v %v", l, err)
	}
	l2, err := tn.admin.ListOverrides(c, &pb.ListOverridesRequest{Rule: "api", PageSize: 2, PageToken: l.GetNextPageToken()})
	if err != nil || len(l2.GetOverrides()) != 1 || l2.GetOverrides()[0].GetKey() != "soon" || l2.GetOverrides()[0].GetVersion() == 0 {
		t.Fatalf("list page 2: %v %v", l2, err)
	}
	store, _ := tn.node.overrides()
	if k, err := store.ExpireOverrides(c, time.Now().Add(2*time.Hour).UnixNano()); err != nil || k != 1 {
		t.Fatalf("expire: %d %v", k, err)
	}
	if got := capacity("soon"); got != 2 {
		t.Errorf("soon after its expiry: %d, want the rule's 2", got)
	}
}
