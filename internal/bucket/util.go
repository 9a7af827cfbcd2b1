package bucket

import "math"

// maxDur caps computed durations so that now+duration cannot overflow for
// any realistic now.
const maxDur = math.MaxInt64 / 4

// addSat returns a+b, saturating at the int64 bounds.
func addSat(a, b int64) int64 {
	s := a + b
	if b > 0 && s < a {
		return math.MaxInt64
	}
	if b < 0 && s > a {
		return math.MinInt64
	}
	return s
}

// mulSat returns a*b for a, b >= 0, saturating at math.MaxInt64.
func mulSat(a, b int64) int64 {
	if a <= 0 || b <= 0 {
		return 0
	}
	if a > math.MaxInt64/b {
		return math.MaxInt64
	}
	return a * b
}

// floorDiv is a/b rounded towards minus infinity (b > 0), so that windows
// stay aligned for negative times too.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// floorMod is a mod b in [0, b) (b > 0).
func floorMod(a, b int64) int64 {
	m := a % b
	if m < 0 {
		m += b
	}
	return m
}

// ceilNs rounds a non-negative float duration up to whole nanoseconds,
// capped at maxDur; NaN and negative values give 0.
func ceilNs(f float64) int64 {
	if !(f > 0) {
		return 0
	}
	if f >= maxDur {
		return maxDur
	}
	return int64(math.Ceil(f))
}

// minTrue returns the least w in [0, maxDur] with ok(w), for a monotone ok
// (false up to some point, true from there on; ok(maxDur) is taken as true),
// searching from the estimate guess. Floating-point estimates are off by a
// nanosecond or two at most, so this usually costs two calls of ok; it makes
// durations agree exactly with the predicate the next call will apply.
func minTrue(guess int64, ok func(int64) bool) int64 {
	guess = min(max(guess, 0), maxDur)
	var lo, hi int64 // !ok(lo) (lo == -1 stands for "before 0"), ok(hi)
	if ok(guess) {
		hi = guess
		for step := int64(1); ; step *= 2 {
			lo = hi - step
			if lo < 0 {
				lo = -1
				break
			}
			if !ok(lo) {
				break
			}
			hi = lo
		}
	} else {
		lo = guess
		for step := int64(1); ; step *= 2 {
			hi = lo + step
			if hi >= maxDur {
				hi = maxDur
				break
			}
			if ok(hi) {
				break
			}
			lo = hi
		}
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if ok(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

// effective returns the permits a request is judged for and whether it can
// ever be granted: a request above capacity is cut to capacity when Partial
// (for the algorithms that otherwise ignore Partial) and never granted
// otherwise.
func effective(r Request, capacity int64) (n int64, ok bool) {
	if r.Permits > capacity {
		if !r.Partial {
			return r.Permits, false
		}
		return capacity, true
	}
	return r.Permits, true
}
