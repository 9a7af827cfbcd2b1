package envoyrls

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Hit is one descriptor's limit to decide, with its cost.
type Hit struct {
	// Limit is the resolved limit (never unlimited).
	Limit *Limit
	// Hits is the cost; 0 checks without counting.
	Hits uint64
	// Debit: Hits is a descriptor's own hits_addend, a report of usage
	// (Envoy sends the cost of a response so, on the response path): the
	// algorithm extension charges it even past the limit, as a commit
	// without a reservation (the debt is repaid before anything else is
	// granted), rather than refusing it as an acquire would. Fixed
	// windows count every hit anyway, as the reference does.
	Debit bool
}

// Decision is a Decider's answer for one Hit.
type Decision struct {
	// Before and After are the counter's value before and after this hit
	// (After = Before + Hits for a fixed window, which keeps counting past
	// the limit as the reference's Redis counter does). Metrics use them to
	// split hits into within, near and over limit.
	Before, After uint64
	// Over: the hit is over the limit.
	Over bool
	// Remaining is what is left in the window (0 when Over).
	Remaining uint32
	// ResetAfter is the time until the limit resets; 0 means the fixed
	// window's DurationUntilReset.
	ResetAfter time.Duration
}

// Decider counts. The in-memory MemDecider has the reference's semantics;
// the server's decides on the owners' buckets.
type Decider interface {
	// Decide returns one Decision per hit, in order. now is the request's
	// time, from the Service's clock.
	Decide(ctx context.Context, now time.Time, hits []Hit) ([]Decision, error)
}

// DefaultNearLimitRatio is the reference's NEAR_LIMIT_RATIO default.
const DefaultNearLimitRatio = 0.8

// Options configure a Service.
type Options struct {
	// Headers selects the response headers (HeadersOff by default).
	Headers HeaderMode
	// HeaderNames renames the three headers of HeadersXRateLimit and
	// HeadersReference (LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER,
	// LIMIT_RESET_HEADER); empty names keep the mode's defaults.
	HeaderNames HeaderNames
	// NearLimitRatio is NEAR_LIMIT_RATIO; 0 means DefaultNearLimitRatio.
	NearLimitRatio float64
	// GlobalShadow is the reference's SHADOW_MODE: every answer is OK.
	GlobalShadow bool
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Metrics, if not nil, counts per domain and rule.
	Metrics *Metrics
}

// Service answers ShouldRateLimit with the reference's semantics over the
// Config in force and a Decider.
type Service struct {
	config  func() *Config
	decider Decider
	opts    Options
	ratio32 float32
}

// NewService returns a Service reading the configuration in force from
// config (called once per request; it may return nil for no configuration).
func NewService(config func() *Config, d Decider, o Options) *Service {
	if o.NearLimitRatio == 0 {
		o.NearLimitRatio = DefaultNearLimitRatio
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Service{config: config, decider: d, opts: o, ratio32: float32(o.NearLimitRatio)}
}

// ShouldRateLimit validates req (a *RequestError when it is refused: nothing
// is counted), resolves every descriptor, lets the Decider count the limited
// ones, and assembles the answer as the reference does. An error from the
// Decider is returned wrapped.
//
// The per-descriptor values of one call (limits, hits, statuses and their
// messages) are allocated as one array each rather than one object per
// descriptor: a call's cost grows slowly with its descriptors.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlpb.RateLimitRequest) (*rlpb.RateLimitResponse, error) {
	if err := ValidateRequest(req); err != nil {
		return nil, err
	}
	now := s.opts.Now()
	nowUnix := now.Unix()
	cfg := s.config()
	domain := req.GetDomain()
	descs := req.GetDescriptors()

	dom := cfg.Domain(domain)
	if dom == nil {
		s.opts.Metrics.unknownDomain()
	}

	// The reference's constructLimitsToCheck.
	var limitsBuf []Limit
	limits := make([]*Limit, len(descs))
	unlimited := make([]bool, len(descs))
	var replacing map[string]bool
	if dom != nil {
		limitsBuf = make([]Limit, len(descs))
		for i, d := range descs {
			l := &limitsBuf[i]
			if !dom.resolve(l, d) {
				continue
			}
			for _, r := range l.Replaces {
				if replacing == nil {
					replacing = map[string]bool{}
				}
				replacing[r] = true
			}
			if l.Unlimited {
				unlimited[i] = true
				continue
			}
			limits[i] = l
		}
	}
	if replacing != nil {
		for i, l := range limits {
			if l != nil && l.Name != "" && replacing[l.Name] {
				limits[i] = nil
			}
		}
	}

	// The costs, as HitsAddends counts them.
	reqAddend := max(1, uint64(req.GetHitsAddend()))
	var hits []Hit
	var idx []int
	for i, l := range limits {
		if l == nil {
			continue
		}
		if hits == nil {
			hits = make([]Hit, 0, len(descs)-i)
			idx = make([]int, 0, len(descs)-i)
		}
		h := Hit{Limit: l, Hits: reqAddend}
		if ha := descs[i].GetHitsAddend(); ha != nil {
			h.Hits = ha.GetValue()
			h.Debit = h.Hits > 0
		}
		hits = append(hits, h)
		idx = append(idx, i)
	}
	var decisions []Decision
	if len(hits) > 0 {
		var err error
		decisions, err = s.decider.Decide(ctx, now, hits)
		if err != nil {
			return nil, fmt.Errorf("decide %d descriptors of domain %q: %w", len(hits), domain, err)
		}
		if len(decisions) != len(hits) {
			return nil, fmt.Errorf("decide %d descriptors of domain %q: the decider answered %d", len(hits), domain, len(decisions))
		}
	}

	statusBuf := make([]rlpb.RateLimitResponse_DescriptorStatus, len(descs))
	statuses := make([]*rlpb.RateLimitResponse_DescriptorStatus, len(descs))
	for i := range statuses {
		statuses[i] = &statusBuf[i]
		statuses[i].Code = rlpb.RateLimitResponse_OK
	}
	if len(hits) > 0 {
		limitBuf := make([]rlpb.RateLimitResponse_RateLimit, len(hits))
		durBuf := make([]durationpb.Duration, len(hits))
		for j, i := range idx {
			s.status(statuses[i], &limitBuf[j], &durBuf[j], limits[i], hits[j].Hits, decisions[j], nowUnix)
		}
	}

	// The reference's shouldRateLimitWorker.
	resp := &rlpb.RateLimitResponse{Statuses: statuses}
	minRemaining := uint32(math.MaxUint32)
	var minimum *rlpb.RateLimitResponse_DescriptorStatus
	failedRate, failedQuota, totalQuota := 0, 0, 0
	headers := s.opts.Headers != HeadersOff
	for i, st := range statuses {
		if headers && st.CurrentLimit != nil && st.LimitRemaining < minRemaining {
			minimum, minRemaining = st, st.LimitRemaining
		}
		if unlimited[i] {
			st.LimitRemaining = math.MaxUint32
			continue
		}
		quota := limits[i] != nil && limits[i].Quota
		if st.Code == rlpb.RateLimitResponse_OVER_LIMIT {
			if quota {
				failedQuota++
			} else {
				failedRate++
				minimum, minRemaining = st, 0
			}
		}
		if quota {
			totalQuota++
		}
	}
	code := rlpb.RateLimitResponse_OK
	if failedRate > 0 || (totalQuota > 0 && totalQuota == failedQuota) {
		code = rlpb.RateLimitResponse_OVER_LIMIT
	}
	if headers && minimum != nil {
		resp.ResponseHeadersToAdd = s.headers(minimum, nowUnix)
	}
	if code == rlpb.RateLimitResponse_OVER_LIMIT && s.opts.GlobalShadow {
		code = rlpb.RateLimitResponse_OK
	}
	resp.OverallCode = code
	return resp, nil
}

// status is the reference's GetResponseDescriptorStatus for one limited
// descriptor, with its statistics: it fills st, with limit and dur as its
// current_limit and duration_until_reset.
func (s *Service) status(st *rlpb.RateLimitResponse_DescriptorStatus, limit *rlpb.RateLimitResponse_RateLimit, dur *durationpb.Duration,
	l *Limit, hits uint64, d Decision, nowUnix int64) {
	m := s.opts.Metrics.stats(l)
	m.add(statTotalHits, hits)
	limit.Name, limit.RequestsPerUnit, limit.Unit = l.Name, l.RequestsPerUnit, l.Unit
	reset := d.ResetAfter
	if reset <= 0 {
		reset = DurationUntilReset(l.Unit, nowUnix)
	}
	// As durationpb.New.
	dur.Seconds, dur.Nanos = int64(reset/time.Second), int32(reset%time.Second)
	st.CurrentLimit, st.DurationUntilReset = limit, dur
	over := uint64(l.RequestsPerUnit)
	near := uint64(math.Floor(float64(float32(over) * s.ratio32)))
	if d.Over {
		st.Code = rlpb.RateLimitResponse_OVER_LIMIT
		if d.Before >= over {
			m.add(statOverLimit, hits)
		} else {
			m.add(statOverLimit, sub(d.After, over))
			m.add(statNearLimit, sub(over, max(near, d.Before)))
		}
		if l.Shadow {
			st.Code = rlpb.RateLimitResponse_OK
			if d.Before >= over {
				m.add(statShadowMode, hits)
			} else {
				m.add(statShadowMode, sub(d.After, over))
			}
		}
		return
	}
	st.Code = rlpb.RateLimitResponse_OK
	st.LimitRemaining = d.Remaining
	if d.After > near {
		if d.Before >= near {
			m.add(statNearLimit, hits)
		} else {
			m.add(statNearLimit, d.After-near)
		}
	}
	m.add(statWithinLimit, hits)
}

func sub(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}

// HeaderMode selects the rate limit headers added to responses.
type HeaderMode int

// The header modes.
const (
	// HeadersOff adds none (the reference's default).
	HeadersOff HeaderMode = iota
	// HeadersDraft adds RateLimit and RateLimit-Policy as structured fields
	// (draft-ietf-httpapi-ratelimit-headers).
	HeadersDraft
	// HeadersXRateLimit adds X-RateLimit-Limit, X-RateLimit-Remaining and
	// X-RateLimit-Reset.
	HeadersXRateLimit
	// HeadersReference adds the reference's LIMIT_RESPONSE_HEADERS_ENABLED
	// set under its default names: RateLimit-Limit, RateLimit-Remaining,
	// RateLimit-Reset.
	HeadersReference
)

// ParseHeaderMode reads --envoy-rate-limit-headers: off (or empty), draft,
// x-ratelimit or reference.
func ParseHeaderMode(s string) (HeaderMode, error) {
	switch s {
	case "", "off", "none":
		return HeadersOff, nil
	case "draft":
		return HeadersDraft, nil
	case "x-ratelimit":
		return HeadersXRateLimit, nil
	case "reference":
		return HeadersReference, nil
	}
	return HeadersOff, fmt.Errorf("unknown rate limit header mode %q (want off, draft, x-ratelimit or reference)", s)
}

// HeaderNames are the names of the three-header modes.
type HeaderNames struct {
	Limit, Remaining, Reset string
}

func (s *Service) headers(st *rlpb.RateLimitResponse_DescriptorStatus, nowUnix int64) []*corev3.HeaderValue {
	l := st.CurrentLimit
	reset := strconv.FormatInt(int64(DurationUntilReset(l.Unit, nowUnix)/time.Second), 10)
	limit := strconv.FormatUint(uint64(l.RequestsPerUnit), 10)
	remaining := strconv.FormatUint(uint64(st.LimitRemaining), 10)
	if s.opts.Headers == HeadersDraft {
		name := l.Name
		if name == "" {
			name = "default"
		}
		policy := strconv.Quote(name)
		return []*corev3.HeaderValue{
			{Key: "RateLimit", Value: policy + ";r=" + remaining + ";t=" + reset},
			{Key: "RateLimit-Policy", Value: policy + ";q=" + limit + ";w=" + strconv.FormatInt(UnitSeconds(l.Unit), 10)},
		}
	}
	names := HeaderNames{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"}
	if s.opts.Headers == HeadersReference {
		names = HeaderNames{"RateLimit-Limit", "RateLimit-Remaining", "RateLimit-Reset"}
	}
	if n := s.opts.HeaderNames; n.Limit != "" {
		names.Limit = n.Limit
	}
	if n := s.opts.HeaderNames; n.Remaining != "" {
		names.Remaining = n.Remaining
	}
	if n := s.opts.HeaderNames; n.Reset != "" {
		names.Reset = n.Reset
	}
	return []*corev3.HeaderValue{
		{Key: names.Limit, Value: limit},
		{Key: names.Remaining, Value: remaining},
		{Key: names.Reset, Value: reset},
	}
}
