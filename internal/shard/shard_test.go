package shard

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/raftfsm"
	"github.com/tokenserver/tokenserver/internal/rule"
)

const sec = int64(time.Second)

// store returns a one-node in-memory Raft store holding rules (the rule
// semantics of production), and a function to fetch the current compiled
// version of a rule.
func store(t testing.TB, rules ...*rule.Rule) (rule.Store, func(string) *rule.Compiled) {
	t.Helper()
	s, err := raftfsm.NewInmem("shard-test", 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	for _, r := range rules {
		if _, err := s.Put(context.Background(), r, nil); err != nil {
			t.Fatal(err)
		}
	}
	return s, func(name string) *rule.Compiled {
		c := s.Table().Get(name)
		if c == nil {
			t.Fatalf("no rule %q", name)
		}
		return c
	}
}

func tb(name string, limit int64) *rule.Rule {
	return &rule.Rule{Name: name, Algorithm: bucket.TokenBucket, Limit: limit, Period: time.Second}
}

func acquire(t *testing.T, m *Map, c *rule.Compiled, key string, permits, now int64) Decision {
	t.Helper()
	d, err := m.Acquire(c, key, bucket.Request{Permits: permits}, now)
	if err != nil {
		t.Fatalf("Acquire(%s, %d) at %d: %v", key, permits, now, err)
	}
	return d
}

func TestAcquireCreatesAndCounts(t *testing.T) {
	_, get := store(t, tb("api", 3))
	m := New(Config{})
	now := 100 * sec
	for i, want := range []bool{true, true, true, false} {
		d := acquire(t, m, get("api"), "alice", 1, now)
		if d.Allowed != want {
			t.Fatalf("acquire %d: allowed %v, want %v", i, d.Allowed, want)
		}
		if d.Allowed == d.Grant.IsZero() {
			t.Fatalf("acquire %d: allowed %v but grant %+v", i, d.Allowed, d.Grant)
		}
	}
	if d := acquire(t, m, get("api"), "bob", 1, now); !d.Allowed {
		t.Fatal("bob shares alice's bucket")
	}
	if m.Live() != 2 {
		t.Fatalf("live = %d, want 2", m.Live())
	}
	if d := acquire(t, m, get("api"), "carol", 0, now); !d.Allowed || d.Remaining != 3 || m.Live() != 2 {
		t.Fatalf("peek of a new key: %+v, live %d (a peek must not create a bucket)", d, m.Live())
	}
}

func TestBadRequests(t *testing.T) {
	_, get := store(t, tb("api", 3))
	m := New(Config{})
	for _, req := range []bucket.Request{
		{Permits: -1},
		{Permits: 4},
		{Permits: 1, MaxWait: -1},
		{Permits: 1, MaxWait: 2 * sec},
	} {
		if _, err := m.Acquire(get("api"), "k", req, sec); !errors.Is(err, rule.ErrInvalid) {
			t.Errorf("Acquire(%+v) error %v, want ErrInvalid", req, err)
		}
	}
	if m.Live() != 0 {
		t.Fatalf("bad requests created %d buckets", m.Live())
	}
	if d, err := m.Acquire(get("api"), "k", bucket.Request{Permits: 4, Partial: true}, sec); err != nil || d.Granted != 3 {
		t.Fatalf("partial above capacity: %+v %v, want 3 granted", d, err)
	}
}

func TestPenalty(t *testing.T) {
	r := tb("api", 2)
	r.Penalty = 10 * time.Second
	_, get := store(t, r)
	m := New(Config{})
	now := 100 * sec
	acquire(t, m, get("api"), "k", 2, now)
	d := acquire(t, m, get("api"), "k", 1, now)
	if d.Allowed || d.Reason != ReasonLimit || d.RetryAfter != 10*sec {
		t.Fatalf("first denial: %+v, want denied by limit with retry 10s", d)
	}
	// Tokens are back after 1s, but the penalty holds until now+10s, and
	// denials during it do not extend it.
	for _, at := range []int64{1, 5, 9} {
		d = acquire(t, m, get("api"), "k", 1, now+at*sec)
		if d.Allowed || d.Reason != ReasonPenalty || d.RetryAfter != (10-at)*sec {
			t.Fatalf("at +%ds: %+v, want penalty with retry %ds", at, d, 10-at)
		}
	}
	if d = acquire(t, m, get("api"), "k", 1, now+10*sec); !d.Allowed {
		t.Fatalf("after the penalty: %+v", d)
	}
	if d = acquire(t, m, get("api"), "other", 1, now); !d.Allowed {
		t.Fatal("the penalty locked out another key")
	}
}

func TestListsAndShadow(t *testing.T) {
	r := tb("api", 1)
	r.Deny, r.Allow = []string{"bad"}, []string{"vip"}
	s := tb("shadow", 1)
	s.Shadow = true
	_, get := store(t, r, s)
	m := New(Config{})
	for i := 0; i < 5; i++ {
		if d := acquire(t, m, get("api"), "vip", 1, sec); !d.Allowed || d.Reason != ReasonAllowList {
			t.Fatalf("allow-listed key: %+v", d)
		}
		if d := acquire(t, m, get("api"), "bad", 1, sec); d.Allowed || d.Reason != ReasonDenyList {
			t.Fatalf("deny-listed key: %+v", d)
		}
	}
	if m.Live() != 0 {
		t.Fatalf("listed keys made %d buckets", m.Live())
	}
	if d := acquire(t, m, get("shadow"), "k", 1, sec); !d.Allowed || d.ShadowDenied {
		t.Fatalf("shadow first: %+v", d)
	}
	if d := acquire(t, m, get("shadow"), "k", 1, sec); !d.Allowed || !d.ShadowDenied || !d.Grant.IsZero() {
		t.Fatalf("shadow over the limit: %+v, want allowed, shadow-denied, no grant", d)
	}
}

func TestRefill(t *testing.T) {
	_, get := store(t, tb("api", 10), tb("other", 10))
	m := New(Config{})
	now := 100 * sec
	d := acquire(t, m, get("api"), "k", 6, now)
	id := d.Grant.String()
	if n, rem, err := m.Refill(get("api"), "k", id, 4, now); err != nil || n != 4 || rem != 8 {
		t.Fatalf("refill 4: %d %d %v, want 4 8", n, rem, err)
	}
	if n, _, err := m.Refill(get("api"), "k", id, 2, now); err != nil || n != 0 {
		t.Fatalf("second refill of one grant: %d %v, want 0", n, err)
	}
	if n, _, _ := m.Refill(get("api"), "other-key", id, -1, now); n != 0 {
		t.Fatalf("grant of another key refilled %d", n)
	}
	if n, _, _ := m.Refill(get("other"), "k", id, -1, now); n != 0 {
		t.Fatalf("grant of another rule refilled %d", n)
	}
	forged := d
	forged.Grant.Permits = 1000
	forged.Grant.Nonce++
	if n, _, _ := m.Refill(get("api"), "k", forged.Grant.String(), -1, now); n != 0 {
		t.Fatalf("forged grant refilled %d", n)
	}
	for _, bad := range []string{"x", "!!!!", Grant{Nonce: 1, Permits: 1}.String() + "A"} {
		if _, _, err := m.Refill(get("api"), "k", bad, -1, now); !errors.Is(err, rule.ErrInvalid) {
			t.Errorf("malformed grant %q: %v, want ErrInvalid", bad, err)
		}
	}
	// A grant refilled after its period changes nothing.
	d = acquire(t, m, get("api"), "k", 5, now)
	if n, _, _ := m.Refill(get("api"), "k", d.Grant.String(), -1, now+2*sec); n != 0 {
		t.Fatalf("late refill gave back %d", n)
	}
}

func TestConcurrencyLeases(t *testing.T) {
	r := &rule.Rule{Name: "conc", Algorithm: bucket.Concurrency, Limit: 2, Period: 10 * time.Second}
	s, get := store(t, r)
	m := New(Config{})
	now := 100 * sec
	a := acquire(t, m, get("conc"), "k", 1, now)
	b := acquire(t, m, get("conc"), "k", 1, now)
	if d := acquire(t, m, get("conc"), "k", 1, now); d.Allowed {
		t.Fatal("third lease allowed")
	}
	if ok, err := m.Renew(get("conc"), "k", a.Grant.String(), now+9*sec); err != nil || !ok {
		t.Fatalf("renew: %v %v", ok, err)
	}
	if n, _, _ := m.Refill(get("conc"), "k", b.Grant.String(), -1, now+sec); n != 1 {
		t.Fatalf("release gave back %d", n)
	}
	if n, _, _ := m.Refill(get("conc"), "k", b.Grant.String(), -1, now+sec); n != 0 {
		t.Fatalf("second release gave back %d", n)
	}
	// a was renewed at +9s, so it lives to +19s; the sweep keeps it.
	m.Sweep(now+15*sec, s.Table())
	if m.Live() != 1 {
		t.Fatal("sweep dropped a bucket with a live lease")
	}
	if ok, _ := m.Renew(get("conc"), "k", a.Grant.String(), now+20*sec); ok {
		t.Fatal("renewed an expired lease")
	}
	if _, err := m.Renew(get("conc"), "k", "junk", now); !errors.Is(err, rule.ErrInvalid) {
		t.Fatalf("renew junk: %v", err)
	}
}

func TestRuleChange(t *testing.T) {
	ctx := context.Background()
	s, get := store(t, tb("api", 10))
	m := New(Config{})
	now := 100 * sec
	acquire(t, m, get("api"), "k", 8, now)

	// Same algorithm, higher limit: the state (2 left) is kept.
	if _, err := s.Put(ctx, tb("api", 20), nil); err != nil {
		t.Fatal(err)
	}
	if d := acquire(t, m, get("api"), "k", 0, now); d.Remaining != 2 {
		t.Fatalf("after raising the limit: remaining %d, want 2 (state kept)", d.Remaining)
	}
	// Lower capacity clamps.
	acquire(t, m, get("api"), "k", 0, now+10*sec) // refilled to 20
	if _, err := s.Put(ctx, tb("api", 5), nil); err != nil {
		t.Fatal(err)
	}
	if d := acquire(t, m, get("api"), "k", 0, now+10*sec); d.Remaining != 5 {
		t.Fatalf("after lowering the limit: remaining %d, want 5 (clamped)", d.Remaining)
	}
	acquire(t, m, get("api"), "k", 5, now+10*sec)
	// A new algorithm starts fresh.
	fw := tb("api", 5)
	fw.Algorithm = bucket.FixedWindow
	if _, err := s.Put(ctx, fw, nil); err != nil {
		t.Fatal(err)
	}
	if d := acquire(t, m, get("api"), "k", 0, now+10*sec); d.Remaining != 5 {
		t.Fatalf("after an algorithm change: remaining %d, want 5 (fresh)", d.Remaining)
	}
	acquire(t, m, get("api"), "k", 5, now+10*sec)
	// Deleted and created again: fresh, and the old bucket is swept.
	if err := s.Delete(ctx, "api", nil); err != nil {
		t.Fatal(err)
	}
	m.Sweep(now+10*sec, s.Table())
	if m.Live() != 0 {
		t.Fatalf("bucket of a deleted rule survived the sweep: live %d", m.Live())
	}
	if _, err := s.Put(ctx, fw, nil); err != nil {
		t.Fatal(err)
	}
	if d := acquire(t, m, get("api"), "k", 5, now+10*sec); !d.Allowed {
		t.Fatalf("re-created rule kept old state: %+v", d)
	}
}

func TestCaps(t *testing.T) {
	log := &rule.Rule{Name: "log", Algorithm: bucket.SlidingLog, Limit: 5, Period: time.Second, MaxKeys: 3}
	_, get := store(t, tb("api", 10), log)
	m := New(Config{MaxBuckets: 5, Shards: 1})
	now := 100 * sec
	for i := 0; i < 3; i++ {
		acquire(t, m, get("log"), fmt.Sprint("l", i), 1, now)
	}
	if _, err := m.Acquire(get("log"), "l3", bucket.Request{Permits: 1}, now); !errors.Is(err, ErrMaxKeys) {
		t.Fatalf("fourth key of a max_keys=3 rule: %v", err)
	}
	acquire(t, m, get("api"), "a0", 1, now)
	acquire(t, m, get("api"), "a1", 1, now)
	if _, err := m.Acquire(get("api"), "a2", bucket.Request{Permits: 1}, now); !errors.Is(err, ErrBucketCap) {
		t.Fatalf("sixth bucket: %v, want ErrBucketCap", err)
	}
	// Existing keys are still served at the cap.
	if d := acquire(t, m, get("api"), "a0", 1, now); !d.Allowed {
		t.Fatal("existing key refused at the cap")
	}
	// Once buckets are idle again, a new key evicts them on demand.
	if d := acquire(t, m, get("api"), "a2", 1, now+2*sec); !d.Allowed {
		t.Fatal("new key refused although idle buckets could be evicted")
	}
	if m.Live() > 5 {
		t.Fatalf("live %d above the cap", m.Live())
	}
	if m.CapDenials() != 2 {
		t.Fatalf("cap denials %d, want 2", m.CapDenials())
	}
}

func TestSweep(t *testing.T) {
	r := tb("pen", 1)
	r.Penalty = time.Minute
	s, get := store(t, tb("api", 10), r)
	m := New(Config{})
	now := 100 * sec
	for i := 0; i < 100; i++ {
		acquire(t, m, get("api"), fmt.Sprint("k", i), 1, now)
	}
	acquire(t, m, get("pen"), "p", 1, now)
	acquire(t, m, get("pen"), "p", 1, now) // denied: penalty until now+60s
	if n := m.Sweep(now, s.Table()); n != 0 {
		t.Fatalf("swept %d busy buckets", n)
	}
	if n := m.Sweep(now+2*sec, s.Table()); n != 100 || m.Live() != 1 {
		t.Fatalf("swept %d, live %d; want 100 swept and the penalized key kept", n, m.Live())
	}
	if n := m.Sweep(now+61*sec, s.Table()); n != 1 || m.Live() != 0 {
		t.Fatalf("after the penalty: swept %d, live %d", n, m.Live())
	}
	if m.Evicted() != 101 {
		t.Fatalf("evicted %d", m.Evicted())
	}
}

// TestFlood sends many distinct keys against a small cap: live buckets stay
// at or under the cap, the heap stays bounded, and hot keys keep being
// served throughout.
func TestFlood(t *testing.T) {
	capacity, flood := int64(500_000), 2_000_000
	if testing.Short() {
		capacity, flood = 50_000, 200_000
	}
	_, get := store(t, tb("api", 10))
	c := get("api")
	m := New(Config{MaxBuckets: capacity})
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	now := 100 * sec
	hot := []string{"hot-1", "hot-2", "hot-3"}
	for _, k := range hot {
		acquire(t, m, c, k, 1, now)
	}
	var wg sync.WaitGroup
	var refused, hotRefused int64
	var mu sync.Mutex
	workers := 2
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			buf := make([]byte, 0, 32)
			var r, hr int64
			for i := w; i < flood; i += workers {
				at := now + int64(i)*int64(time.Microsecond) // the flood spans 2s of fake time
				buf = fmt.Appendf(buf[:0], "flood-%d", i)
				if _, err := m.Acquire(c, string(buf), bucket.Request{Permits: 1}, at); err != nil {
					if !errors.Is(err, ErrBucketCap) {
						t.Errorf("flood key: %v", err)
						return
					}
					r++
				}
				if i%1000 == 0 {
					if _, err := m.Acquire(c, hot[i%len(hot)], bucket.Request{Permits: 1}, at); err != nil {
						hr++
					}
				}
				if l := m.Live(); l > capacity {
					t.Errorf("live %d above the cap %d", l, capacity)
					return
				}
			}
			mu.Lock()
			refused, hotRefused = refused+r, hotRefused+hr
			mu.Unlock()
		}(w)
	}
	wg.Wait()
	if hotRefused > 0 {
		t.Fatalf("hot keys refused %d times during the flood", hotRefused)
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	heap := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	limit := int64(1.5*float64(capacity)*bytesPerBucket) + 64<<20
	t.Logf("flood of %d keys, cap %d: live %d, refused %d, evicted %d, heap +%d MiB (bound %d MiB)",
		flood, capacity, m.Live(), refused, m.Evicted(), heap>>20, limit>>20)
	if heap > limit {
		t.Fatalf("heap grew %d bytes, above 1.5 x cap x %d B + 64 MiB = %d", heap, bytesPerBucket, limit)
	}
	runtime.KeepAlive(m)
}

// bytesPerBucket is the measured heap cost of one live token-bucket key
// (BenchmarkMemoryPerKey), rounded up.
const bytesPerBucket = 150

// TestLeasePolicy: leases are capped at max_batch, and near exhaustion get
// at most half of what remains, so the tail is shared.
func TestLeasePolicy(t *testing.T) {
	r := tb("api", 100)
	r.Lease = rule.Lease{MaxBatch: 30, TTL: time.Second}
	_, get := store(t, r, tb("plain", 10))
	m := New(Config{})
	now := 100 * sec
	var got []int64
	for i := 0; i < 10; i++ {
		d, err := m.AcquireLease(get("api"), "k", 50, now)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, d.Granted)
	}
	// 30, 30, 30 (capped), then 10 is not under 10% so 10, then 0 left.
	want := []int64{30, 30, 30, 10, 0, 0, 0, 0, 0, 0}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("lease grants %v, want %v", got, want)
	}
	// Near exhaustion: 8 left of 100 (under 10%): grants halve.
	d := acquire(t, m, get("api"), "tail", 92, now)
	if !d.Allowed {
		t.Fatal(d)
	}
	got = got[:0]
	for i := 0; i < 5; i++ {
		d, _ := m.AcquireLease(get("api"), "tail", 30, now)
		got = append(got, d.Granted)
	}
	if want := []int64{4, 2, 1, 1, 0}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("tail lease grants %v, want %v", got, want)
	}
	if _, err := m.AcquireLease(get("plain"), "k", 5, now); !errors.Is(err, rule.ErrInvalid) {
		t.Fatalf("lease on a rule without leases: %v", err)
	}
}

// TestConcurrentAcquireSweep hammers the index from several goroutines while
// sweeps evict and the table grows: every key admits exactly its capacity
// (a bucket is evicted only when back at its initial state, so eviction
// never hands out a second bucket's worth), and live counts stay exact.
func TestConcurrentAcquireSweep(t *testing.T) {
	s, get := store(t, tb("api", 5))
	c := get("api")
	m := New(Config{Shards: 4})
	const keys, workers = 3000, 4
	now := 100 * sec
	allowed := make([]atomic.Int64, keys)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
				m.Sweep(now, s.Table())
			}
		}
	}()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < keys*4; i++ {
				k := (i*7 + w*13) % keys
				d, err := m.Acquire(c, fmt.Sprint("k", k), bucket.Request{Permits: 1}, now)
				if err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					allowed[k].Add(1)
				}
			}
		}(w)
	}
	wg.Wait()
	close(stop)
	for k := range allowed {
		if got := allowed[k].Load(); got != 5 {
			t.Fatalf("key %d admitted %d, want exactly its capacity 5", k, got)
		}
	}
	if m.Live() != keys {
		t.Fatalf("live %d, want %d", m.Live(), keys)
	}
	if n := m.Sweep(now+10*sec, s.Table()); n != keys || m.Live() != 0 {
		t.Fatalf("final sweep dropped %d, live %d", n, m.Live())
	}
}
