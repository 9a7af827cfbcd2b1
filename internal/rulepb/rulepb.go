// Package rulepb converts rules between rule.Rule and the wire form of
// tokenserver.v1, for the server and for clients that validate locally.
package rulepb

import (
	"math"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
	pb "github.com/tokenserver/tokenserver/proto/tokenserver/v1"
)

// FromProto converts a wire rule into a rule.Rule (not yet validated).
// Version, Generation and UpdatedBy are output only and not read.
func FromProto(p *pb.Rule) *rule.Rule {
	r := &rule.Rule{
		Name:        p.GetName(),
		Algorithm:   bucket.Algorithm(p.GetAlgorithm()),
		Limit:       p.GetLimit(),
		Period:      dur(p.GetPeriod()),
		Burst:       p.GetBurst(),
		SampleCount: int64(p.GetSampleCount()),
		Warmup:      dur(p.GetWarmup()),
		Penalty:     dur(p.GetPenalty()),
		MaxKeys:     p.GetMaxKeys(),
		Deny:        append([]string(nil), p.GetDeny()...),
		Allow:       append([]string(nil), p.GetAllow()...),
		Shadow:      p.GetShadow(),
		Durable:     p.GetDurable(),
		Fallback: rule.Fallback{
			Policy: rule.FallbackPolicy(p.GetFallback().GetPolicy()),
			Limit:  p.GetFallback().GetLimit(),
		},
		Lease: rule.Lease{
			MaxBatch: p.GetLease().GetMaxBatch(),
			TTL:      dur(p.GetLease().GetTtl()),
		},
		Calendar: bucket.Calendar(clampCalendar(p.GetCalendar())),
		TimeZone: p.GetTimeZone(),
		Inline: rule.InlinePolicy{
			MaxLimit:  p.GetInline().GetMaxLimit(),
			MaxPeriod: dur(p.GetInline().GetMaxPeriod()),
		},
		ReservationTTL: dur(p.GetReservationTtl()),
	}
	if int(p.GetAlgorithm()) > int(bucket.Concurrency) || p.GetAlgorithm() < 0 {
		r.Algorithm = bucket.Algorithm(255) // fails validation as unknown
	}
	for _, o := range p.GetOverrides() {
		r.Overrides = append(r.Overrides, rule.Override{Key: o.GetKey(), Limit: o.GetLimit(), Burst: o.GetBurst()})
	}
	return r
}

// clampCalendar reads a Calendar enum; numbers it does not know become
// 255, which fails validation as unknown.
func clampCalendar(c pb.Calendar) uint8 {
	if c < 0 || c > pb.Calendar_MONTH {
		return 255
	}
	return uint8(c)
}

// dur reads a Duration. One past what int64 nanoseconds hold saturates
// (AsDuration), and a malformed one becomes the bound of its sign, so that
// validation refuses it naming the field ("above the longest supported
// duration", "must be > 0").
func dur(d *durationpb.Duration) time.Duration {
	if d == nil {
		return 0
	}
	if err := d.CheckValid(); err != nil {
		if d.GetSeconds() > 0 || d.GetSeconds() == 0 && d.GetNanos() > 0 {
			return math.MaxInt64
		}
		return math.MinInt64
	}
	return d.AsDuration()
}

// ToProto converts a rule.Rule to the wire form.
func ToProto(r *rule.Rule) *pb.Rule {
	p := &pb.Rule{
		Name:        r.Name,
		Algorithm:   pb.Algorithm(r.Algorithm),
		Limit:       r.Limit,
		Period:      durationpb.New(r.Period),
		Burst:       r.Burst,
		SampleCount: int32(r.SampleCount),
		MaxKeys:     r.MaxKeys,
		Deny:        append([]string(nil), r.Deny...),
		Allow:       append([]string(nil), r.Allow...),
		Shadow:      r.Shadow,
		Durable:     r.Durable,
		Version:     r.Version,
		Generation:  r.Generation,
		UpdatedBy:   r.UpdatedBy,
		Calendar:    pb.Calendar(r.Calendar),
		TimeZone:    r.TimeZone,
	}
	if r.Inline != (rule.InlinePolicy{}) {
		p.Inline = &pb.InlinePolicy{MaxLimit: r.Inline.MaxLimit}
		if r.Inline.MaxPeriod != 0 {
			p.Inline.MaxPeriod = durationpb.New(r.Inline.MaxPeriod)
		}
	}
	if r.ReservationTTL != 0 {
		p.ReservationTtl = durationpb.New(r.ReservationTTL)
	}
	if r.Warmup != 0 {
		p.Warmup = durationpb.New(r.Warmup)
	}
	if r.Penalty != 0 {
		p.Penalty = durationpb.New(r.Penalty)
	}
	if r.Fallback != (rule.Fallback{}) {
		p.Fallback = &pb.Fallback{Policy: pb.FallbackPolicy(r.Fallback.Policy), Limit: r.Fallback.Limit}
	}
	if r.Lease != (rule.Lease{}) {
		p.Lease = &pb.LeaseSettings{MaxBatch: r.Lease.MaxBatch, Ttl: durationpb.New(r.Lease.TTL)}
	}
	for _, o := range r.Overrides {
		p.Overrides = append(p.Overrides, &pb.Override{Key: o.Key, Limit: o.Limit, Burst: o.Burst})
	}
	return p
}

// ClientRule is the part of a rule that clients read in the cluster view.
func ClientRule(r *rule.Rule) *pb.ClientRule {
	full := ToProto(r)
	cfg := r.Config()
	return &pb.ClientRule{
		Name:      r.Name,
		Algorithm: full.Algorithm,
		Limit:     r.Limit,
		Period:    full.Period,
		Burst:     cfg.Capacity(),
		Fallback:  full.Fallback,
		Lease:     full.Lease,
		Version:   r.Version,
	}
}
