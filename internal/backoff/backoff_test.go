package backoff

import (
	"context"
	"math/rand/v2"
	"testing"
	"testing/synctest"
	"time"
)

// script is a Rand that returns its values in turn, each clamped to [0, n).
type script struct {
	vals []int64
	ns   []int64 // the n of every call
}

func (s *script) Int64N(n int64) int64 {
	s.ns = append(s.ns, n)
	v := s.vals[0]
	if len(s.vals) > 1 {
		s.vals = s.vals[1:]
	}
	return min(max(v, 0), n-1)
}

const top = int64(1) << 62 // a script value that draws the top of the range

func TestBound(t *testing.T) {
	for _, tc := range []struct {
		base, max time.Duration
		attempt   int
		want      time.Duration
	}{
		{50 * time.Millisecond, 5 * time.Second, 0, 50 * time.Millisecond},
		{50 * time.Millisecond, 5 * time.Second, 1, 100 * time.Millisecond},
		{50 * time.Millisecond, 5 * time.Second, 6, 3200 * time.Millisecond},
		{50 * time.Millisecond, 5 * time.Second, 7, 5 * time.Second},
		{50 * time.Millisecond, 5 * time.Second, 200, 5 * time.Second},
		{time.Millisecond, 4 * time.Millisecond, 2, 4 * time.Millisecond}, // exactly the cap
		{1, time.Duration(1<<63 - 1), 62, time.Duration(1<<63 - 1)},       // no overflow
		{3, 5, -1, 3},
	} {
		if got := Bound(tc.base, tc.max, tc.attempt); got != tc.want {
			t.Errorf("Bound(%v, %v, %d) = %v, want %v", tc.base, tc.max, tc.attempt, got, tc.want)
		}
	}
}

// Each step draws one wait: the range the source is asked for, and the wait
// for the value it answers.
func TestNext(t *testing.T) {
	type step struct {
		maxD  time.Duration // 0: the policy's
		val   int64         // what the source answers
		wantN int64         // the n it is asked for
		want  time.Duration
	}
	ms := time.Millisecond
	for _, tc := range []struct {
		name  string
		p     Policy
		steps []step
	}{
		{"full grows then caps", Policy{Base: 10 * ms, Max: 50 * ms}, []step{
			{0, 0, int64(10 * ms), 1},
			{0, top, int64(20 * ms), 20 * ms},
			{0, top, int64(40 * ms), 40 * ms},
			{0, top, int64(50 * ms), 50 * ms},
			{0, 7, int64(50 * ms), 8},
		}},
		{"full with a lower cap for one wait", Policy{Base: 10 * ms, Max: 5 * time.Second}, []step{
			{0, top, int64(10 * ms), 10 * ms},
			{15 * ms, top, int64(15 * ms), 15 * ms},
			{0, top, int64(40 * ms), 40 * ms}, // the bound kept growing
			{time.Hour, top, int64(80 * ms), 80 * ms},
		}},
		{"decorrelated", Policy{Base: 10 * ms, Max: 100 * ms, Jitter: Decorrelated}, []step{
			{0, top, int64(20*ms) + 1, 30 * ms},  // [10ms, 3·10ms]
			{0, top, int64(80*ms) + 1, 90 * ms},  // [10ms, 3·30ms]
			{0, top, int64(90*ms) + 1, 100 * ms}, // [10ms, cap]
			{0, 0, int64(90*ms) + 1, 10 * ms},    // back to the base
			{0, top, int64(20*ms) + 1, 30 * ms},  // and growing from it
		}},
		{"decorrelated with a lower cap", Policy{Base: 10 * ms, Max: time.Second, Jitter: Decorrelated}, []step{
			{20 * ms, top, int64(10*ms) + 1, 20 * ms},
			{5 * ms, top, 1, 5 * ms}, // the cap below the base wins
		}},
		{"bad policy", Policy{}, []step{
			{0, top, 1, 1},
			{0, top, 1, 1},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i, s := range tc.steps {
				r := &script{vals: []int64{s.val}}
				b := New(tc.p, WithRand(r))
				// Replay the earlier steps to reach this one's state.
				for _, e := range tc.steps[:i] {
					r.vals = []int64{e.val}
					b.NextMax(or(e.maxD, tc.p.Max))
				}
				r.vals, r.ns = []int64{s.val}, nil
				got := b.NextMax(or(s.maxD, tc.p.Max))
				if got != s.want || len(r.ns) != 1 || r.ns[0] != s.wantN {
					t.Errorf("step %d: wait %v from n=%v, want %v from n=%d", i, got, r.ns, s.want, s.wantN)
				}
				if b.Attempt() != i+1 {
					t.Errorf("step %d: attempt %d", i, b.Attempt())
				}
			}
		})
	}
}

func or(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// Reset starts over from the base.
func TestReset(t *testing.T) {
	r := &script{vals: []int64{top}}
	b := New(Policy{Base: time.Millisecond, Max: time.Second}, WithRand(r))
	for range 5 {
		b.Next()
	}
	b.Reset()
	if d := b.Next(); d != time.Millisecond || b.Attempt() != 1 {
		t.Fatalf("after Reset: %v, attempt %d", d, b.Attempt())
	}
}

// Whatever the source, every wait is in (0, Max], and the first full-jitter
// one at most Base (moved here from the client's own full-jitter test).
func TestWaitsStayInRange(t *testing.T) {
	for _, j := range []Jitter{Full, Decorrelated} {
		b := New(Policy{Base: 50 * time.Millisecond, Max: 5 * time.Second, Jitter: j}, WithRand(rand.New(rand.NewPCG(1, 2))))
		for attempt := 0; attempt < 200; attempt++ {
			d := b.Next()
			if d <= 0 || d > 5*time.Second || (j == Full && attempt == 0 && d > 50*time.Millisecond) {
				t.Fatalf("%v attempt %d: %v", j, attempt, d)
			}
		}
	}
}

// fakeClock records the waits asked of it and fires at once.
type fakeClock struct{ waits []time.Duration }

func (c *fakeClock) After(d time.Duration) (<-chan time.Time, func() bool) {
	c.waits = append(c.waits, d)
	ch := make(chan time.Time, 1)
	ch <- time.Time{}
	return ch, func() bool { return false }
}

func TestAfterUsesTheClock(t *testing.T) {
	clk := &fakeClock{}
	b := New(Policy{Base: time.Second, Max: time.Minute}, WithClock(clk), WithRand(&script{vals: []int64{top}}))
	for range 3 {
		c, _ := b.After()
		<-c
	}
	want := []time.Duration{time.Second, 2 * time.Second, 4 * time.Second}
	if len(clk.waits) != 3 || clk.waits[0] != want[0] || clk.waits[1] != want[1] || clk.waits[2] != want[2] {
		t.Fatalf("waits %v, want %v", clk.waits, want)
	}
}

// Sleep waits the drawn time, gives up at once when the deadline leaves no
// room, and stops when ctx ends.
func TestSleep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := New(Policy{Base: 10 * time.Millisecond, Max: time.Second}, WithRand(&script{vals: []int64{top}}))
		start := time.Now()
		if !b.Sleep(context.Background(), 0) || time.Since(start) != 10*time.Millisecond {
			t.Fatalf("slept %v", time.Since(start))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		start = time.Now()
		if b.Sleep(ctx, time.Millisecond) || time.Since(start) != 0 {
			t.Fatalf("20ms wait with 20ms left: slept %v", time.Since(start))
		}
		ctx2, cancel2 := context.WithCancel(context.Background())
		time.AfterFunc(15*time.Millisecond, cancel2)
		start = time.Now()
		if b.Sleep(ctx2, 0) || time.Since(start) != 15*time.Millisecond {
			t.Fatalf("canceled after 15ms: slept %v", time.Since(start))
		}
		if d := b.Attempt(); d != 3 {
			t.Fatalf("attempt %d", d)
		}
	})
}

func TestJitterString(t *testing.T) {
	for j, want := range map[Jitter]string{Full: "full", Decorrelated: "decorrelated", 9: "unknown"} {
		if j.String() != want {
			t.Errorf("%d: %q", j, j.String())
		}
	}
}
