package bucket

import "unsafe"

// Bytes is the heap memory b holds, in bytes: its struct and the backing
// arrays of its slices (by capacity). Token, leaky and fixed-window buckets
// are constant; a sliding window grows with SampleCount, a sliding log and
// a concurrency bucket with the entries they have held at once. It does not
// allocate.
func Bytes(b Bucket) int64 {
	switch b := b.(type) {
	case *tokenBucket:
		return int64(unsafe.Sizeof(*b))
	case *leakyBucket:
		return int64(unsafe.Sizeof(*b))
	case *fixedWindow:
		return int64(unsafe.Sizeof(*b))
	case *slidingWindow:
		return int64(unsafe.Sizeof(*b)) + int64(cap(b.counts))*int64(unsafe.Sizeof(int64(0)))
	case *slidingLog:
		return int64(unsafe.Sizeof(*b)) + int64(cap(b.buf))*int64(unsafe.Sizeof(logEntry{}))
	case *concurrency:
		return int64(unsafe.Sizeof(*b)) + int64(cap(b.leases))*int64(unsafe.Sizeof(lease{}))
	}
	return 0
}

// Grows reports whether a bucket of algorithm a can change its Bytes as it
// is used (sliding log, concurrency), so that callers re-measure only those.
func Grows(a Algorithm) bool { return a == SlidingLog || a == Concurrency }

// MaxBytes is the most heap memory a bucket of c can hold: what a sliding
// log or concurrency bucket reaches with Limit entries.
func MaxBytes(c *Config) int64 {
	switch c.Algorithm {
	case SlidingWindow:
		return int64(unsafe.Sizeof(slidingWindow{})) + c.Samples()*8
	case SlidingLog:
		return int64(unsafe.Sizeof(slidingLog{})) + c.Limit*int64(unsafe.Sizeof(logEntry{}))
	case Concurrency:
		return int64(unsafe.Sizeof(concurrency{})) + c.Limit*int64(unsafe.Sizeof(lease{}))
	}
	if b := New(c, 0); b != nil {
		return Bytes(b)
	}
	return 0
}

// Full reports whether a sliding log or concurrency bucket has no spare
// room for one more entry, so that its next entry allocates; false for the
// other algorithms.
func Full(b Bucket) bool {
	switch b := b.(type) {
	case *slidingLog:
		return b.size == len(b.buf)
	case *concurrency:
		return len(b.leases) == cap(b.leases)
	}
	return false
}

// InitialBytes is Bytes of New(c, now), computed without allocating, so
// that a cap can refuse a new bucket before it exists.
func InitialBytes(c *Config) int64 {
	switch c.Algorithm {
	case TokenBucket:
		return int64(unsafe.Sizeof(tokenBucket{}))
	case LeakyBucket:
		return int64(unsafe.Sizeof(leakyBucket{}))
	case FixedWindow:
		return int64(unsafe.Sizeof(fixedWindow{}))
	case SlidingWindow:
		return int64(unsafe.Sizeof(slidingWindow{})) + c.Samples()*int64(unsafe.Sizeof(int64(0)))
	case SlidingLog:
		return int64(unsafe.Sizeof(slidingLog{}))
	case Concurrency:
		return int64(unsafe.Sizeof(concurrency{}))
	}
	return 0
}
