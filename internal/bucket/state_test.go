package bucket

import (
	"errors"
	"testing"
	"time"
)

// TestStateRoundTrip moves a used bucket to a clock far from the sender's
// and checks that it answers as it did: no permit is minted by the move.
func TestStateRoundTrip(t *testing.T) {
	const sec = int64(time.Second)
	cases := []struct {
		name string
		cfg  Config
	}{
		{"token bucket", Config{Algorithm: TokenBucket, Limit: 100, Period: 86400 * sec}},
		{"token bucket warm-up", Config{Algorithm: TokenBucket, Limit: 100, Period: 60 * sec, Warmup: 10 * sec}},
		{"leaky bucket", Config{Algorithm: LeakyBucket, Limit: 100, Period: 86400 * sec, Burst: 10}},
		{"fixed window", Config{Algorithm: FixedWindow, Limit: 100, Period: 86400 * sec}},
		{"sliding window", Config{Algorithm: SlidingWindow, Limit: 100, Period: 86400 * sec}},
		{"sliding log", Config{Algorithm: SlidingLog, Limit: 100, Period: 86400 * sec}},
		{"concurrency", Config{Algorithm: Concurrency, Limit: 100, Period: 3600 * sec}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := &tc.cfg
			sender, receiver := int64(5000*sec), int64(123*sec) // two processes' clocks
			b := New(c, sender)
			admitted := int64(0)
			for i := 0; i < 70; i++ {
				if r := b.Acquire(c, sender+int64(i), Request{Permits: 1, LeaseID: uint64(i + 1)}); r.Allowed {
					admitted++
				}
			}
			if admitted == 0 {
				t.Fatal("nothing admitted before the move")
			}
			want := b.Acquire(c, sender+100, Request{}).Remaining
			data, err := MarshalState(c, b, sender+100)
			if err != nil {
				t.Fatal(err)
			}
			got, err := UnmarshalState(c, data, receiver)
			if err != nil {
				t.Fatal(err)
			}
			if r := got.Acquire(c, receiver, Request{}).Remaining; r > want {
				t.Fatalf("remaining after the move %d > before %d", r, want)
			}
			// Take what remains: the total never passes the limit.
			for i := 0; i < 200; i++ {
				if r := got.Acquire(c, receiver+int64(i), Request{Permits: 1, LeaseID: uint64(1000 + i)}); r.Allowed {
					admitted++
				}
			}
			if admitted > c.Capacity() {
				t.Fatalf("admitted %d across the move, capacity %d", admitted, c.Capacity())
			}
		})
	}
}

func TestUnmarshalStateRejects(t *testing.T) {
	tb := &Config{Algorithm: TokenBucket, Limit: 10, Period: int64(time.Second)}
	fw := &Config{Algorithm: FixedWindow, Limit: 10, Period: int64(time.Second)}
	good, err := MarshalState(tb, New(tb, 1), 1)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		cfg  *Config
		data []byte
	}{
		"empty":          {tb, nil},
		"version":        {tb, append([]byte{9}, good[1:]...)},
		"algorithm":      {fw, good},
		"truncated":      {tb, good[:len(good)-1]},
		"trailing bytes": {tb, append(append([]byte{}, good...), 0)},
	} {
		if _, err := UnmarshalState(tc.cfg, tc.data, 1); !errors.Is(err, ErrBadState) {
			t.Errorf("%s: err = %v, want ErrBadState", name, err)
		}
	}
}
