package rule

import (
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
)

// InlineLimit is a limit carried in a request (seed 001's
// acquire_token(user, item, amount, limit)): it replaces the rule's limit
// for that request's key, within the rule's InlinePolicy.
//
// One key has one bucket whatever limit its requests carry: a request
// with another limit resizes the key's bucket (its state kept, clamped to
// the new capacity, as a rule change does) instead of opening a bucket of
// its own. gubernator keys its buckets by the limit as well, so a caller
// that varies its limit starts a fresh, full bucket each time and escapes
// the quota; one bucket per key keeps what was spent spent. For the same
// reason a request may not change the rule's algorithm (another algorithm
// could only start a fresh bucket). A runtime or rule override of the key
// beats a request's limit: the operator set it on purpose.
type InlineLimit struct {
	// Algorithm is the rule's, or bucket.Unspecified for the rule's.
	Algorithm bucket.Algorithm
	// Limit is the permits per Period, 1..InlinePolicy.MaxLimit.
	Limit int64
	// Period is the window or refill period; 0 means the rule's, and it
	// is at most InlinePolicy.MaxPeriod (by default the rule's Period).
	Period time.Duration
	// Burst is the capacity; 0 means Limit. At most InlinePolicy.MaxLimit.
	Burst int64
}

// Inline returns the bucket configuration of l under c's inline policy:
// c's default configuration with l's limit, period and burst. Errors are
// ErrInvalid naming the cap or field at fault: a rule without an inline
// policy refuses every request limit.
func (c *Compiled) Inline(l InlineLimit) (bucket.Config, error) {
	r := c.Rule
	p := r.Inline
	if p.MaxLimit <= 0 {
		return bucket.Config{}, Invalid("rule %q takes no limit in the request: it has no inline policy (set inline.max_limit to allow one)", r.Name)
	}
	maxPeriod := p.MaxPeriod
	if maxPeriod == 0 {
		maxPeriod = r.Period
	}
	period := l.Period
	if period == 0 {
		period = r.Period
	}
	switch {
	case l.Algorithm != bucket.Unspecified && l.Algorithm != r.Algorithm:
		return bucket.Config{}, Invalid("limit.algorithm %s differs from rule %q's %s: a request limit resizes the key's bucket and cannot change its algorithm", l.Algorithm, r.Name, r.Algorithm)
	case l.Limit <= 0:
		return bucket.Config{}, Invalid("limit.limit must be > 0, got %d", l.Limit)
	case l.Limit > p.MaxLimit:
		return bucket.Config{}, Invalid("limit.limit %d is above rule %q's inline.max_limit %d", l.Limit, r.Name, p.MaxLimit)
	case l.Burst < 0:
		return bucket.Config{}, Invalid("limit.burst must be >= 0, got %d", l.Burst)
	case l.Burst > p.MaxLimit:
		return bucket.Config{}, Invalid("limit.burst %d is above rule %q's inline.max_limit %d", l.Burst, r.Name, p.MaxLimit)
	case period < 0:
		return bucket.Config{}, Invalid("limit.period must be >= 0, got %v", l.Period)
	case period > maxPeriod:
		return bucket.Config{}, Invalid("limit.period %v is above rule %q's inline.max_period %v", period, r.Name, maxPeriod)
	}
	cfg := c.Config
	cfg.Limit, cfg.Period, cfg.Burst = l.Limit, int64(period), l.Burst
	if cfg.Burst == 0 {
		cfg.Burst = l.Limit
	}
	if err := cfg.Validate(); err != nil {
		return bucket.Config{}, Invalid("limit under rule %q: %v", r.Name, err)
	}
	return cfg, nil
}
