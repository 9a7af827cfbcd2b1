// Package topk keeps a rule's heaviest keys by admitted and by denied
// permits over the last minute and hour, in bounded memory with an error
// bound per count, and is hand-written because none of the Go heavy-hitter
// modules checked (axiomhq/topk, dgryski/go-topk, keilerkonzept/topk,
// segmentio/topk) is available through the project's module proxy.
//
// # Model
//
// A Sketch is a ring of time buckets per window: by default seven 10 s
// buckets for the minute and thirteen 5 min buckets for the hour. A window
// of W over buckets of width B reads the current bucket and the W/B before
// it, so it covers between W and W+B of history. Each bucket holds two
// Space-Saving sketches (Metwally, Agrawal and El Abbadi, 2005) of
// Config.Capacity counters, one for admitted permits and one for denied.
// Observe adds a decision to the current bucket of both windows; Top and
// Snapshot merge the window's buckets on read.
//
// # Error
//
// Every reported Entry has a true count in [Count-Error, Count]. For one
// bucket of N permits and k = Capacity counters, Error ≤ N/k and every key
// with a true count above N/k is monitored. Merging (buckets on read, nodes
// with Merge) charges a key missing from an input that input's minimum
// count, so a merged Error is at most the sum of the inputs' minimum
// counts, reported as Summary.Floor; that sum is at most N/k for the
// window's or the cluster's total N. Every key whose true count exceeds
// Floor is listed, so every key above N/k is. Truncate shrinks a Summary
// for the wire and raises Floor to the largest count it drops.
//
// # Memory
//
// A Sketch holds at most MaxEntries = Capacity × (minute buckets + hour
// buckets) × 2 sides counters: 256 × (7 + 13) × 2 = 10,240 with
// DefaultConfig. A counter costs at most EntryBytes (80: the counter, its
// heap slot and its hash-index slots) plus its key's bytes, so a default
// Sketch full of 32-byte keys holds at most 10,240 × 112 ≈ 1.15 MB
// (TestMemoryPerEntry measures 1.07 MB, 105 bytes per counter). Buckets
// fill as distinct keys arrive: a rule with 5 keys holds 5 counters per
// bucket and side. With Capacity 256, TestZipfAccuracy reports all of the
// true top 20 of a Zipf(1.1) stream of a million decisions, each within 6
// of its true count; 128 halves the memory and finds all 20 over a minute
// but 18 of them in a single 10 s bucket.
//
// # Sampling
//
// Counting every decision exactly costs a mutex, a hash and two sketch
// updates, and a key not monitored evicts a counter in both windows: too
// much for a server deciding batches in a few hundred nanoseconds per
// item. With Config.SampleEvery = R > 1, a minute bucket counts its first
// Config.ExactPerBucket decisions exactly and then keeps each decision
// with probability 1/R at weight permits × R (a bucket that follows a busy
// one samples from its start). A decision left out costs one call to the
// runtime's per-thread random source and an atomic load: no hash, no lock.
// The counts are then Space-Saving's bounds over the sampled stream,
// which estimates the true stream without bias: a key's sampled count has
// a standard deviation of about √(R × true count), small beside the N/k
// a heavy hitter exceeds (R = 16 and a key at 1% of a million decisions:
// √160,000 = 400, 4% of its count). So with sampling on, Error and Floor
// bound the sampled stream; the true counts lie within them up to that
// sampling noise, and Total estimates N. TestSampledZipfProperty checks
// that every key above 2N/k is reported and every count lies within its
// Error plus six standard deviations. SampleEvery 0 (the default) keeps
// every bound exact.
//
// # Cost and concurrency
//
// Time is an argument: `now` is int64 monotonic nanoseconds chosen by the
// caller, never read inside; a `now` earlier than the latest seen counts
// as the latest. A Sketch is safe for simultaneous use by multiple
// goroutines behind one mutex. Observe of a key already monitored hashes
// the key once (hash/maphash, seeded per Sketch), then takes the mutex and
// in each window probes the bucket's hash index and sifts the key's
// counter; it allocates nothing and does not copy the key. A new key
// copies its string once per window. Under contention on one hot rule,
// callers can stripe: keep several Sketches per rule, pick one by key
// hash, and Merge their Snapshots on read.
package topk

import (
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// ErrInvalidConfig is wrapped by Config.Validate and New.
var ErrInvalidConfig = errors.New("invalid top-keys config")

// EntryBytes bounds the memory of one monitored key apart from the key's
// own bytes: the counter (48 bytes), its heap slot (4), its hash-index
// slots (8: the index is kept at most half full) and slack.
// TestMemoryPerEntry checks it.
const EntryBytes = 80

// MaxCapacity is the largest Config.Capacity.
const MaxCapacity = 1 << 16

// Window names the span Top and Snapshot read.
type Window uint8

const (
	// Minute is the last minute.
	Minute Window = iota + 1
	// Hour is the last hour.
	Hour
)

// String returns "minute" or "hour".
func (w Window) String() string {
	switch w {
	case Minute:
		return "minute"
	case Hour:
		return "hour"
	}
	return fmt.Sprintf("Window(%d)", uint8(w))
}

// Config sizes a Sketch. Memory is bounded by MaxEntries.
type Config struct {
	// Capacity is the number of keys each bucket's sketch monitors, per
	// side (admitted, denied). It sets the error: at most N/Capacity for
	// N permits in the window. 1 to MaxCapacity.
	Capacity int
	// MinuteBucket is the width of the minute window's buckets: at least
	// 1 s, dividing one minute.
	MinuteBucket time.Duration
	// HourBucket is the width of the hour window's buckets: at least
	// 1 min, dividing one hour.
	HourBucket time.Duration
	// SampleEvery, when above 1, turns on sampling for a busy Sketch:
	// each decision is then counted with probability 1/SampleEvery and
	// weight permits × SampleEvery (see "Sampling" in the package doc).
	// 0 or 1 counts every decision exactly; otherwise a power of two up
	// to MaxSampleEvery.
	SampleEvery int
	// ExactPerBucket is how many decisions a minute bucket counts
	// exactly before sampling starts, so that a quiet rule stays exact.
	// A bucket that follows a bucket which reached it samples from its
	// start. Ignored unless SampleEvery > 1; 0 samples from the start.
	ExactPerBucket int64
}

// MaxSampleEvery is the largest Config.SampleEvery.
const MaxSampleEvery = 1 << 10

// DefaultConfig is 256 keys per bucket and side, 10 s buckets for the
// minute and 5 min buckets for the hour: at most 10,240 counters, about
// 1.1 MB with 32-byte keys.
func DefaultConfig() Config {
	return Config{Capacity: 256, MinuteBucket: 10 * time.Second, HourBucket: 5 * time.Minute}
}

// Validate names the first field out of bounds.
func (c Config) Validate() error {
	if c.Capacity < 1 || c.Capacity > MaxCapacity {
		return fmt.Errorf("%w: Capacity %d: must be 1 to %d", ErrInvalidConfig, c.Capacity, MaxCapacity)
	}
	if c.MinuteBucket < time.Second || time.Minute%c.MinuteBucket != 0 {
		return fmt.Errorf("%w: MinuteBucket %v: must be at least 1s and divide 1m", ErrInvalidConfig, c.MinuteBucket)
	}
	if c.HourBucket < time.Minute || time.Hour%c.HourBucket != 0 {
		return fmt.Errorf("%w: HourBucket %v: must be at least 1m and divide 1h", ErrInvalidConfig, c.HourBucket)
	}
	if c.SampleEvery < 0 || c.SampleEvery > MaxSampleEvery || c.SampleEvery&(c.SampleEvery-1) != 0 {
		return fmt.Errorf("%w: SampleEvery %d: must be 0 or a power of two up to %d", ErrInvalidConfig, c.SampleEvery, MaxSampleEvery)
	}
	if c.ExactPerBucket < 0 {
		return fmt.Errorf("%w: ExactPerBucket %d: must not be negative", ErrInvalidConfig, c.ExactPerBucket)
	}
	return nil
}

// Buckets is how many buckets the window w keeps: one per bucket width in
// the window, plus the current one.
func (c Config) Buckets(w Window) int {
	switch w {
	case Minute:
		return int(time.Minute/c.MinuteBucket) + 1
	case Hour:
		return int(time.Hour/c.HourBucket) + 1
	}
	return 0
}

// MaxEntries bounds the counters a Sketch holds: Capacity per side (2) per
// bucket of both windows. Memory is about MaxEntries × (EntryBytes + key
// length).
func (c Config) MaxEntries() int {
	return c.Capacity * (c.Buckets(Minute) + c.Buckets(Hour)) * 2
}

// bucket is one time bucket: which bucket number it holds and a sketch per
// side (0 admitted, 1 denied).
type bucket struct {
	epoch int64
	sides [2]spaceSaving
}

// ring is one window's buckets. cur is the bucket of the latest time seen,
// valid while that time is before end.
type ring struct {
	width   int64
	buckets []bucket
	cur     *bucket
	end     int64 // first nanosecond after cur's bucket
}

// Sketch is one rule's top keys on one node. It is safe for simultaneous
// use by multiple goroutines. Create it with New.
type Sketch struct {
	capacity int
	seed     maphash.Seed
	// every and mask are Config.SampleEvery and SampleEvery-1 (every is
	// 1 without sampling); exactPer is Config.ExactPerBucket.
	every, mask uint32
	exactPer    int64
	// sampling is set once the current minute bucket has counted
	// exactPer decisions; read without the mutex on every Observe.
	sampling atomic.Bool
	mu       sync.Mutex
	latest   int64
	// seen estimates the decisions of the current minute bucket (each
	// sampled one counts every); seenEpoch is that bucket's number.
	seen      int64
	seenEpoch int64
	minute    ring
	hour      ring
}

// New returns an empty Sketch, or an error wrapping ErrInvalidConfig.
func New(cfg Config) (*Sketch, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Sketch{capacity: cfg.Capacity, seed: maphash.MakeSeed(), latest: minTime, every: 1, seenEpoch: minTime}
	if cfg.SampleEvery > 1 {
		s.every, s.mask, s.exactPer = uint32(cfg.SampleEvery), uint32(cfg.SampleEvery-1), cfg.ExactPerBucket
		s.sampling.Store(s.exactPer == 0)
	}
	s.minute.init(cfg.MinuteBucket, cfg.Buckets(Minute))
	s.hour.init(cfg.HourBucket, cfg.Buckets(Hour))
	return s, nil
}

const minTime = -1 << 63

func (r *ring) init(width time.Duration, n int) {
	r.width = int64(width)
	r.buckets = make([]bucket, n)
	for i := range r.buckets {
		r.buckets[i].epoch = minTime // holds no bucket
	}
	r.end = minTime
}

// floorDiv divides rounding towards minus infinity, so negative monotonic
// times bucket like positive ones.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b < 0 {
		q--
	}
	return q
}

func (r *ring) slot(epoch int64) *bucket {
	i := epoch % int64(len(r.buckets))
	if i < 0 {
		i += int64(len(r.buckets))
	}
	return &r.buckets[i]
}

// at returns the current bucket for now, which is never before the latest
// time seen, emptying a bucket left from an earlier lap.
func (r *ring) at(now int64, capacity int) *bucket {
	if now < r.end {
		return r.cur
	}
	e := floorDiv(now, r.width)
	b := r.slot(e)
	if b.epoch != e {
		b.epoch = e
		b.sides[0].reset()
		b.sides[1].reset()
	}
	r.cur, r.end = b, (e+1)*r.width
	return b
}

// Observe counts permits (> 0; others are ignored) for key at now, on the
// denied side if denied and the admitted side otherwise, in both windows.
// A key already monitored costs no allocation.
func (s *Sketch) Observe(now int64, key string, permits int64, denied bool) {
	if permits <= 0 {
		return
	}
	weight, sampled := permits, false
	if s.sampling.Load() {
		if rand.Uint32()&s.mask != 0 {
			return
		}
		weight, sampled = mulSat(permits, int64(s.every)), true
	}
	side := 0
	if denied {
		side = 1
	}
	h := maphash.String(s.seed, key)
	s.mu.Lock()
	if now < s.latest {
		now = s.latest
	} else {
		s.latest = now
	}
	if s.every > 1 {
		s.account(now, sampled)
	}
	s.minute.at(now, s.capacity).sides[side].add(h, key, weight, s.capacity)
	s.hour.at(now, s.capacity).sides[side].add(h, key, weight, s.capacity)
	s.mu.Unlock()
}

// account counts one decision towards the current minute bucket's
// estimate and turns sampling on or off: on once the bucket reaches
// exactPer, and at a new bucket on only if the bucket just before it
// reached exactPer. Called with s.mu held.
func (s *Sketch) account(now int64, sampled bool) {
	if e := floorDiv(now, s.minute.width); e != s.seenEpoch {
		busy := e == s.seenEpoch+1 && s.seen >= s.exactPer
		s.seen, s.seenEpoch = 0, e
		s.sampling.Store(busy || s.exactPer == 0)
	}
	if sampled {
		s.seen += int64(s.every)
	} else {
		s.seen++
	}
	if s.seen >= s.exactPer && !s.sampling.Load() {
		s.sampling.Store(true)
	}
}

// mulSat is a × b (both > 0), saturated at the largest int64.
func mulSat(a, b int64) int64 {
	if a > math.MaxInt64/b {
		return math.MaxInt64
	}
	return a * b
}

// Snapshot returns window w's keys on one side, merged over the window's
// buckets that hold time up to now (or the latest time seen, if later).
// Its Entries are every key of those buckets, hottest first; Merge it with
// other nodes' Snapshots and Truncate it to bound what travels. An unknown
// window yields an empty Summary.
func (s *Sketch) Snapshot(now int64, w Window, denied bool) Summary {
	side := 0
	if denied {
		side = 1
	}
	var r *ring
	switch w {
	case Minute:
		r = &s.minute
	case Hour:
		r = &s.hour
	default:
		return Summary{}
	}
	s.mu.Lock()
	now = max(now, s.latest)
	last := floorDiv(now, r.width)
	parts := make([]Summary, 0, len(r.buckets))
	for i := range r.buckets {
		b := &r.buckets[i]
		if b.epoch <= last && b.epoch > last-int64(len(r.buckets)) {
			parts = append(parts, b.sides[side].summary(s.capacity))
		}
	}
	s.mu.Unlock()
	return Merge(parts...)
}

// Top returns the n hottest keys of window w on one side at now, with
// their error bounds; n ≤ 0 returns all. It is Snapshot(now, w,
// denied).Top(n).
func (s *Sketch) Top(now int64, w Window, denied bool, n int) []Entry {
	return s.Snapshot(now, w, denied).Top(n)
}
