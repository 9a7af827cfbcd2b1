package bucket

import (
	"errors"
	"testing"
	"time"
)

func TestHit(t *testing.T) {
	sec := int64(time.Second)
	c := &Config{Algorithm: FixedWindow, Limit: 3, Period: sec}
	b := New(c, 10*sec)
	steps := []struct {
		now, n        int64
		before, after int64
		reset         int64
	}{
		{10 * sec, 2, 0, 2, sec},
		{10*sec + sec/2, 2, 2, 4, sec / 2}, // past the limit: still counted
		{10*sec + sec/2, 5, 4, 9, sec / 2},
		{10*sec + sec/2, 0, 9, 9, sec / 2}, // 0 reads
		{10 * sec, 1, 9, 10, sec / 2},      // a clock that jumps back counts as the last
		{11 * sec, 1, 0, 1, sec},           // the boundary forgets the count: no debt
		{13*sec + 1, 0, 0, 0, sec - 1},
	}
	for i, s := range steps {
		r, err := Hit(b, c, s.now, s.n)
		if err != nil {
			t.Fatal(err)
		}
		if r.Before != s.before || r.After != s.after || r.ResetAfter != s.reset {
			t.Fatalf("step %d: %+v, want before %d after %d reset %d", i, r, s.before, s.after, s.reset)
		}
	}
	if !b.Idle(c, 14*sec) {
		t.Fatal("a past window is idle")
	}
	for _, other := range []*Config{
		{Algorithm: TokenBucket, Limit: 3, Period: sec},
		{Algorithm: FixedWindow, Limit: 3, Period: sec, Calendar: CalendarDay},
	} {
		if _, err := Hit(New(other, 0), other, 0, 1); !errors.Is(err, ErrNoHit) {
			t.Fatalf("%v: %v, want ErrNoHit", other.Algorithm, err)
		}
	}
}
