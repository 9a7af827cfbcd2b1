package rule

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
)

// TestInline: a request's limit within the rule's inline policy becomes
// the rule's configuration with that limit; past a cap, or under a rule
// without a policy, it is ErrInvalid naming the cap.
func TestInline(t *testing.T) {
	base := func(p InlinePolicy) *Compiled {
		r := &Rule{Name: "llm", Algorithm: bucket.TokenBucket, Limit: 10, Period: time.Second, Inline: p}
		if err := r.Validate(); err != nil {
			t.Fatal(err)
		}
		return Compile(r)
	}
	policy := InlinePolicy{MaxLimit: 100, MaxPeriod: time.Minute}
	for _, tc := range []struct {
		name   string
		policy InlinePolicy
		l      InlineLimit
		want   bucket.Config // when err is ""
		err    string        // a substring of the error
	}{
		{"within", policy, InlineLimit{Limit: 50, Period: 10 * time.Second}, bucket.Config{Algorithm: bucket.TokenBucket, Limit: 50, Period: int64(10 * time.Second), Burst: 50}, ""},
		{"rule period by default", policy, InlineLimit{Limit: 5, Burst: 7}, bucket.Config{Algorithm: bucket.TokenBucket, Limit: 5, Period: int64(time.Second), Burst: 7}, ""},
		{"same algorithm named", policy, InlineLimit{Algorithm: bucket.TokenBucket, Limit: 100, Period: time.Minute}, bucket.Config{Algorithm: bucket.TokenBucket, Limit: 100, Period: int64(time.Minute), Burst: 100}, ""},
		{"no policy", InlinePolicy{}, InlineLimit{Limit: 5}, bucket.Config{}, "no inline policy"},
		{"limit past cap", policy, InlineLimit{Limit: 101}, bucket.Config{}, "inline.max_limit 100"},
		{"burst past cap", policy, InlineLimit{Limit: 10, Burst: 101}, bucket.Config{}, "inline.max_limit 100"},
		{"period past cap", policy, InlineLimit{Limit: 10, Period: time.Hour}, bucket.Config{}, "inline.max_period 1m0s"},
		{"period past the rule's when no max_period", InlinePolicy{MaxLimit: 100}, InlineLimit{Limit: 10, Period: 2 * time.Second}, bucket.Config{}, "inline.max_period 1s"},
		{"another algorithm", policy, InlineLimit{Algorithm: bucket.FixedWindow, Limit: 10}, bucket.Config{}, "cannot change its algorithm"},
		{"zero limit", policy, InlineLimit{}, bucket.Config{}, "limit.limit must be > 0"},
		{"negative burst", policy, InlineLimit{Limit: 1, Burst: -1}, bucket.Config{}, "limit.burst must be >= 0"},
		{"negative period", policy, InlineLimit{Limit: 1, Period: -1}, bucket.Config{}, "limit.period must be >= 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := base(tc.policy).Inline(tc.l)
			if tc.err != "" {
				if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want ErrInvalid containing %q", err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

// TestInlineValidatesTheConfig: a limit within the caps that the
// algorithm cannot hold (a sliding window whose period the sample count
// does not divide) is refused too.
func TestInlineValidatesTheConfig(t *testing.T) {
	r := &Rule{Name: "sw", Algorithm: bucket.SlidingWindow, Limit: 10, Period: time.Second, SampleCount: 10, Inline: InlinePolicy{MaxLimit: 100, MaxPeriod: time.Minute}}
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	if _, err := Compile(r).Inline(InlineLimit{Limit: 5, Period: time.Second + 1}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "sample_count") {
		t.Fatalf("err %v, want the sample count named", err)
	}
}
