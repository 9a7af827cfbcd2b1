package server

import (
	"context"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokenserver/tokenserver/internal/console"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// The rule page's over-admission bound (RuleBound, one fan-out) and cost
// fields (a PutRule of the stored rule with those fields changed, so the
// validation messages, roles and audit are PutRule's).

var (
	_ console.BoundReader = (*consoleBackend)(nil)
	_ console.CostEditor  = (*consoleBackend)(nil)
)

// RuleBound implements console.BoundReader.
func (b *consoleBackend) RuleBound(ctx context.Context, c console.Credential, name string) (console.RuleBound, error) {
	resp, err := invoke(ctx, b.n, c, pb.AdminService_RuleBound_FullMethodName, &pb.RuleBoundRequest{Rule: name}, b.admin.RuleBound)
	if err != nil {
		return console.RuleBound{}, err
	}
	out := console.RuleBound{Durable: resp.GetDurable(), Missing: resp.GetMissingNodes()}
	for _, nb := range resp.GetNodes() {
		cn := console.NodeBound{Node: nb.GetNode(), Permits: nb.GetPermits(), CheckpointBuckets: nb.GetCheckpointBuckets()}
		if ns := nb.GetCheckpointUnixNs(); ns != 0 {
			cn.Checkpoint = time.Unix(0, ns)
		}
		for _, p := range nb.GetParts() {
			cn.Parts = append(cn.Parts, console.BoundPart{Name: p.GetName(), Permits: p.GetPermits()})
		}
		out.Nodes = append(out.Nodes, cn)
	}
	return out, nil
}

// costOf is r's cost fields for the console.
func costOf(r *pb.Rule) console.Cost {
	c := console.Cost{TimeZone: r.GetTimeZone(), Durable: r.GetDurable(),
		InlineMaxLimit: r.GetInline().GetMaxLimit(), InlineMaxPeriod: r.GetInline().GetMaxPeriod().AsDuration()}
	if r.GetCalendar() != pb.Calendar_CALENDAR_UNSPECIFIED {
		c.Calendar = r.GetCalendar().String()
	}
	if r.GetReservationTtl() != nil {
		c.ReservationTTL = r.GetReservationTtl().AsDuration()
	}
	return c
}

// withCost sets r's cost fields to c (zero values clear them).
func withCost(r *pb.Rule, c console.Cost) {
	r.Calendar = pb.Calendar(pb.Calendar_value[c.Calendar])
	r.TimeZone = c.TimeZone
	r.Durable = c.Durable
	r.Inline = nil
	if c.InlineMaxLimit != 0 || c.InlineMaxPeriod != 0 {
		r.Inline = &pb.InlinePolicy{MaxLimit: c.InlineMaxLimit, MaxPeriod: durationpb.New(c.InlineMaxPeriod)}
	}
	r.ReservationTtl = nil
	if c.ReservationTTL != 0 {
		r.ReservationTtl = durationpb.New(c.ReservationTTL)
	}
}

// PutRuleCost implements console.CostEditor: the stored rule, read as the
// caller, with the cost fields replaced, written with PutRule under
// expectedVersion (the version the form showed), else the version read.
func (b *consoleBackend) PutRuleCost(ctx context.Context, c console.Credential, name string, cost console.Cost, expectedVersion uint64) (console.Rule, error) {
	cur, err := invoke(ctx, b.n, c, pb.AdminService_GetRule_FullMethodName, &pb.GetRuleRequest{Name: name}, b.admin.GetRule)
	if err != nil {
		return console.Rule{}, err
	}
	r := proto.Clone(cur).(*pb.Rule)
	if expectedVersion == 0 {
		expectedVersion = r.GetVersion()
	}
	r.Version, r.Generation, r.UpdatedBy = 0, 0, ""
	withCost(r, cost)
	req := &pb.PutRuleRequest{Rule: r, ExpectedVersion: &expectedVersion}
	resp, err := invoke(ctx, b.n, c, pb.AdminService_PutRule_FullMethodName, req, b.admin.PutRule)
	if err != nil {
		return console.Rule{}, err
	}
	return consoleRule(resp.GetRule())
}

// consoleRule is r for the console: its definition and cost fields.
func consoleRule(r *pb.Rule) (console.Rule, error) {
	def, err := definition(r)
	if err != nil {
		return console.Rule{}, err
	}
	return console.Rule{Name: r.GetName(), Version: r.GetVersion(), Definition: def, Cost: costOf(r)}, nil
}
