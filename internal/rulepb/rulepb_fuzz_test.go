package rulepb

import (
	"errors"
	"math"
	"reflect"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokenserver/tokenserver/internal/rule"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// FuzzFromProto decodes arbitrary bytes as a wire rule: conversion and
// validation never panic, a refusal is ErrInvalid, and a rule that
// validates compiles to valid bucket configs and survives ToProto and
// FromProto unchanged.
func FuzzFromProto(f *testing.F) {
	for _, p := range []*pb.Rule{
		{Name: "api", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: 10, Period: durationpb.New(time.Second), Overrides: []*pb.Override{{Key: "vip", Limit: 20}}, Deny: []string{"bad"}},
		{Name: "sw", Algorithm: pb.Algorithm_SLIDING_WINDOW, Limit: 10, Period: durationpb.New(time.Second), SampleCount: 10, Lease: &pb.LeaseSettings{MaxBatch: 2, Ttl: durationpb.New(time.Second)}},
		{Name: "c", Algorithm: pb.Algorithm_CONCURRENCY, Limit: 3, Period: durationpb.New(time.Minute), Fallback: &pb.Fallback{Policy: pb.FallbackPolicy_LOCAL, Limit: 2}},
		{Name: "big", Algorithm: pb.Algorithm_TOKEN_BUCKET, Limit: math.MaxInt64, Period: &durationpb.Duration{Seconds: math.MaxInt64}},
	} {
		b, err := proto.Marshal(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var p pb.Rule
		if proto.Unmarshal(b, &p) != nil {
			return
		}
		r := FromProto(&p)
		r.Normalize()
		if err := r.Validate(); err != nil {
			if !errors.Is(err, rule.ErrInvalid) {
				t.Fatalf("refusal %v is not ErrInvalid", err)
			}
			return
		}
		c := rule.Compile(r)
		keys := []string{"x"}
		for _, o := range r.Overrides {
			keys = append(keys, o.Key)
		}
		for _, k := range keys {
			if err := c.ConfigFor(k).Validate(); err != nil {
				t.Fatalf("valid rule, invalid config for %q: %v", k, err)
			}
		}
		back := FromProto(ToProto(r))
		back.Normalize()
		if !reflect.DeepEqual(back, r) {
			t.Fatalf("round trip changed the rule:\n%+v\n%+v", r, back)
		}
	})
}
