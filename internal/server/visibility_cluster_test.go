package server_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tokenserver/tokenserver/internal/testcluster"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestTopKeysMergesNodes spreads keys over three owners and asks one node:
// the answer counts every node's decisions.
func TestTopKeysMergesNodes(t *testing.T) {
	c := testcluster.New(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := &pb.Rule{Name: "api", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 1 << 30, Period: durationpb.New(time.Second)}
	if _, err := c.Leader().Admin().PutRule(ctx, &pb.PutRuleRequest{Rule: r}); err != nil {
		t.Fatal(err)
	}
	c.WaitForRule("api")
	c.WaitFor("three live members", func() bool { return c.View().Len() == 3 })
	owners := map[string]bool{}
	var total int64
	for i := range 30 {
		key := fmt.Sprint("user-", i)
		owners[c.OwnerOf(key).ID] = true
		for range i + 1 {
			if _, err := c.Nodes[0].Token().AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: "api", Key: key}); err != nil {
				t.Fatal(err)
			}
			total++
		}
	}
	if len(owners) < 2 {
		t.Fatalf("keys landed on %d owners; the test needs two or more", len(owners))
	}
	for _, n := range c.Nodes {
		resp, err := n.Admin().TopKeys(ctx, &pb.TopKeysRequest{Rule: "api", N: 3})
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetTotal() != total || len(resp.GetMissingNodes()) != 0 {
			t.Errorf("%s: total %d missing %v, want %d and none", n.ID, resp.GetTotal(), resp.GetMissingNodes(), total)
		}
		if len(resp.GetKeys()) != 3 || resp.GetKeys()[0].GetKey() != "user-29" || resp.GetKeys()[0].GetCount() != 30 {
			t.Errorf("%s: keys %v, want user-29 first with 30", n.ID, resp.GetKeys())
		}
		s, err := n.Admin().RuleSeries(ctx, &pb.RuleSeriesRequest{Rule: "api"})
		if err != nil {
			t.Fatal(err)
		}
		var admitted int64
		for _, p := range s.GetPoints() {
			admitted += p.GetAdmitted()
		}
		if admitted != total {
			t.Errorf("%s: series admitted %d, want %d", n.ID, admitted, total)
		}
	}
}

// TestListRuleRatesMergesNodes: decisions of one rule spread over three
// owners; every node answers the cluster's sums for it (and nothing for a
// rule without traffic), while local answers add up to the same.
func TestListRuleRatesMergesNodes(t *testing.T) {
	c := testcluster.New(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, name := range []string{"api", "idle"} {
		r := &pb.Rule{Name: name, Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 1 << 30, Period: durationpb.New(time.Second)}
		if _, err := c.Leader().Admin().PutRule(ctx, &pb.PutRuleRequest{Rule: r}); err != nil {
			t.Fatal(err)
		}
		c.WaitForRule(name)
	}
	c.WaitFor("three live members", func() bool { return c.View().Len() == 3 })
	owners := map[string]bool{}
	var total int64
	for i := range 20 {
		key := fmt.Sprint("user-", i)
		owners[c.OwnerOf(key).ID] = true
		if _, err := c.Nodes[0].Token().AcquireToken(ctx, &pb.AcquireTokenRequest{Rule: "api", Key: key, Permits: ptr(int64(2))}); err != nil {
			t.Fatal(err)
		}
		total++
	}
	if len(owners) < 2 {
		t.Fatalf("keys landed on %d owners; the test needs two or more", len(owners))
	}
	sum := func(xs []int64) (s int64) {
		for _, x := range xs {
			s += x
		}
		return s
	}
	var localAdmitted int64
	for _, n := range c.Nodes {
		resp, err := n.Admin().ListRuleRates(ctx, &pb.ListRuleRatesRequest{WindowSeconds: 60})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetRates()) != 1 || len(resp.GetMissingNodes()) != 0 {
			t.Fatalf("%s: rates %v missing %v, want api alone, none missing", n.ID, resp.GetRates(), resp.GetMissingNodes())
		}
		r := resp.GetRates()[0]
		if r.GetRule() != "api" || r.GetAdmitted() != total || r.GetPermits() != 2*total || len(r.GetSparkline()) != 60 || sum(r.GetSparkline()) != total {
			t.Errorf("%s: %v, want api with %d admitted, %d permits, and the hour in 60 steps summing to %d", n.ID, r, total, 2*total, total)
		}
		local, err := n.Admin().ListRuleRates(ctx, &pb.ListRuleRatesRequest{WindowSeconds: 60, ToUnix: resp.GetToUnix(), Local: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, lr := range local.GetRates() {
			localAdmitted += lr.GetAdmitted()
		}
	}
	if localAdmitted != total {
		t.Errorf("local answers add up to %d admitted, want %d", localAdmitted, total)
	}
	for _, bad := range []*pb.ListRuleRatesRequest{{WindowSeconds: 61}, {Steps: 7}, {Steps: -1}} {
		if _, err := c.Nodes[0].Admin().ListRuleRates(ctx, bad); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%v: %v, want InvalidArgument", bad, err)
		}
	}
}

func ptr[T any](v T) *T { return &v }
