package client

import (
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tokenserver/tokenserver/internal/backoff"
)

// topRand draws the top of every range: full-jitter waits are their bound.
type topRand struct{}

func (topRand) Int64N(n int64) int64 { return n - 1 }

// breakerRig is a breaker alone, with a scripted probe and a recorded
// history, for tests inside a synctest bubble.
type breakerRig struct {
	b        *breaker
	start    time.Time
	mu       sync.Mutex
	probes   []time.Duration // when each probe ran, since start
	answers  []bool          // what the probes answer in turn; then false
	changed  atomic.Int32
	probeMax atomic.Int64 // the cap of the next wait
	stop     chan struct{}
	spawn    atomic.Bool // false: spawn refuses, as a closing client
	wg       sync.WaitGroup
}

func newBreakerRig(threshold int, answers ...bool) *breakerRig {
	r := &breakerRig{start: time.Now(), answers: answers, stop: make(chan struct{})}
	r.probeMax.Store(int64(5 * time.Second))
	r.spawn.Store(true)
	r.b = &breaker{env: breakerEnv{
		threshold: threshold,
		probeWait: backoff.Policy{Base: 50 * time.Millisecond, Max: 5 * time.Second},
		probeMax:  func() time.Duration { return time.Duration(r.probeMax.Load()) },
		probe: func() bool {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.probes = append(r.probes, time.Since(r.start))
			ok := len(r.answers) > 0 && r.answers[0]
			if len(r.answers) > 0 {
				r.answers = r.answers[1:]
			}
			return ok
		},
		changed: func() { r.changed.Add(1) },
		spawn: func(f func()) bool {
			if !r.spawn.Load() {
				return false
			}
			r.wg.Add(1)
			go func() { defer r.wg.Done(); f() }()
			return true
		},
		stop:    r.stop,
		log:     slog.New(slog.DiscardHandler),
		backoff: []backoff.Option{backoff.WithRand(topRand{})},
	}}
	return r
}

// probeTimes returns when the probes ran so far.
func (r *breakerRig) probeTimes() []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Duration(nil), r.probes...)
}

// state is the breaker's state in the words of its doc.
func (r *breakerRig) state() string {
	r.b.mu.Lock()
	defer r.b.mu.Unlock()
	switch {
	case r.b.open.Load():
		return "open"
	case r.b.failing.Load():
		return "failing"
	}
	return "closed"
}

func (r *breakerRig) probing() bool {
	r.b.mu.Lock()
	defer r.b.mu.Unlock()
	return r.b.probing
}

func sameDurations(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// Closed → failing → open after three failures in a row → probed at
// 50, 100, 200ms intervals (half-open) → closed by the probe that finds
// the node ready, which ends the probing.
func TestBreakerOpensProbesAndCloses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newBreakerRig(3, false, false, true)
		steps := []struct {
			do      func()
			state   string
			changed int32
		}{
			{r.b.failure, "failing", 1},
			{r.b.failure, "failing", 1},
			{r.b.failure, "open", 1},
		}
		for i, s := range steps {
			s.do()
			if got := r.state(); got != s.state || r.changed.Load() != s.changed {
				t.Fatalf("after failure %d: %s (changed %d), want %s (changed %d)", i+1, got, r.changed.Load(), s.state, s.changed)
			}
		}
		if !r.probing() {
			t.Fatal("no probe after the first failure")
		}
		time.Sleep(349 * time.Millisecond)
		synctest.Wait()
		if got := r.state(); got != "open" || len(r.probeTimes()) != 2 {
			t.Fatalf("at 349ms: %s after probes %v; want open after two", got, r.probeTimes())
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		want := []time.Duration{50 * time.Millisecond, 150 * time.Millisecond, 350 * time.Millisecond}
		if got := r.probeTimes(); !sameDurations(got, want) {
			t.Errorf("probes at %v, want %v", got, want)
		}
		if got := r.state(); got != "closed" || r.changed.Load() != 2 || r.probing() {
			t.Errorf("after the ready probe: %s, changed %d, probing %v; want closed, 2, false", got, r.changed.Load(), r.probing())
		}
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if n := len(r.probeTimes()); n != 3 {
			t.Errorf("%d probes after the breaker closed, want none", n-3)
		}
		r.wg.Wait()
	})
}

// Failures count only in a row: a success in between starts over.
func TestBreakerCountsFailuresInARow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newBreakerRig(3)
		for _, step := range []struct {
			ok    bool
			state string
		}{
			{false, "failing"}, {false, "failing"}, {true, "closed"},
			{false, "failing"}, {false, "failing"}, {false, "open"},
			{true, "closed"},
		} {
			if step.ok {
				r.b.success()
			} else {
				r.b.failure()
			}
			if got := r.state(); got != step.state {
				t.Fatalf("after %v: %s, want %s", step.ok, got, step.state)
			}
		}
		if r.changed.Load() != 4 {
			t.Errorf("failing changed %d times, want 4", r.changed.Load())
		}
		close(r.stop)
		synctest.Wait()
		r.wg.Wait()
	})
}

// A call that succeeds while the node is probed closes the breaker; the
// probe ends when its wait is over, without probing again.
func TestBreakerClosedByACallEndsTheProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newBreakerRig(1)
		r.b.failure()
		time.Sleep(60 * time.Millisecond) // the first probe (50ms) fails
		synctest.Wait()
		r.b.success()
		if r.state() != "closed" || !r.probing() {
			t.Fatalf("after a success: %s, probing %v", r.state(), r.probing())
		}
		time.Sleep(140 * time.Millisecond) // the second wait (100ms) is over
		synctest.Wait()
		if r.probing() {
			t.Error("still probing a closed breaker")
		}
		if got := r.probeTimes(); len(got) != 2 {
			t.Errorf("probes at %v, want 2 (the one in flight when the call succeeded ends the loop)", got)
		}
		r.wg.Wait()
	})
}

// The probe waits grow to probeWait.Max, but each is drawn below the cap
// of its moment (lower while the node is a member), and the bound keeps
// growing underneath.
func TestBreakerProbeBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newBreakerRig(1)
		r.probeMax.Store(int64(120 * time.Millisecond)) // a member of the view
		r.b.failure()
		for i, want := range []time.Duration{50, 100, 120, 120} {
			time.Sleep(want * time.Millisecond)
			synctest.Wait()
			if n := len(r.probeTimes()); n != i+1 {
				t.Fatalf("wait %d: %d probes after %vms, want %d", i, n, want, i+1)
			}
		}
		// The node leaves the view. The wait drawn after the probe at
		// 390ms still had the member's cap; the later ones grow again.
		r.probeMax.Store(int64(5 * time.Second))
		time.Sleep((15310 - 390) * time.Millisecond)
		synctest.Wait()
		want := []time.Duration{50, 150, 270, 390, 510, 2110, 5310, 10310, 15310}
		for i := range want {
			want[i] *= time.Millisecond
		}
		if got := r.probeTimes(); !sameDurations(got, want) {
			t.Errorf("probes at %v, want %v", got, want)
		}
		close(r.stop)
		synctest.Wait()
		if r.probing() {
			t.Error("probing after the node stopped")
		}
		r.wg.Wait()
	})
}

// A node that stops ends its probe at once; a closing client starts none,
// and a later failure tries again.
func TestBreakerProbeStops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newBreakerRig(1)
		r.spawn.Store(false)
		r.b.failure()
		if r.probing() || r.state() != "open" {
			t.Fatalf("closing client: probing %v, %s", r.probing(), r.state())
		}
		r.spawn.Store(true)
		r.b.failure()
		if !r.probing() {
			t.Fatal("no probe after a failure once spawning works")
		}
		time.Sleep(10 * time.Millisecond)
		close(r.stop)
		synctest.Wait()
		if r.probing() || len(r.probeTimes()) != 0 {
			t.Errorf("after stop: probing %v, probes %v", r.probing(), r.probeTimes())
		}
		r.wg.Wait()
	})
}
