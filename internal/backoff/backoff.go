// Package backoff computes the waits of retry and probe loops: exponential
// growth capped at a maximum, with full or decorrelated jitter, on an
// injectable clock and source of randomness.
//
// It is hand-written (about a hundred lines) because the loops it serves
// need a cap that may change from one attempt to the next (a node the
// cluster calls live is probed sooner), waits on a clock that tests
// replace, and full or decorrelated jitter; grpc-go's own backoff is
// internal to it, and cenkalti/backoff's ExponentialBackOff draws a
// proportional jitter around the interval instead.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Jitter is how a delay is drawn below its exponential bound.
type Jitter uint8

// The jitters (Marc Brooker, "Exponential Backoff And Jitter", 2015).
const (
	// Full draws uniformly in (0, min(Max, Base·2^attempt)]: the default,
	// the best at spreading clients that failed together.
	Full Jitter = iota
	// Decorrelated draws uniformly in [Base, min(Max, 3·previous)], where
	// previous starts at Base: each wait grows from the last one drawn
	// rather than from the attempt count.
	Decorrelated
)

// String names the jitter.
func (j Jitter) String() string {
	switch j {
	case Full:
		return "full"
	case Decorrelated:
		return "decorrelated"
	}
	return "unknown"
}

// Policy is the shape of the waits. Base and Max are above 0 and Base is at
// most Max; a Policy that breaks this is used as if Base were at least 1ns
// and Max at least Base.
type Policy struct {
	// Base is the bound of the first wait.
	Base time.Duration
	// Max is the longest wait.
	Max time.Duration
	// Jitter is how a wait is drawn; the zero value is Full.
	Jitter Jitter
}

// Rand is a source of uniform random integers in [0, n), n > 0.
// *math/rand/v2.Rand satisfies it; the default is math/rand/v2's top-level
// generator, safe for simultaneous use.
type Rand interface {
	Int64N(n int64) int64
}

// Clock makes the timers a Backoff waits on. The default is the system
// clock (time.NewTimer).
type Clock interface {
	// After returns a channel that receives once d has passed, and a
	// function that stops the timer early.
	After(d time.Duration) (<-chan time.Time, func() bool)
}

type systemClock struct{}

func (systemClock) After(d time.Duration) (<-chan time.Time, func() bool) {
	t := time.NewTimer(d)
	return t.C, t.Stop
}

type globalRand struct{}

func (globalRand) Int64N(n int64) int64 { return rand.Int64N(n) }

// Option configures a Backoff.
type Option func(*Backoff)

// WithRand draws the jitter from r (tests pass a seeded or scripted one).
func WithRand(r Rand) Option { return func(b *Backoff) { b.rnd = r } }

// WithClock waits on c instead of the system clock.
func WithClock(c Clock) Option { return func(b *Backoff) { b.clock = c } }

// Backoff is the state of one retry loop: the attempt count and, for
// decorrelated jitter, the previous wait. Next draws the next wait; Reset
// starts over after a success. The zero value is not usable: call New. A
// Backoff is owned by one loop and is not safe for simultaneous use.
type Backoff struct {
	p       Policy
	rnd     Rand
	clock   Clock
	attempt int
	prev    time.Duration
}

// New returns the Backoff of a loop that waits by p.
func New(p Policy, opts ...Option) *Backoff {
	p.Base = max(p.Base, 1)
	p.Max = max(p.Max, p.Base)
	b := &Backoff{p: p, rnd: globalRand{}, clock: systemClock{}}
	for _, o := range opts {
		o(b)
	}
	return b
}

// Attempt is how many waits were drawn since New or Reset.
func (b *Backoff) Attempt() int { return b.attempt }

// Reset starts the waits over, from Base.
func (b *Backoff) Reset() { b.attempt, b.prev = 0, 0 }

// Next draws the next wait and counts the attempt.
func (b *Backoff) Next() time.Duration { return b.NextMax(b.p.Max) }

// NextMax is Next with the cap lowered to maxD (if below the policy's Max)
// for this one wait: the bound still grows with the attempts, but the draw
// is below maxD.
func (b *Backoff) NextMax(maxD time.Duration) time.Duration {
	maxD = max(min(maxD, b.p.Max), 1)
	var d time.Duration
	switch b.p.Jitter {
	case Decorrelated:
		lo := min(b.p.Base, maxD)
		prev := b.prev
		if prev == 0 {
			prev = b.p.Base
		}
		hi := maxD
		if prev < maxD/3 {
			hi = max(3*prev, lo)
		}
		d = lo + time.Duration(b.rnd.Int64N(int64(hi-lo)+1))
	default:
		d = time.Duration(b.rnd.Int64N(int64(Bound(b.p.Base, maxD, b.attempt))) + 1)
	}
	b.attempt++
	b.prev = d
	return d
}

// Bound is min(maxD, base·2^attempt), without overflow: the exponential
// bound under which full jitter draws.
func Bound(base, maxD time.Duration, attempt int) time.Duration {
	if attempt < 0 {
		attempt = 0
	}
	if attempt < 62 && base <= maxD>>attempt {
		return base << attempt
	}
	return maxD
}

// After draws the next wait and starts a timer for it on the Backoff's
// clock: the channel receives when the wait is over; the function stops
// the timer early.
func (b *Backoff) After() (<-chan time.Time, func() bool) {
	return b.clock.After(b.Next())
}

// AfterMax is After with the wait drawn by NextMax(maxD).
func (b *Backoff) AfterMax(maxD time.Duration) (<-chan time.Time, func() bool) {
	return b.clock.After(b.NextMax(maxD))
}

// Sleep draws the next wait and waits it. It returns false at once, without
// waiting, when ctx's deadline would leave less than margin after the wait,
// and false when ctx ends during it.
func (b *Backoff) Sleep(ctx context.Context, margin time.Duration) bool {
	return b.SleepMax(ctx, b.p.Max, margin)
}

// SleepMax is Sleep with the wait drawn by NextMax(maxD).
func (b *Backoff) SleepMax(ctx context.Context, maxD, margin time.Duration) bool {
	d := b.NextMax(maxD)
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d+margin {
		return false
	}
	c, stop := b.clock.After(d)
	select {
	case <-ctx.Done():
		stop()
		return false
	case <-c:
		return true
	}
}
