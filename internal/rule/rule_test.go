package rule

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
)

func valid() *Rule {
	return &Rule{Name: "api", Algorithm: bucket.TokenBucket, Limit: 10, Period: time.Second}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name   string
		change func(r *Rule)
		want   string // substring of the error; "" = valid
	}{
		{"ok", func(r *Rule) {}, ""},
		{"empty name", func(r *Rule) { r.Name = "" }, "rule name is empty"},
		{"bad name char", func(r *Rule) { r.Name = "a b" }, "character ' '"},
		{"long name", func(r *Rule) { r.Name = strings.Repeat("a", MaxNameLen+1) }, "above the limit"},
		{"unknown algorithm", func(r *Rule) { r.Algorithm = 0 }, "unknown algorithm"},
		{"limit zero", func(r *Rule) { r.Limit = 0 }, "limit must be > 0"},
		{"period zero", func(r *Rule) { r.Period = 0 }, "period must be > 0"},
		{"negative burst", func(r *Rule) { r.Burst = -1 }, "burst must be >= 0"},
		{"sample count not dividing", func(r *Rule) {
			r.Algorithm, r.SampleCount, r.Period = bucket.SlidingWindow, 7, time.Second
		}, "must divide the period"},
		{"sample count ok", func(r *Rule) { r.Algorithm, r.SampleCount = bucket.SlidingWindow, 4 }, ""},
		{"sliding log above cap", func(r *Rule) { r.Algorithm, r.Limit = bucket.SlidingLog, bucket.MaxLogLimit+1 }, "sliding-log cap"},
		{"warmup on window", func(r *Rule) { r.Algorithm, r.Warmup = bucket.FixedWindow, time.Second }, "warmup applies to token-bucket only"},
		{"negative penalty", func(r *Rule) { r.Penalty = -time.Second }, "penalty must be >= 0"},
		{"negative max keys", func(r *Rule) { r.MaxKeys = -1 }, "max_keys must be >= 0"},
		{"override empty key", func(r *Rule) { r.Overrides = []Override{{Key: "", Limit: 5}} }, "overrides[0]: key is empty"},
		{"override dup", func(r *Rule) { r.Overrides = []Override{{Key: "a", Limit: 5}, {Key: "a", Limit: 6}} }, "appears twice"},
		{"override bad limit", func(r *Rule) { r.Overrides = []Override{{Key: "vip", Limit: 0}} }, `overrides[0] (key "vip"): limit must be > 0`},
		{"deny key too long", func(r *Rule) { r.Deny = []string{strings.Repeat("k", MaxKeyLen+1)} }, "deny[0]: key is 257 bytes"},
		{"allow empty", func(r *Rule) { r.Allow = []string{""} }, "allow[0]: key is empty"},
		{"local fallback needs limit", func(r *Rule) { r.Fallback.Policy = FallbackLocal }, "fallback.limit must be > 0"},
		{"fallback limit without local", func(r *Rule) { r.Fallback = Fallback{Policy: FallbackAllow, Limit: 3} }, "local fallback policy only"},
		{"unknown fallback", func(r *Rule) { r.Fallback.Policy = 9 }, "fallback.policy 9 is unknown"},
		{"lease needs ttl", func(r *Rule) { r.Lease.MaxBatch = 5 }, "lease.ttl must be > 0"},
		{"lease on leaky", func(r *Rule) {
			r.Algorithm, r.Lease = bucket.LeakyBucket, Lease{MaxBatch: 2, TTL: time.Second}
		}, "leases apply to"},
		{"lease ttl above period", func(r *Rule) { r.Lease = Lease{MaxBatch: 2, TTL: 2 * time.Second} }, "longer than the period"},
		{"lease batch above capacity", func(r *Rule) { r.Lease = Lease{MaxBatch: 11, TTL: time.Second} }, "above the capacity"},
		{"lease ok", func(r *Rule) { r.Lease = Lease{MaxBatch: 5, TTL: 500 * time.Millisecond} }, ""},
		// Edges of the arithmetic and bad bytes.
		{"limit above 2^53", func(r *Rule) { r.Limit = math.MaxInt64 }, "limit 9223372036854775807 is above the largest supported limit"},
		{"limit at 2^53", func(r *Rule) { r.Limit = bucket.MaxLimit }, ""},
		{"burst above 2^53", func(r *Rule) { r.Burst = bucket.MaxLimit + 1 }, "burst 9007199254740993 is above"},
		{"override limit above 2^53", func(r *Rule) { r.Overrides = []Override{{Key: "vip", Limit: math.MaxInt64}} }, `overrides[0] (key "vip"): limit`},
		{"period past int64 ns", func(r *Rule) { r.Period = math.MaxInt64 }, "period 2562047h47m16.854775807s is above the longest supported duration"},
		{"period 10 years", func(r *Rule) { r.Period = time.Duration(bucket.MaxDuration) }, ""},
		{"penalty 292 years", func(r *Rule) { r.Penalty = math.MaxInt64 }, "penalty 2562047h47m16.854775807s is above"},
		{"warmup past int64 ns", func(r *Rule) { r.Warmup = math.MaxInt64 }, "warmup 2562047h47m16.854775807s is above"},
		{"lease ttl above a day", func(r *Rule) { r.Period, r.Lease = 48*time.Hour, Lease{MaxBatch: 1, TTL: 25 * time.Hour} }, "lease.ttl 25h0m0s is above the limit of 24h0m0s"},
		{"concurrency lease above a day", func(r *Rule) { r.Algorithm, r.Period = bucket.Concurrency, 365*24*time.Hour }, "above the longest concurrency lease"},
		{"fallback limit above 2^53", func(r *Rule) { r.Fallback = Fallback{Policy: FallbackLocal, Limit: math.MaxInt64} }, "fallback.limit 9223372036854775807 is above"},
		{"deny invalid utf-8", func(r *Rule) { r.Deny = []string{"ok", "a\xffb"} }, `deny[1]: key "a\xffb" is not valid UTF-8`},
		{"override invalid utf-8", func(r *Rule) { r.Overrides = []Override{{Key: "\xc3", Limit: 1}} }, "overrides[0]: key \"\\xc3\" is not valid UTF-8"},
		{"name invalid utf-8", func(r *Rule) { r.Name = "a\xff" }, `rule name "a\xff": byte 0xff at 1`},
		{"rule above 1 MiB", func(r *Rule) {
			for i := range 5000 {
				r.Deny = append(r.Deny, fmt.Sprintf("%0250d", i))
			}
		}, "above the limit of 1048576 (1 MiB)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := valid()
			tt.change(r)
			err := r.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tt.want)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Validate() = %v, not ErrInvalid", err)
			}
		})
	}
}

// FuzzValidate checks that validation never panics and that every rule it
// accepts compiles to bucket configs that validate too.
func FuzzValidate(f *testing.F) {
	f.Add("api", uint8(1), int64(10), int64(time.Second), int64(0), int64(0), int64(0), "vip", int64(5), uint8(0), int64(0))
	f.Add("w", uint8(4), int64(100), int64(time.Second), int64(0), int64(7), int64(0), "", int64(0), uint8(3), int64(2))
	f.Fuzz(func(t *testing.T, name string, alg uint8, limit, period, burst, samples, warmup int64, okey string, olimit int64, fb uint8, fblimit int64) {
		r := &Rule{Name: name, Algorithm: bucket.Algorithm(alg), Limit: limit, Period: time.Duration(period), Burst: burst,
			SampleCount: samples, Warmup: time.Duration(warmup), Fallback: Fallback{Policy: FallbackPolicy(fb), Limit: fblimit}}
		if okey != "" {
			r.Overrides = []Override{{Key: okey, Limit: olimit}}
		}
		if err := r.Validate(); err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error %v is not ErrInvalid", err)
			}
			return
		}
		c := Compile(r)
		for _, key := range []string{"x", okey} {
			if key == "" {
				continue
			}
			if err := c.ConfigFor(key).Validate(); err != nil {
				t.Fatalf("valid rule %+v compiled to an invalid config for %q: %v", r, key, err)
			}
		}
	})
}

func TestConfigForOverride(t *testing.T) {
	r := valid()
	r.Overrides = []Override{{Key: "vip", Limit: 100}, {Key: "big", Limit: 5, Burst: 50}}
	c := Compile(r)
	if got := c.ConfigFor("vip"); got.Limit != 100 || got.Capacity() != 100 {
		t.Fatalf("vip config %+v", got)
	}
	if got := c.ConfigFor("big"); got.Capacity() != 50 {
		t.Fatalf("big capacity %d, want 50", got.Capacity())
	}
	if got := c.ConfigFor("other"); got != &c.Config {
		t.Fatalf("other key got %+v", got)
	}
}
