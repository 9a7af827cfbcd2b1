// Package bucket implements tokenserver's six rate-limiting algorithms as pure
// value types whose every operation takes the current time as an argument.
//
// A bucket is the state of one (rule, key) pair. It holds no configuration
// and no lock: every method takes the *Config it is judged against and `now`,
// int64 monotonic nanoseconds chosen by the caller. A `now` earlier than the
// latest one a bucket has seen counts as that latest one, so a clock that
// jumps backwards never mints tokens. Buckets start no goroutines and use
// constant memory, except SlidingLog and Concurrency, whose memory is
// O(Config.Limit) (their limits are capped, see MaxLogLimit and
// MaxConcurrencyLimit). Callers serialize access (internal/shard holds a mutex
// per shard).
//
// The algorithms are written here rather than taken from a library because
// none offers explicit time, refill of a named grant, reservation, warm-up
// and a check for "back at the initial state" (for eviction) together;
// golang.org/x/time/rate, which the client SDK uses for local fallback, has
// only the token bucket.
//
// # Reserve, commit and debt
//
// An Acquire reserves an estimate; Commit settles the grant at what was
// really used, and Debit charges usage that had no reservation (Envoy's
// hits_addend on the response path). Used below the reservation gives the
// difference back exactly as Refill does (clamped, and nothing once the
// grant's window has passed); used above it charges the extra even past
// what the bucket holds, and what is charged beyond it is debt, repaid by
// the algorithm's own refill before anything else is granted:
//
//   - TokenBucket: the balance goes below zero and refills at Limit/Period,
//     so debt d is repaid in d*Period/Limit. With warm-up the overrun pushes
//     the next free ticket as an acquire of that size would.
//   - LeakyBucket: the overrun's slots are queued, pushing next out by
//     overrun*Period/Limit.
//   - FixedWindow: the count may pass Limit; what a window holds above Limit
//     is carried into the next window, and so on, so each window boundary
//     repays Limit.
//   - SlidingWindow: the overrun fills the window up to Limit and the rest is
//     debt; each sub-window that leaves the count is charged again, up to the
//     debt, in the new one, so capacity that frees up repays the debt first
//     (Limit per Period).
//   - SlidingLog and Concurrency refuse with ErrNoCommit: a log holds at
//     most Limit entries and a lease has no cost.
//
// Debt survives eviction (Idle is false while anything is owed) and
// Reconfigure, with two exceptions: a leaky bucket's queue, debt included,
// is cut to one full request of the new configuration, and turning a token
// bucket's warm-up on or off restarts it, as they always did.
//
// While a key owes, every plain acquire is denied; a shaping request
// (MaxWait, token and leaky buckets) is granted only behind the debt, with
// WaitBefore covering its repayment, as Guava's reservations queue.
// A reservation that is never committed stays charged at its estimate:
// nothing is given back unless Commit or Refill says so.
//
// Over-admission bound: over any window of the algorithm (any interval T for
// a token bucket, where Burst + T*Limit/Period is the bound without debt; a
// fixed window; any (K-1)/K*Period interval of a sliding window), what is
// charged is at most the bound without debt plus the debt outstanding at
// the end of the window, which is at most the sum of the overruns of the
// reservations that were in flight together: with one reservation in flight
// per key, the limit plus the largest single overrun. Debits count as
// reservations of zero. TestCommitBound checks both forms.
//
// # Calendar windows
//
// A FixedWindow with Config.Calendar counts per local calendar day, ISO week
// (Monday to Sunday) or month in Config.Location, so it needs wall time:
// for such a bucket `now` is read as nanoseconds since the Unix epoch. The
// caller keeps one clock and makes its origin the Unix epoch (for example
// start.UnixNano() + time.Since(start)): that clock is still monotonic, and
// it is wall time as of the process start; a later step of the wall clock
// moves calendar boundaries by the step until the process restarts, and a
// clock that jumps backwards counts as the latest time seen, as everywhere.
// A window runs from the first instant of its first local day to the first
// instant of the next window's, so a day lasts 23 or 25 hours across DST and
// a midnight that DST skips starts the day at the transition. The zone
// arithmetic is the standard library's (time.Date, Time.In); the binary
// must carry the zone database (import time/tzdata in package main) where
// the host may lack one.
package bucket

import (
	"errors"
	"fmt"
	"time"
)

// Algorithm names how a bucket counts.
type Algorithm uint8

// The algorithms. Their numbers match tokenserver.v1.Algorithm.
const (
	// Unspecified is the zero Algorithm; it is never valid.
	Unspecified Algorithm = iota
	// TokenBucket bursts up to Burst and refills continuously at Limit per
	// Period; with MaxWait it reserves future tokens (Guava's acquire); with
	// Warmup a cold key starts at a third of the rate (Sentinel's
	// WarmUpController, Guava's SmoothWarmingUp with cold factor 3).
	TokenBucket
	// LeakyBucket lets permits through at a constant rate of one every
	// Period/Limit, without bursts; with MaxWait it reserves the earliest free
	// slot and answers how long to wait (shaping).
	LeakyBucket
	// FixedWindow counts permits per Period-aligned window; up to 2x Limit can
	// pass in one Period across a window boundary.
	FixedWindow
	// SlidingWindow counts per SampleCount sub-windows of Period/SampleCount
	// and admits while the last SampleCount sub-windows hold under Limit
	// (Sentinel's LeapArray).
	SlidingWindow
	// SlidingLog logs every admitted permit: never more than Limit admitted in
	// any window of length Period.
	SlidingLog
	// Concurrency counts leases in flight: at most Limit at once, each living
	// Period unless renewed.
	Concurrency
)

// Caps on the algorithms whose memory grows with the limit.
const (
	// MaxLogLimit is the largest Limit of a SlidingLog bucket.
	MaxLogLimit = 10_000
	// MaxConcurrencyLimit is the largest Limit of a Concurrency bucket.
	MaxConcurrencyLimit = 10_000
	// MaxSampleCount is the largest SlidingWindow SampleCount.
	MaxSampleCount = 1_000
	// DefaultSampleCount is the SlidingWindow SampleCount when none is given.
	DefaultSampleCount = 10
	// ColdFactor is the warm-up cold factor: a cold key is admitted at
	// 1/ColdFactor of the rate.
	ColdFactor = 3
	// MaxLimit is the largest Limit and Burst: 2^53, the largest integer
	// float64 token arithmetic holds exactly.
	MaxLimit = 1 << 53
	// MaxDuration is the longest Period and Warmup (and the longest
	// duration internal/rule accepts anywhere): 10 years, so that now plus
	// any duration stays far from the int64 bounds.
	MaxDuration = 10 * 365 * 24 * int64(time.Hour)
	// MaxConcurrencyPeriod is the longest Concurrency Period, the lifetime
	// of a lease that is not renewed: one day.
	MaxConcurrencyPeriod = 24 * int64(time.Hour)
)

// OffersPartial reports whether algorithm a can grant part of a request
// (Request.Partial): token bucket, fixed window and sliding window.
func OffersPartial(a Algorithm) bool {
	return a == TokenBucket || a == FixedWindow || a == SlidingWindow
}

var algorithmNames = [...]string{"unspecified", "token-bucket", "leaky-bucket", "fixed-window", "sliding-window", "sliding-log", "concurrency"}

// String returns the algorithm's name as tokenctl spells it (token-bucket).
func (a Algorithm) String() string {
	if int(a) < len(algorithmNames) {
		return algorithmNames[a]
	}
	return fmt.Sprintf("algorithm(%d)", uint8(a))
}

// ParseAlgorithm reads a name as String returns it.
func ParseAlgorithm(s string) (Algorithm, error) {
	for i, n := range algorithmNames {
		if i > 0 && n == s {
			return Algorithm(i), nil
		}
	}
	return Unspecified, fmt.Errorf("unknown algorithm %q (want token-bucket, leaky-bucket, fixed-window, sliding-window, sliding-log or concurrency)", s)
}

// Config is the limit a bucket enforces. Build it once per rule (and per
// override) and pass the same pointer to every call; call Validate first:
// the methods of Bucket assume a valid Config.
type Config struct {
	// Algorithm is how the bucket counts.
	Algorithm Algorithm
	// Limit is the number of permits per Period; for Concurrency the number
	// of leases held at once.
	Limit int64
	// Period is in nanoseconds; for Concurrency the lifetime of a lease.
	Period int64
	// Burst is the capacity: the largest burst of a TokenBucket and the most
	// permits one LeakyBucket request may take. 0 means Limit. Ignored by the
	// other algorithms, whose capacity is Limit.
	Burst int64
	// SampleCount is the number of SlidingWindow sub-windows per Period; it
	// must divide Period. 0 means DefaultSampleCount.
	SampleCount int64
	// Warmup, in nanoseconds, turns on TokenBucket warm-up. 0 means none.
	Warmup int64
	// Calendar, for FixedWindow only, aligns windows to local calendar days,
	// ISO weeks or months in Location instead of Period, which is then
	// ignored (it may be 0); `now` is then Unix nanoseconds (see the
	// package doc). CalendarNone means Period windows.
	Calendar Calendar
	// Location is the time zone of Calendar windows; nil means UTC. It must
	// be nil without Calendar.
	Location *time.Location
}

// Span is the longest one window of c can last: Period, or for calendar
// windows an upper bound on a local day, week or month (DST and zone
// changes included). A grant can be given back or committed within Span of
// being made, at most.
func (c *Config) Span() int64 {
	const day = 24 * int64(time.Hour)
	switch c.Calendar {
	case CalendarDay:
		return 2 * day
	case CalendarWeek:
		return 8 * day
	case CalendarMonth:
		return 32 * day
	}
	return c.Period
}

// Capacity is the most permits one request can ever be granted: Burst (or
// Limit) for the buckets, Limit for windows, logs and concurrency.
func (c *Config) Capacity() int64 {
	if (c.Algorithm == TokenBucket || c.Algorithm == LeakyBucket) && c.Burst > 0 {
		return c.Burst
	}
	return c.Limit
}

// Samples is SampleCount with its default applied.
func (c *Config) Samples() int64 {
	if c.SampleCount > 0 {
		return c.SampleCount
	}
	return DefaultSampleCount
}

// Validate reports the first problem with c, naming the field: a
// *FieldError.
func (c *Config) Validate() error {
	switch {
	case c.Algorithm == Unspecified || c.Algorithm > Concurrency:
		return &FieldError{Field: "algorithm", Err: fmt.Errorf("algorithm: %w", ErrUnknownAlgorithm)}
	case c.Limit <= 0:
		return &FieldError{Field: "limit", Err: fmt.Errorf("limit must be > 0, got %d", c.Limit)}
	case c.Limit > MaxLimit:
		return &FieldError{Field: "limit", Err: fmt.Errorf("limit %d is above the largest supported limit %d (2^53)", c.Limit, int64(MaxLimit))}
	case c.Calendar > CalendarMonth:
		return &FieldError{Field: "calendar", Err: fmt.Errorf("calendar: unknown calendar %d", c.Calendar)}
	case c.Calendar != CalendarNone && c.Algorithm != FixedWindow:
		return &FieldError{Field: "calendar", Err: fmt.Errorf("calendar applies to fixed-window only, not %s", c.Algorithm)}
	case c.Calendar == CalendarNone && c.Location != nil:
		return &FieldError{Field: "time_zone", Err: fmt.Errorf("time zone %q applies to calendar windows only", c.Location)}
	case c.Calendar != CalendarNone && c.Period < 0:
		return &FieldError{Field: "period", Err: fmt.Errorf("period must be >= 0 with a calendar (it is ignored), got %v", time.Duration(c.Period))}
	case c.Calendar == CalendarNone && c.Period <= 0:
		return &FieldError{Field: "period", Err: fmt.Errorf("period must be > 0, got %v", time.Duration(c.Period))}
	case c.Period > MaxDuration:
		return &FieldError{Field: "period", Err: fmt.Errorf("period %v is above the longest supported duration %v (10 years)", time.Duration(c.Period), time.Duration(MaxDuration))}
	case c.Algorithm == Concurrency && c.Period > MaxConcurrencyPeriod:
		return &FieldError{Field: "period", Err: fmt.Errorf("period %v is above the longest concurrency lease %v; renew leases instead", time.Duration(c.Period), time.Duration(MaxConcurrencyPeriod))}
	case c.Burst < 0:
		return &FieldError{Field: "burst", Err: fmt.Errorf("burst must be >= 0, got %d", c.Burst)}
	case c.Burst > MaxLimit:
		return &FieldError{Field: "burst", Err: fmt.Errorf("burst %d is above the largest supported burst %d (2^53)", c.Burst, int64(MaxLimit))}
	case c.Warmup > MaxDuration:
		return &FieldError{Field: "warmup", Err: fmt.Errorf("warmup %v is above the longest supported duration %v (10 years)", time.Duration(c.Warmup), time.Duration(MaxDuration))}
	case c.SampleCount < 0 || c.SampleCount > MaxSampleCount:
		return &FieldError{Field: "sample_count", Err: fmt.Errorf("sample_count must be between 1 and %d, got %d", MaxSampleCount, c.SampleCount)}
	case c.Warmup < 0:
		return &FieldError{Field: "warmup", Err: fmt.Errorf("warmup must be >= 0, got %v", time.Duration(c.Warmup))}
	case c.Warmup > 0 && c.Algorithm != TokenBucket:
		return &FieldError{Field: "warmup", Err: fmt.Errorf("warmup applies to token-bucket only, not %s", c.Algorithm)}
	case c.Algorithm == SlidingWindow && c.Period%c.Samples() != 0:
		return &FieldError{Field: "sample_count", Err: fmt.Errorf("sample_count %d must divide the period %v", c.Samples(), time.Duration(c.Period))}
	case c.Algorithm == SlidingWindow && c.Period/c.Samples() < int64(time.Microsecond):
		return &FieldError{Field: "sample_count", Err: fmt.Errorf("period %v / sample_count %d is under 1µs", time.Duration(c.Period), c.Samples())}
	case c.Algorithm == SlidingLog && c.Limit > MaxLogLimit:
		return &FieldError{Field: "limit", Err: fmt.Errorf("limit %d is above the sliding-log cap of %d", c.Limit, MaxLogLimit)}
	case c.Algorithm == Concurrency && c.Limit > MaxConcurrencyLimit:
		return &FieldError{Field: "limit", Err: fmt.Errorf("limit %d is above the concurrency cap of %d", c.Limit, MaxConcurrencyLimit)}
	case c.Algorithm == LeakyBucket && c.Period/c.Limit < 1:
		return &FieldError{Field: "limit", Err: fmt.Errorf("limit %d per period %v is above one permit per nanosecond", c.Limit, time.Duration(c.Period))}
	}
	return nil
}

// FieldError is a Validate error about one field of a Config. Its message
// is Err's, which names the field.
type FieldError struct {
	// Field is the field as tokenserver.v1.Rule names it: algorithm,
	// limit, period, burst, sample_count, warmup, calendar or time_zone.
	Field string
	// Err says what is wrong.
	Err error
}

func (e *FieldError) Error() string { return e.Err.Error() }

// Unwrap returns Err.
func (e *FieldError) Unwrap() error { return e.Err }

// Errors of Validate and of requests.
var (
	// ErrUnknownAlgorithm means the Config names no algorithm this package has.
	ErrUnknownAlgorithm = errors.New("unknown algorithm")
	// ErrNoCommit means the algorithm takes no Commit or Debit (SlidingLog,
	// Concurrency); see OffersCommit.
	ErrNoCommit = errors.New("algorithm takes no commit or debit")
	// ErrNegativeUsage means Commit was given used < 0 or Debit n < 0.
	ErrNegativeUsage = errors.New("usage must be >= 0")
)

// Request is one acquire.
type Request struct {
	// Permits wanted; 0 peeks (state only, nothing consumed). The caller
	// rejects Permits < 0, and Permits > Capacity() unless Partial.
	Permits int64
	// Partial accepts fewer than Permits (TokenBucket, FixedWindow,
	// SlidingWindow; the others ignore it). A partial grant takes what is
	// there and is allowed when at least one permit is granted.
	Partial bool
	// MaxWait, in nanoseconds (at most Period), lets TokenBucket (without
	// warm-up) and LeakyBucket grant permits that become available within
	// MaxWait; the Result's WaitBefore says how long the caller waits first.
	// The others ignore it.
	MaxWait int64
	// LeaseID names the lease a Concurrency grant creates (unique among the
	// bucket's live leases; chosen by the caller). Others ignore it.
	LeaseID uint64
}

// Result is the answer to a Request. Durations are in nanoseconds.
type Result struct {
	// Allowed is true when Granted > 0, or for an allowed peek.
	Allowed bool
	// Granted is the number of permits granted (0 when denied or peeking).
	Granted int64
	// Remaining is how many permits could still be granted now (floor).
	Remaining int64
	// RetryAfter, when denied, is how long until the same request could be
	// granted (for Concurrency, until the oldest lease expires).
	RetryAfter int64
	// ResetAfter is how long until the bucket is back at its initial state if
	// nothing more is taken.
	ResetAfter int64
	// WaitBefore, for a shaped grant, is how long the caller must wait before
	// using it.
	WaitBefore int64
}

// Grant describes an earlier grant being given back or committed; the
// caller keeps it (internal/shard encodes it into the grant id). For
// Commit, Permits is the reservation.
type Grant struct {
	// IssuedAt is the `now` of the Acquire that made the grant.
	IssuedAt int64
	// Permits is what that Acquire granted.
	Permits int64
	// LeaseID is the Request.LeaseID of a Concurrency grant.
	LeaseID uint64
}

// Bucket is the state of one (rule, key) pair under one algorithm. Make one
// with New; the Config passed to each call must have the Algorithm the bucket
// was made for.
type Bucket interface {
	// Acquire decides a request. A denied request changes nothing.
	Acquire(c *Config, now int64, r Request) Result
	// Refill gives back up to `permits` of grant g and returns how many went
	// back: never more than g.Permits, never above capacity, and nothing once
	// the grant's window has passed (TokenBucket: one Period after IssuedAt;
	// LeakyBucket: its reserved slots are in the past; windows: its
	// (sub-)window left the count; SlidingLog: its log entries expired). For
	// Concurrency it ends the lease and returns its permits (0 if it had
	// expired). Refill does not remember grants: the caller gives each grant
	// back at most once.
	Refill(c *Config, now int64, g Grant, permits int64) int64
	// Renew extends the Concurrency lease g to now+Period and reports whether
	// it was still live. Other algorithms return false.
	Renew(c *Config, now int64, g Grant) bool
	// Reconfigure moves the bucket from Config old to new (same Algorithm),
	// keeping its state clamped to the new capacity.
	Reconfigure(prev, next *Config, now int64)
	// Idle reports whether the bucket is back at its initial state (a full
	// token bucket, an empty window, no live leases, nothing owed), so that
	// dropping it and making a new one later changes no decision.
	Idle(c *Config, now int64) bool
	// Commit settles grant g, which reserved g.Permits, at used permits:
	// below g.Permits it gives the difference back as Refill does (so the
	// caller commits each grant at most once, and never after refilling
	// it); above, it charges the difference even past zero (debt, see the
	// package doc). It fails with ErrNegativeUsage for used < 0 and
	// ErrNoCommit for SlidingLog and Concurrency, changing nothing.
	Commit(c *Config, now int64, g Grant, used int64) (CommitResult, error)
	// Debit charges n permits that had no reservation, even past zero, as
	// Commit charges an overrun. Errors as Commit.
	Debit(c *Config, now int64, n int64) (CommitResult, error)
}

// CommitResult is the answer to Commit and Debit. Durations are in
// nanoseconds.
type CommitResult struct {
	// Returned is how many permits went back (used below the reservation).
	Returned int64
	// Debited is how many permits were charged beyond the reservation
	// (all of them for Debit): never refused.
	Debited int64
	// Remaining is what a peek would answer now.
	Remaining int64
	// Debt is how many permits the key owes beyond what it may hold:
	// TokenBucket the balance below zero (including permits reserved ahead
	// with MaxWait), with warm-up the next free ticket ahead of now in
	// stable intervals; LeakyBucket the slots queued after now; FixedWindow
	// the count above Limit; SlidingWindow what did not fit in the window.
	Debt int64
	// RetryAfter is the retry_after a plain one-permit acquire would get
	// now: 0 when it would pass.
	RetryAfter int64
}

// OffersCommit reports whether algorithm a takes Commit and Debit: token
// bucket, leaky bucket, fixed window and sliding window.
func OffersCommit(a Algorithm) bool {
	return a == TokenBucket || a == LeakyBucket || a == FixedWindow || a == SlidingWindow
}

// New returns a bucket in its initial state for c (full, empty, or cold for
// warm-up), or nil for an unknown algorithm.
func New(c *Config, now int64) Bucket {
	switch c.Algorithm {
	case TokenBucket:
		return newTokenBucket(c, now)
	case LeakyBucket:
		return newLeakyBucket(c, now)
	case FixedWindow:
		return newFixedWindow(c, now)
	case SlidingWindow:
		return newSlidingWindow(c, now)
	case SlidingLog:
		return newSlidingLog(c, now)
	case Concurrency:
		return newConcurrency(c, now)
	}
	return nil
}
