package envoyrls

import (
	"fmt"
	"unicode/utf8"

	rlpb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/tokenserver/tokenserver/internal/bucket"
)

// Request limits. The reference has none; these bound the work of one call.
const (
	// MaxDescriptors is the most descriptors in one request.
	MaxDescriptors = 1000
	// MaxEntries is the most entries in one descriptor.
	MaxEntries = 64
	// MaxHitsAddend is the largest hits_addend: 2^53, what bucket
	// arithmetic holds exactly.
	MaxHitsAddend = bucket.MaxLimit
)

// RequestError is a request refused before anything is counted. Field names
// the offending field as the proto spells it (descriptors[3].entries[0].value);
// the server answers it with InvalidArgument.
type RequestError struct {
	Field string
	Msg   string
}

func (e *RequestError) Error() string { return e.Field + ": " + e.Msg }

func reqErr(field, format string, args ...any) *RequestError {
	return &RequestError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// ValidateRequest refuses what the reference refuses (an empty domain, no
// descriptors), what would crash it (an override with unit UNKNOWN), and
// what tokenserver bounds (sizes, invalid UTF-8, hits_addend past 2^53).
// Everything the reference answers instead, such as an override of 0
// requests (OVER_LIMIT), passes.
func ValidateRequest(req *rlpb.RateLimitRequest) error {
	if req.GetDomain() == "" {
		return reqErr("domain", "must not be empty")
	}
	if !utf8.ValidString(req.GetDomain()) {
		return reqErr("domain", "is not valid UTF-8")
	}
	ds := req.GetDescriptors()
	if len(ds) == 0 {
		return reqErr("descriptors", "must not be empty")
	}
	if len(ds) > MaxDescriptors {
		return reqErr("descriptors", "has %d descriptors, more than the %d allowed", len(ds), MaxDescriptors)
	}
	for i, d := range ds {
		es := d.GetEntries()
		if len(es) > MaxEntries {
			return reqErr(fmt.Sprintf("descriptors[%d].entries", i), "has %d entries, more than the %d allowed", len(es), MaxEntries)
		}
		for j, e := range es {
			if !utf8.ValidString(e.GetKey()) {
				return reqErr(fmt.Sprintf("descriptors[%d].entries[%d].key", i, j), "is not valid UTF-8")
			}
			if !utf8.ValidString(e.GetValue()) {
				return reqErr(fmt.Sprintf("descriptors[%d].entries[%d].value", i, j), "is not valid UTF-8")
			}
		}
		if o := d.GetLimit(); o != nil && !ValidUnit(Unit(o.GetUnit())) {
			return reqErr(fmt.Sprintf("descriptors[%d].limit.unit", i), "must be SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR, got %v", o.GetUnit())
		}
		if h := d.GetHitsAddend(); h != nil && h.GetValue() > MaxHitsAddend {
			return reqErr(fmt.Sprintf("descriptors[%d].hits_addend", i), "%d is above the largest supported %d (2^53)", h.GetValue(), uint64(MaxHitsAddend))
		}
	}
	return nil
}

// HitsAddends is the cost of each descriptor, as the reference counts it: a
// descriptor's own hits_addend when set (0 checks without counting), else
// the request's, where 0 or unset means 1.
func HitsAddends(req *rlpb.RateLimitRequest) []uint64 {
	out := make([]uint64, len(req.GetDescriptors()))
	for i, d := range req.GetDescriptors() {
		if h := d.GetHitsAddend(); h != nil {
			out[i] = h.GetValue()
		} else {
			out[i] = max(1, uint64(req.GetHitsAddend()))
		}
	}
	return out
}
