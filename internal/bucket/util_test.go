package bucket

import (
	"math"
	"strings"
	"testing"
)

func TestArithmetic(t *testing.T) {
	for _, tc := range []struct{ a, b, div, mod int64 }{
		{7, 3, 2, 1}, {-7, 3, -3, 2}, {-6, 3, -2, 0}, {0, 5, 0, 0}, {-1, 5, -1, 4},
	} {
		if d, m := floorDiv(tc.a, tc.b), floorMod(tc.a, tc.b); d != tc.div || m != tc.mod {
			t.Errorf("floorDiv/floorMod(%d, %d) = %d, %d, want %d, %d", tc.a, tc.b, d, m, tc.div, tc.mod)
		}
	}
	if addSat(math.MaxInt64-1, 5) != math.MaxInt64 || addSat(math.MinInt64+1, -5) != math.MinInt64 || addSat(2, 3) != 5 {
		t.Error("addSat does not saturate")
	}
	if mulSat(math.MaxInt64/2, 3) != math.MaxInt64 || mulSat(0, 3) != 0 || mulSat(4, 5) != 20 {
		t.Error("mulSat does not saturate")
	}
	if ceilNs(math.NaN()) != 0 || ceilNs(-1) != 0 || ceilNs(1e300) != maxDur || ceilNs(2.1) != 3 {
		t.Error("ceilNs out of range")
	}
	for _, want := range []int64{0, 1, 2, 1000, 123456789, maxDur} {
		for _, guess := range []int64{-5, 0, 1, want - 1, want, want + 1, 1 << 40, maxDur} {
			calls := 0
			got := minTrue(guess, func(w int64) bool { calls++; return w >= want })
			if got != want {
				t.Errorf("minTrue(guess %d) = %d, want %d", guess, got, want)
			}
			if calls > 130 {
				t.Errorf("minTrue(guess %d) for %d made %d calls", guess, want, calls)
			}
		}
	}
}

func TestAlgorithmNames(t *testing.T) {
	for a := TokenBucket; a <= Concurrency; a++ {
		if got, err := ParseAlgorithm(a.String()); err != nil || got != a {
			t.Errorf("ParseAlgorithm(%q) = %v, %v", a.String(), got, err)
		}
	}
	if _, err := ParseAlgorithm("unspecified"); err == nil {
		t.Error("parsed unspecified")
	}
	if s := Algorithm(99).String(); s != "algorithm(99)" {
		t.Errorf("Algorithm(99) = %q", s)
	}
}

func TestValidate(t *testing.T) {
	ok := Config{Algorithm: SlidingWindow, Limit: 10, Period: sec}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	for _, tc := range []struct {
		c    Config
		want string
	}{
		{Config{Limit: 1, Period: 1}, "algorithm"},
		{Config{Algorithm: TokenBucket, Period: 1}, "limit"},
		{Config{Algorithm: TokenBucket, Limit: 1}, "period"},
		{Config{Algorithm: TokenBucket, Limit: 1, Period: 1, Burst: -1}, "burst"},
		{Config{Algorithm: SlidingWindow, Limit: 1, Period: sec, SampleCount: MaxSampleCount + 1}, "sample_count"},
		{Config{Algorithm: TokenBucket, Limit: 1, Period: 1, Warmup: -1}, "warmup"},
		{Config{Algorithm: FixedWindow, Limit: 1, Period: 1, Warmup: 1}, "warmup"},
		{Config{Algorithm: SlidingWindow, Limit: 1, Period: sec, SampleCount: 7}, "divide"},
		{Config{Algorithm: SlidingWindow, Limit: 1, Period: 100 * us, SampleCount: 1000}, "1µs"},
		{Config{Algorithm: SlidingLog, Limit: MaxLogLimit + 1, Period: sec}, "sliding-log cap"},
		{Config{Algorithm: Concurrency, Limit: MaxConcurrencyLimit + 1, Period: sec}, "concurrency cap"},
		{Config{Algorithm: LeakyBucket, Limit: 10, Period: 5}, "nanosecond"},
	} {
		if err := tc.c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want an error naming %q", tc.c, err, tc.want)
		}
	}
}
