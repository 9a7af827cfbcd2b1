package bucket

import (
	"testing"
	"time"
)

// TestBytes: InitialBytes agrees with Bytes of a new bucket, and Bytes of
// the growing algorithms follows the entries they hold, up to MaxBytes.
func TestBytes(t *testing.T) {
	for _, c := range []Config{
		{Algorithm: TokenBucket, Limit: 10, Period: int64(time.Second)},
		{Algorithm: LeakyBucket, Limit: 10, Period: int64(time.Second)},
		{Algorithm: FixedWindow, Limit: 10, Period: int64(time.Second)},
		{Algorithm: SlidingWindow, Limit: 10, Period: int64(time.Second), SampleCount: 1000},
		{Algorithm: SlidingLog, Limit: 100, Period: int64(time.Second)},
		{Algorithm: Concurrency, Limit: 100, Period: int64(time.Second)},
	} {
		b := New(&c, 0)
		if got, want := InitialBytes(&c), Bytes(b); got != want {
			t.Errorf("%s: InitialBytes %d, Bytes of a new bucket %d", c.Algorithm, got, want)
		}
		for i := int64(1); i <= 100; i++ {
			b.Acquire(&c, i, Request{Permits: 1, LeaseID: uint64(i)})
		}
		if got := Bytes(b); got > MaxBytes(&c) || Grows(c.Algorithm) && got <= InitialBytes(&c) {
			t.Errorf("%s after 100 grants: %d bytes (initial %d, max %d)", c.Algorithm, got, InitialBytes(&c), MaxBytes(&c))
		}
	}
}
