package loadgen

import (
	"math"
	"math/bits"
)

// A histogram counts values (latencies in nanoseconds) in log-linear buckets,
// as HdrHistogram does: values below 2^histSubBits are counted exactly, and
// every larger power-of-two range [2^k, 2^(k+1)) is split into
// 2^(histSubBits-1) equal buckets, so a bucket is at most 1/128 of its values
// wide (under 0.8% relative error; the midpoint we report is within 0.4%).
// Values at or above 2^histMaxBits (about 4.9 hours in nanoseconds) are
// counted in the top bucket.
//
// Record costs a few instructions and never allocates. A histogram is not
// safe for simultaneous use: give each goroutine its own and Merge them at
// the end. The zero value is empty and ready to use.
type histogram struct {
	counts   [histBuckets]uint64
	total    uint64
	min, max int64
	sum      float64
}

const (
	histSubBits  = 8                      // values < 256 are exact
	histSubCount = 1 << (histSubBits - 1) // 128 buckets per power of two
	histMaxBits  = 44                     // values up to 2^44-1 are resolved
	histBuckets  = (histMaxBits - histSubBits + 2) * histSubCount
	histMaxValue = int64(1)<<histMaxBits - 1
)

// bucketOf is the index of v's bucket (v >= 0).
func bucketOf(v int64) int {
	if v < 2*histSubCount {
		return int(v)
	}
	shift := bits.Len64(uint64(v)) - histSubBits // >= 1; v>>shift is in [128, 256)
	return (shift+1)*histSubCount + int(v>>shift) - histSubCount
}

// bucketRange is the smallest and largest value of bucket i.
func bucketRange(i int) (lo, hi int64) {
	if i < 2*histSubCount {
		return int64(i), int64(i)
	}
	shift := i/histSubCount - 1
	m := int64(i%histSubCount + histSubCount)
	return m << shift, (m+1)<<shift - 1
}

// record counts one value; a negative one counts as 0, one beyond the range
// as the largest.
func (h *histogram) record(v int64) {
	if v < 0 {
		v = 0
	} else if v > histMaxValue {
		v = histMaxValue
	}
	h.counts[bucketOf(v)]++
	if h.total == 0 || v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
	h.total++
	h.sum += float64(v)
}

// merge adds o's counts to h.
func (h *histogram) merge(o *histogram) {
	if o.total == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.total == 0 || o.min < h.min {
		h.min = o.min
	}
	if o.max > h.max {
		h.max = o.max
	}
	h.total += o.total
	h.sum += o.sum
}

// count is the number of values recorded.
func (h *histogram) count() uint64 { return h.total }

// mean is the average value, 0 when empty.
func (h *histogram) mean() float64 {
	if h.total == 0 {
		return 0
	}
	return h.sum / float64(h.total)
}

// quantile returns the value at quantile q in [0, 1]: the midpoint of the
// bucket holding the ceil(q*count)-th smallest value, clamped to the
// recorded minimum and maximum. 0 when empty.
func (h *histogram) quantile(q float64) int64 {
	if h.total == 0 {
		return 0
	}
	switch {
	case q <= 0:
		return h.min
	case q >= 1:
		return h.max
	}
	rank := uint64(math.Ceil(q * float64(h.total)))
	if rank < 1 {
		rank = 1
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			lo, hi := bucketRange(i)
			v := lo + (hi-lo)/2
			return min(max(v, h.min), h.max)
		}
	}
	return h.max
}
