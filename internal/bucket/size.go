package bucket

import "unsafe"

// Bytes is the heap memory b holds, in bytes: its struct and the backing
// arrays of its slices (by capacity), each rounded up to the Go allocator's
// size class (AllocBytes). Token, leaky and fixed-window buckets
// are constant; a sliding window grows with SampleCount, a sliding log and
// a concurrency bucket with the entries they have held at once. It does not
// allocate.
func Bytes(b Bucket) int64 {
	switch b := b.(type) {
	case *tokenBucket:
		return AllocBytes(int64(unsafe.Sizeof(*b)))
	case *leakyBucket:
		return AllocBytes(int64(unsafe.Sizeof(*b)))
	case *fixedWindow:
		return AllocBytes(int64(unsafe.Sizeof(*b)))
	case *slidingWindow:
		return AllocBytes(int64(unsafe.Sizeof(*b))) + AllocBytes(int64(cap(b.counts))*int64(unsafe.Sizeof(int64(0))))
	case *slidingLog:
		return AllocBytes(int64(unsafe.Sizeof(*b))) + AllocBytes(int64(cap(b.buf))*int64(unsafe.Sizeof(logEntry{})))
	case *concurrency:
		return AllocBytes(int64(unsafe.Sizeof(*b))) + AllocBytes(int64(cap(b.leases))*int64(unsafe.Sizeof(lease{})))
	}
	return 0
}

// sizeClasses are the Go allocator's small object sizes (runtime
// sizeclasses.go, Go 1.21 to 1.25).
var sizeClasses = [...]int64{8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256, 288, 320, 352, 384, 416, 448, 480, 512, 576, 640, 704, 768, 896, 1024, 1152, 1280, 1408, 1536, 1792, 2048, 2304, 2688, 3072, 3200, 3456, 4096, 4864, 5376, 6144, 6528, 6784, 6912, 8192, 9472, 9728, 10240, 10880, 12288, 13568, 14336, 16384, 18432, 19072, 20480, 21760, 24576, 27264, 28672, 32768}

// AllocBytes is what an allocation of n bytes takes on the Go heap: n
// rounded up to its size class, or to whole 8 KiB pages above 32 KiB; 0
// for 0.
func AllocBytes(n int64) int64 {
	if n <= 0 {
		return 0
	}
	if n > sizeClasses[len(sizeClasses)-1] {
		return (n + 8191) &^ 8191
	}
	lo, hi := 0, len(sizeClasses)-1
	for lo < hi {
		mid := (lo + hi) / 2
		if sizeClasses[mid] < n {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return sizeClasses[lo]
}

// Grows reports whether a bucket of algorithm a can change its Bytes as it
// is used (sliding log, concurrency), so that callers re-measure only those.
func Grows(a Algorithm) bool { return a == SlidingLog || a == Concurrency }

// MaxBytes is the most heap memory a bucket of c can hold: what a sliding
// log or concurrency bucket reaches with Limit entries.
func MaxBytes(c *Config) int64 {
	switch c.Algorithm {
	case SlidingWindow:
		return AllocBytes(int64(unsafe.Sizeof(slidingWindow{}))) + AllocBytes(c.Samples()*8)
	case SlidingLog:
		return AllocBytes(int64(unsafe.Sizeof(slidingLog{}))) + AllocBytes(c.Limit*int64(unsafe.Sizeof(logEntry{})))
	case Concurrency:
		return AllocBytes(int64(unsafe.Sizeof(concurrency{}))) + AllocBytes(c.Limit*int64(unsafe.Sizeof(lease{})))
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
		return AllocBytes(int64(unsafe.Sizeof(tokenBucket{})))
	case LeakyBucket:
		return AllocBytes(int64(unsafe.Sizeof(leakyBucket{})))
	case FixedWindow:
		return AllocBytes(int64(unsafe.Sizeof(fixedWindow{})))
	case SlidingWindow:
		return AllocBytes(int64(unsafe.Sizeof(slidingWindow{}))) + AllocBytes(c.Samples()*int64(unsafe.Sizeof(int64(0))))
	case SlidingLog:
		return AllocBytes(int64(unsafe.Sizeof(slidingLog{})))
	case Concurrency:
		return AllocBytes(int64(unsafe.Sizeof(concurrency{})))
	}
	return 0
}
