package bucket

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
	_ "time/tzdata" // calendar tests name zones; do not depend on the host's
	"unsafe"
)

const (
	us  = int64(time.Microsecond)
	ms  = int64(time.Millisecond)
	sec = int64(time.Second)
)

// opKind is what a step does.
type opKind int

const (
	opAcquire     opKind = iota // Acquire(req) == want
	opRefill                    // Refill(g, permits) == n
	opRenew                     // Renew(g) == ok
	opIdle                      // Idle() == ok
	opReconfigure               // Reconfigure(current, cfg)
	opCommit                    // Commit(g, used) == commit
	opDebit                     // Debit(permits) == commit
)

// step is one call at time at, in the style of x/time/rate's allow tables.
type step struct {
	at      int64
	op      opKind
	req     Request
	want    Result
	g       Grant
	permits int64
	n       int64
	ok      bool
	cfg     *Config
	commit  CommitResult
}

// run plays steps against a new bucket for c, made at time 0.
func run(t *testing.T, c *Config, steps []step) {
	t.Helper()
	if err := c.Validate(); err != nil {
		t.Fatalf("config %+v: %v", c, err)
	}
	b := New(c, 0)
	for i, s := range steps {
		switch s.op {
		case opAcquire:
			if got := b.Acquire(c, s.at, s.req); got != s.want {
				t.Errorf("step %d: at %v Acquire(%+v)\n got %+v\nwant %+v", i, time.Duration(s.at), s.req, got, s.want)
			}
		case opRefill:
			if got := b.Refill(c, s.at, s.g, s.permits); got != s.n {
				t.Errorf("step %d: at %v Refill(%+v, %d) = %d, want %d", i, time.Duration(s.at), s.g, s.permits, got, s.n)
			}
		case opRenew:
			if got := b.Renew(c, s.at, s.g); got != s.ok {
				t.Errorf("step %d: at %v Renew(%+v) = %v, want %v", i, time.Duration(s.at), s.g, got, s.ok)
			}
		case opIdle:
			if got := b.Idle(c, s.at); got != s.ok {
				t.Errorf("step %d: at %v Idle() = %v, want %v", i, time.Duration(s.at), got, s.ok)
			}
		case opReconfigure:
			if err := s.cfg.Validate(); err != nil {
				t.Fatalf("step %d: config %+v: %v", i, s.cfg, err)
			}
			b.Reconfigure(c, s.cfg, s.at)
			c = s.cfg
		case opCommit:
			if got, err := b.Commit(c, s.at, s.g, s.permits); err != nil || got != s.commit {
				t.Errorf("step %d: at %v Commit(%+v, %d)\n got %+v, %v\nwant %+v", i, time.Duration(s.at), s.g, s.permits, got, err, s.commit)
			}
		case opDebit:
			if got, err := b.Debit(c, s.at, s.permits); err != nil || got != s.commit {
				t.Errorf("step %d: at %v Debit(%d)\n got %+v, %v\nwant %+v", i, time.Duration(s.at), s.permits, got, err, s.commit)
			}
		}
	}
}

// Step constructors keep the tables short.
func acquire(at, permits int64, want Result) step {
	return step{at: at, req: Request{Permits: permits}, want: want}
}

func request(at int64, r Request, want Result) step { return step{at: at, req: r, want: want} }

func refill(at int64, g Grant, permits, n int64) step {
	return step{at: at, op: opRefill, g: g, permits: permits, n: n}
}

func renew(at int64, g Grant, ok bool) step { return step{at: at, op: opRenew, g: g, ok: ok} }

func idle(at int64, ok bool) step { return step{at: at, op: opIdle, ok: ok} }

func reconfigure(at int64, c *Config) step { return step{at: at, op: opReconfigure, cfg: c} }

func commitStep(at int64, g Grant, used int64, want CommitResult) step {
	return step{at: at, op: opCommit, g: g, permits: used, commit: want}
}

func debitStep(at, n int64, want CommitResult) step {
	return step{at: at, op: opDebit, permits: n, commit: want}
}

// mustZone loads an IANA zone from the embedded database.
func mustZone(name string) *time.Location {
	loc, err := time.LoadLocation(name)
	if err != nil {
		panic(fmt.Sprintf("load zone %s: %v", name, err))
	}
	return loc
}

// wall is a wall-clock time in loc as Unix nanoseconds, the `now` of a
// calendar bucket.
func wall(loc *time.Location, y int, m time.Month, d, h, mi int) int64 {
	return time.Date(y, m, d, h, mi, 0, 0, loc).UnixNano()
}

// clone deep-copies a bucket, so a test can look ahead without touching it.
func clone(b Bucket) Bucket {
	switch b := b.(type) {
	case *tokenBucket:
		x := *b
		return &x
	case *leakyBucket:
		x := *b
		return &x
	case *fixedWindow:
		x := *b
		return &x
	case *slidingWindow:
		x := *b
		x.counts = slices.Clone(b.counts)
		return &x
	case *slidingLog:
		x := *b
		x.buf = slices.Clone(b.buf)
		return &x
	case *concurrency:
		x := *b
		x.leases = slices.Clone(b.leases)
		return &x
	}
	panic(fmt.Sprintf("clone: unknown bucket %T", b))
}

// suiteCase is a configuration the invariant suite runs, with a second one
// of the same algorithm to reconfigure to and fro.
type suiteCase struct {
	name   string
	c, alt Config
	start  int64 // the first now; 0 means 1000s
}

var suite = []suiteCase{
	{"token-bucket", Config{Algorithm: TokenBucket, Limit: 5, Period: sec, Burst: 8}, Config{Algorithm: TokenBucket, Limit: 3, Period: 2 * sec, Burst: 2}, 0},
	{"token-bucket-odd-rate", Config{Algorithm: TokenBucket, Limit: 7, Period: 3 * sec, Burst: 4}, Config{Algorithm: TokenBucket, Limit: 7, Period: 3 * sec, Burst: 10}, 0},
	{"token-bucket-warmup", Config{Algorithm: TokenBucket, Limit: 10, Period: sec, Warmup: 5 * sec}, Config{Algorithm: TokenBucket, Limit: 20, Period: sec, Burst: 5, Warmup: 2 * sec}, 0},
	{"token-bucket-warmup-switch", Config{Algorithm: TokenBucket, Limit: 4, Period: sec, Warmup: 3 * sec}, Config{Algorithm: TokenBucket, Limit: 4, Period: sec}, 0},
	{"leaky-bucket", Config{Algorithm: LeakyBucket, Limit: 5, Period: sec, Burst: 3}, Config{Algorithm: LeakyBucket, Limit: 10, Period: sec}, 0},
	{"leaky-bucket-odd-rate", Config{Algorithm: LeakyBucket, Limit: 7, Period: sec}, Config{Algorithm: LeakyBucket, Limit: 3, Period: 700 * ms, Burst: 2}, 0},
	{"fixed-window", Config{Algorithm: FixedWindow, Limit: 5, Period: sec}, Config{Algorithm: FixedWindow, Limit: 3, Period: 700 * ms}, 0},
	{"sliding-window-1", Config{Algorithm: SlidingWindow, Limit: 5, Period: sec, SampleCount: 1}, Config{Algorithm: SlidingWindow, Limit: 5, Period: sec, SampleCount: 4}, 0},
	{"sliding-window-4", Config{Algorithm: SlidingWindow, Limit: 5, Period: sec, SampleCount: 4}, Config{Algorithm: SlidingWindow, Limit: 8, Period: 2 * sec, SampleCount: 10}, 0},
	{"sliding-log", Config{Algorithm: SlidingLog, Limit: 5, Period: sec}, Config{Algorithm: SlidingLog, Limit: 2, Period: 1500 * ms}, 0},
	{"concurrency", Config{Algorithm: Concurrency, Limit: 3, Period: sec}, Config{Algorithm: Concurrency, Limit: 5, Period: 300 * ms}, 0},
	{"fixed-window-day-berlin", Config{Algorithm: FixedWindow, Limit: 5, Calendar: CalendarDay, Location: mustZone("Europe/Berlin")},
		Config{Algorithm: FixedWindow, Limit: 3, Calendar: CalendarMonth, Location: mustZone("Europe/Berlin")}, wall(mustZone("Europe/Berlin"), 2024, 3, 29, 12, 0)},
	{"fixed-window-week-to-period", Config{Algorithm: FixedWindow, Limit: 4, Calendar: CalendarWeek, Location: mustZone("America/New_York")},
		Config{Algorithm: FixedWindow, Limit: 6, Period: 36 * int64(time.Hour)}, wall(mustZone("America/New_York"), 2024, 10, 30, 0, 0)},
}

// invOp is one random operation of the invariant suite.
type invOp struct {
	kind    opKind
	dt      int64 // time step before the op; may be negative
	permits int64
	partial bool
	maxWait int64
	pick    int // which outstanding grant a refill or renewal names
}

// decodeOps turns bytes (4 per op) into operations scaled to c, so that the
// random test and the fuzz target share one input space.
func decodeOps(c *Config, data []byte) []invOp {
	var ops []invOp
	for ; len(data) >= 4; data = data[4:] {
		b0, b1, b2, b3 := data[0], data[1], data[2], data[3]
		var o invOp
		switch k := b0 % 32; {
		case k < 20:
			o.kind = opAcquire
		case k < 25 && b0 >= 160:
			o.kind = opCommit
		case k < 25:
			o.kind = opRefill
		case k < 27:
			o.kind = opRenew
		case k < 28:
			o.kind = opReconfigure
		case b0 >= 192:
			o.kind = opDebit
		default:
			o.kind = opIdle
		}
		v := int64(b1 & 63)
		span := c.Span()
		switch b1 >> 6 {
		case 0: // around the interval between permits
			o.dt = v * span / (c.Limit * 16)
		case 1: // up to two periods
			o.dt = v * span / 32
		case 2: // none, or the clock jumps back
			if v >= 32 {
				o.dt = -v * span / 128
			}
		case 3: // a few nanoseconds
			o.dt = v % 4
		}
		o.permits = int64(b2) % (c.Capacity() + 2)
		if b2 >= 200 {
			o.permits = 1
		}
		o.partial = b3&1 != 0
		if b3&2 != 0 && c.Calendar == CalendarNone {
			o.maxWait = c.Period * int64(b3>>2) / 63
		}
		o.pick = int(b3)
		ops = append(ops, o)
	}
	return ops
}

// longIdle is more than any bucket of the suite needs to become idle
// having been charged at most debited permits beyond its grants.
func longIdle(c *Config, debited int64) int64 {
	return 20*c.Span() + 2*c.Warmup + (3*debited/c.Limit+2)*c.Span()
}

// checkInvariants plays ops against a new bucket and checks, after every
// step, the properties all algorithms share.
func checkInvariants(t testing.TB, sc suiteCase, ops []invOp) {
	t.Helper()
	cfgs := [2]Config{sc.c, sc.alt}
	ci := 0
	c := &cfgs[ci]
	now := 1000 * sec
	if sc.start != 0 {
		now = sc.start
	}
	seen := now
	var debited int64 // all Debited so far, to bound the time debt lasts
	b := New(c, now)
	if !b.Idle(c, now) {
		t.Fatalf("%s: a new bucket is not idle", sc.name)
	}
	var grants []Grant
	var leaseID uint64
	for i, o := range ops {
		now += o.dt
		capacity := c.Capacity()
		// seen is the latest time the bucket was given: durations in its
		// answers count from there.
		if o.kind == opAcquire || o.kind == opReconfigure || (o.kind == opRefill && len(grants) > 0) ||
			(o.kind == opDebit && OffersCommit(c.Algorithm)) || (o.kind == opCommit && len(grants) > 0 && OffersCommit(c.Algorithm)) ||
			(o.kind == opRenew && len(grants) > 0 && c.Algorithm == Concurrency) {
			seen = max(seen, now)
		}
		switch o.kind {
		case opAcquire:
			leaseID++
			r := Request{Permits: o.permits, Partial: o.partial, MaxWait: o.maxWait, LeaseID: leaseID}
			before := clone(b)
			res := b.Acquire(c, now, r)
			where := fmt.Sprintf("%s: op %d: at %d (seen %d) Acquire(%+v) = %+v", sc.name, i, now, seen, r, res)
			never := r.Permits > capacity && !r.Partial
			switch {
			case res.Granted < 0 || res.Granted > r.Permits:
				t.Fatalf("%s: granted outside [0, permits]", where)
			case res.Granted > capacity:
				t.Fatalf("%s: granted above capacity %d", where, capacity)
			case r.Permits > 0 && res.Allowed != (res.Granted > 0):
				t.Fatalf("%s: allowed disagrees with granted", where)
			case res.Allowed && r.Permits > 0 && !r.Partial && res.Granted != r.Permits:
				t.Fatalf("%s: partial grant without partial", where)
			case res.Remaining < 0 || res.Remaining > capacity:
				t.Fatalf("%s: remaining outside [0, %d]", where, capacity)
			case res.Allowed && res.RetryAfter != 0:
				t.Fatalf("%s: retry_after on an allowed request", where)
			case res.WaitBefore != 0 && (res.Granted == 0 || res.WaitBefore < 0 || res.WaitBefore > r.MaxWait):
				t.Fatalf("%s: wait_before outside (0, max_wait] or without a grant", where)
			case res.ResetAfter < 0 || res.RetryAfter < 0:
				t.Fatalf("%s: negative duration", where)
			case !res.Allowed && never && res.RetryAfter != 0:
				t.Fatalf("%s: retry_after for a request that can never pass", where)
			case !res.Allowed && !never && res.RetryAfter <= 0:
				t.Fatalf("%s: denied without retry_after", where)
			}
			if !res.Allowed {
				peek := Request{MaxWait: r.MaxWait}
				if p0, p1 := clone(before).Acquire(c, now, peek), clone(b).Acquire(c, now, peek); p0 != p1 {
					t.Fatalf("%s: a denied request changed the state: peek %+v before, %+v after", where, p0, p1)
				}
				if ra := res.RetryAfter; ra > 0 {
					if got := clone(b).Acquire(c, seen+ra, r); !got.Allowed {
						t.Fatalf("%s: still denied after retry_after: %+v", where, got)
					}
					if got := clone(b).Acquire(c, seen+ra-1, r); got.Allowed {
						t.Fatalf("%s: allowed 1ns before retry_after: %+v", where, got)
					}
				}
			}
			if res.Granted > 0 {
				grants = append(grants, Grant{IssuedAt: seen, Permits: res.Granted, LeaseID: r.LeaseID})
			}
			if got := b.Idle(c, seen); got != (res.ResetAfter == 0) {
				t.Fatalf("%s: Idle() = %v disagrees with reset_after", where, got)
			}
			if ra := res.ResetAfter; ra > 0 {
				if !clone(b).Idle(c, seen+ra) {
					t.Fatalf("%s: not idle after reset_after", where)
				}
				if clone(b).Idle(c, seen+ra-1) {
					t.Fatalf("%s: idle 1ns before reset_after", where)
				}
			}
		case opRefill:
			if len(grants) == 0 {
				continue
			}
			j := o.pick % len(grants)
			g := grants[j]
			grants = slices.Delete(grants, j, j+1) // each grant goes back at most once
			n := b.Refill(c, now, g, o.permits)
			if n < 0 || n > o.permits || n > g.Permits {
				t.Fatalf("%s: op %d: Refill(%+v, %d) = %d: outside [0, min(permits, grant)]", sc.name, i, g, o.permits, n)
			}
			if p := clone(b).Acquire(c, now, Request{}); p.Remaining > capacity {
				t.Fatalf("%s: op %d: remaining %d above capacity %d after Refill(%+v, %d)", sc.name, i, p.Remaining, capacity, g, o.permits)
			}
		case opCommit, opDebit:
			var res CommitResult
			var err error
			var reserved, used int64
			before := clone(b)
			if o.kind == opCommit {
				if len(grants) == 0 {
					continue
				}
				j := o.pick % len(grants)
				g := grants[j]
				grants = slices.Delete(grants, j, j+1) // each grant is settled at most once
				reserved, used = g.Permits, o.permits%(2*g.Permits+1)
				res, err = b.Commit(c, now, g, used)
			} else {
				used = o.permits
				res, err = b.Debit(c, now, used)
			}
			where := fmt.Sprintf("%s: op %d: at %d (seen %d) commit of %d reserved %d = %+v", sc.name, i, now, seen, used, reserved, res)
			if !OffersCommit(c.Algorithm) {
				if !errors.Is(err, ErrNoCommit) {
					t.Fatalf("%s: err %v, want ErrNoCommit", where, err)
				}
				if p0, p1 := before.Acquire(c, now, Request{}), clone(b).Acquire(c, now, Request{}); p0 != p1 {
					t.Fatalf("%s: a refused commit changed the state: peek %+v before, %+v after", where, p0, p1)
				}
				continue
			}
			debited += res.Debited
			one := clone(b).Acquire(c, now, Request{Permits: 1})
			switch {
			case err != nil:
				t.Fatalf("%s: %v", where, err)
			case res.Returned < 0 || res.Returned > max(0, reserved-used):
				t.Fatalf("%s: returned outside [0, reserved-used]", where)
			case res.Debited != max(0, used-reserved):
				t.Fatalf("%s: debited %d, want %d", where, res.Debited, max(0, used-reserved))
			case res.Remaining < 0 || res.Remaining > capacity || res.Debt < 0 || res.RetryAfter < 0:
				t.Fatalf("%s: a field out of range (capacity %d)", where, capacity)
			case res.Remaining != clone(b).Acquire(c, now, Request{}).Remaining:
				t.Fatalf("%s: remaining disagrees with a peek", where)
			case one.RetryAfter != res.RetryAfter || one.Allowed != (res.RetryAfter == 0):
				t.Fatalf("%s: retry_after disagrees with a one-permit acquire %+v", where, one)
			case res.Debt > 0 && (res.Remaining != 0 || b.Idle(c, seen)):
				t.Fatalf("%s: in debt yet idle or with permits remaining", where)
			}
		case opRenew:
			if len(grants) == 0 {
				continue
			}
			g := grants[o.pick%len(grants)]
			if ok := b.Renew(c, now, g); ok && c.Algorithm != Concurrency {
				t.Fatalf("%s: op %d: Renew on %s", sc.name, i, c.Algorithm)
			}
		case opReconfigure:
			old := c
			ci ^= 1
			c = &cfgs[ci]
			b.Reconfigure(old, c, now)
			if p := clone(b).Acquire(c, now, Request{}); p.Remaining > c.Capacity() {
				t.Fatalf("%s: op %d: remaining %d above capacity %d after Reconfigure", sc.name, i, p.Remaining, c.Capacity())
			}
		case opIdle:
			later := seen + longIdle(c, debited)
			x := clone(b)
			if !x.Idle(c, later) {
				t.Fatalf("%s: op %d: not idle after %v without requests", sc.name, i, time.Duration(longIdle(c, debited)))
			}
		}
		// An idle bucket must answer exactly as a new one would.
		if b.Idle(c, seen) {
			for _, r := range []Request{{}, {Permits: 1}, {Permits: capacity, MaxWait: c.Period / 2}} {
				if got, want := clone(b).Acquire(c, seen, r), New(c, seen).Acquire(c, seen, r); got != want {
					t.Fatalf("%s: op %d: idle bucket answers %+v to %+v, a new one %+v", sc.name, i, got, r, want)
				}
			}
		}
	}
	if !b.Idle(c, seen+longIdle(c, debited)) {
		t.Fatalf("%s: not idle after %v without requests", sc.name, time.Duration(longIdle(c, debited)))
	}
}

func TestInvariants(t *testing.T) {
	for _, sc := range suite {
		t.Run(sc.name, func(t *testing.T) {
			if err := sc.c.Validate(); err != nil {
				t.Fatal(err)
			}
			if err := sc.alt.Validate(); err != nil {
				t.Fatal(err)
			}
			for seed := range uint64(200) {
				rng := rand.New(rand.NewPCG(seed, 7))
				data := make([]byte, 4*400)
				for i := range data {
					data[i] = byte(rng.Uint32())
				}
				checkInvariants(t, sc, decodeOps(&sc.c, data))
			}
		})
	}
}

func FuzzInvariants(f *testing.F) {
	for i := range suite {
		f.Add(uint8(i), []byte{0, 1, 1, 0, 0, 0, 3, 2, 20, 64, 1, 1, 31, 255, 1, 0})
	}
	f.Fuzz(func(t *testing.T, which uint8, data []byte) {
		if len(data) > 4*2000 {
			return
		}
		sc := suite[int(which)%len(suite)]
		checkInvariants(t, sc, decodeOps(&sc.c, data))
	})
}

func TestNewIdleAndUnknown(t *testing.T) {
	for _, sc := range suite {
		b := New(&sc.c, 5)
		if !b.Idle(&sc.c, 5) || !b.Idle(&sc.c, 0) {
			t.Errorf("%s: a new bucket is not idle", sc.name)
		}
	}
	if b := New(&Config{Algorithm: Unspecified}, 0); b != nil {
		t.Errorf("New(unspecified) = %v, want nil", b)
	}
}

// TestStateSize pins the memory of the buckets kept by the million.
func TestStateSize(t *testing.T) {
	if n := unsafe.Sizeof(tokenBucket{}); n > 24 {
		t.Errorf("tokenBucket is %d bytes, want at most 24", n)
	}
	if n := unsafe.Sizeof(leakyBucket{}); n > 16 {
		t.Errorf("leakyBucket is %d bytes, want at most 16", n)
	}
	if n := unsafe.Sizeof(fixedWindow{}); n > 24 {
		t.Errorf("fixedWindow is %d bytes, want at most 24", n)
	}
}
