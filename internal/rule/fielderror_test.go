package rule

import (
	"errors"
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
)

// TestValidateFieldPath: every validation error is a *FieldError whose
// Path names the field at fault, and is still ErrInvalid.
func TestValidateFieldPath(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*Rule)
		path   string
	}{
		{"name", func(r *Rule) { r.Name = "" }, "name"},
		{"algorithm", func(r *Rule) { r.Algorithm = 99 }, "algorithm"},
		{"limit", func(r *Rule) { r.Limit = 0 }, "limit"},
		{"period", func(r *Rule) { r.Period = 0 }, "period"},
		{"burst", func(r *Rule) { r.Burst = -1 }, "burst"},
		{"sample count", func(r *Rule) { r.Algorithm, r.SampleCount = bucket.SlidingWindow, 7 }, "sample_count"},
		{"warmup", func(r *Rule) { r.Algorithm, r.Warmup = bucket.FixedWindow, time.Second }, "warmup"},
		{"penalty", func(r *Rule) { r.Penalty = -1 }, "penalty"},
		{"max keys", func(r *Rule) { r.MaxKeys = -1 }, "max_keys"},
		{"fallback limit", func(r *Rule) { r.Fallback.Policy = FallbackLocal }, "fallback.limit"},
		{"fallback policy", func(r *Rule) { r.Fallback.Policy = 9 }, "fallback.policy"},
		{"lease ttl", func(r *Rule) { r.Lease.MaxBatch = 5 }, "lease.ttl"},
		{"lease batch", func(r *Rule) { r.Lease = Lease{MaxBatch: 1000, TTL: time.Millisecond} }, "lease.max_batch"},
		{"override limit", func(r *Rule) { r.Overrides = []Override{{Key: "a", Limit: 1}, {Key: "b", Limit: 0}} }, "overrides[1].limit"},
		{"override burst", func(r *Rule) { r.Overrides = []Override{{Key: "a", Limit: 1, Burst: -1}} }, "overrides[0].burst"},
		{"override key", func(r *Rule) { r.Overrides = []Override{{Key: "", Limit: 1}} }, "overrides[0].key"},
		{"override dup", func(r *Rule) { r.Overrides = []Override{{Key: "a", Limit: 1}, {Key: "a", Limit: 2}} }, "overrides[1].key"},
		{"deny key", func(r *Rule) { r.Deny = []string{"ok", "a\xffb"} }, "deny[1]"},
		{"allow key", func(r *Rule) { r.Allow = []string{""} }, "allow[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Rule{Name: "r", Algorithm: bucket.TokenBucket, Limit: 10, Period: time.Second}
			tc.change(r)
			err := r.Validate()
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("Validate = %v, want a *FieldError", err)
			}
			if fe.Path != tc.path {
				t.Errorf("Path = %q, want %q (%v)", fe.Path, tc.path, err)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("%v is not ErrInvalid", err)
			}
		})
	}
}
