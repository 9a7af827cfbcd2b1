// Package shard keeps a node's buckets: one per (rule, key), in shards
// created on first use, evicted once back at their initial state, under a
// node-wide cap.
//
// Locking: each bucket has its own mutex, and a shard's index is read
// without a lock (see table), so a decision writes only its own bucket's
// cache lines; a shard's mutex serializes inserts, evictions and growth of
// that shard's index.
package shard

import (
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/rule"
)

// Errors of Map. Each is wrapped with context; test with errors.Is.
var (
	// ErrBucketCap means the node holds Config.MaxBuckets buckets, or its
	// buckets fill Config.MaxBytes (or the rule's fair share of it), and a
	// new key cannot get one.
	ErrBucketCap = errors.New("node bucket cap reached")
	// ErrMaxKeys means the rule holds its max_keys keys on this node.
	ErrMaxKeys = errors.New("rule key cap reached")
)

// Reason says why a decision came out as it did; numbers match
// tokenserver.v1.Reason.
type Reason uint8

// The reasons.
const (
	_ Reason = iota
	// ReasonLimit: the algorithm decided.
	ReasonLimit
	// ReasonPenalty: the key is locked out by the rule's penalty.
	ReasonPenalty
	// ReasonDenyList: the key is on the deny list.
	ReasonDenyList
	// ReasonAllowList: the key is on the allow list.
	ReasonAllowList
)

// Decision is the answer to an acquire.
type Decision struct {
	bucket.Result
	// Grant names what was granted; zero when nothing was taken from a bucket
	// (denied, peek, allow list, shadow).
	Grant Grant
	// Reason says why.
	Reason Reason
	// ShadowDenied is set in a shadow rule when the real decision was a
	// denial (Allowed is then true).
	ShadowDenied bool
	// Rule is the rule version that decided: the caller's, or a newer one
	// the key's bucket had already moved to.
	Rule *rule.Compiled
}

// Config configures a Map.
type Config struct {
	// Shards is the number of index shards (each with its own lock for
	// inserts and evictions), rounded up to a power of two.
	// 0 means DefaultShards.
	Shards int
	// MaxBuckets caps live buckets on the node; a new key past it gets
	// ErrBucketCap. 0 means no cap.
	MaxBuckets int64
	// MaxBytes is the node's bucket memory budget, in bytes: every bucket
	// counts its key, its entry in the index and its algorithm's state
	// (sliding logs and concurrency buckets by the entries they hold). A
	// new key that does not fit, or a log or lease set that would grow past
	// it, gets ErrBucketCap. Above FairShareAbove of the budget, a rule that
	// holds more than its fair share (the budget divided among the rules
	// holding buckets, at least two) gets no new keys, so that one rule's
	// flood leaves room for the others. 0 means no budget.
	MaxBytes int64
}

// FairShareAbove is the part of Config.MaxBytes, in percent, above which a
// rule is held to its fair share.
const FairShareAbove = 75

// DefaultShards is the shard count when Config.Shards is 0: shards only
// stripe inserts and evictions (decisions lock one bucket), and 64 keep a
// new-key flood from contending at 2-16 cores while each shard's index stays
// large enough to grow rarely (BenchmarkAcquireParallel shows no difference from 1 to 256 shards on 2 cores).
const DefaultShards = 64

// maxRefillLog bounds the refilled-grant record of one bucket; past it a
// refill changes nothing, which never over-admits.
const maxRefillLog = 1024

// Map holds the buckets. It is safe for simultaneous use by multiple
// goroutines. Time is passed in as monotonic nanoseconds.
type Map struct {
	shards     []shard
	shift      uint // 64 - log2(len(shards))
	seed       maphash.Seed
	keys       grantKeys
	max        int64
	budget     int64
	used       atomic.Int64 // bytes of live buckets
	active     atomic.Int64 // rule generations holding bytes
	live       atomic.Int64
	evicted    atomic.Int64
	capDenials atomic.Int64
	// dropped is the highest grant nonce of a dropped bucket.
	dropped atomic.Uint64
}

type shard struct {
	mu     sync.Mutex // serializes insert, remove and rehash of tab
	tab    atomic.Pointer[table]
	used   int // slots holding an entry or a tombstone; under mu
	live   int // slots holding an entry; under mu
	cursor int // where on-demand eviction resumes; under mu
	_      [64]byte
}

// entry is one bucket with what the shard keeps about it. Its fields but
// key are guarded by mu.
type entry struct {
	mu sync.Mutex
	// seq numbers the bucket's grants (the grant nonce, a concurrency
	// lease's id); it starts at the creation time, so ids differ across a
	// key's successive buckets. Beside mu: a decision writes one line.
	seq uint64
	// key is the bucket key: rule name, NUL, key. Immutable.
	key string
	// first is the bucket's first grant nonce: above every nonce of the
	// buckets dropped before it was made, so that a grant of an earlier
	// bucket of the key gives nothing back here. Immutable.
	first uint64
	b     bucket.Bucket
	// rule is the compiled rule version the bucket was last judged by; it
	// only moves to newer versions. nil once the entry left the index (a
	// lookup that finds such a dead entry looks again).
	rule *rule.Compiled
	// penaltyUntil is the end of the key's penalty lock-out.
	penaltyUntil int64
	// refilled records grants already given back (windows and buckets;
	// concurrency leases vanish on release instead).
	refilled *refillLog
}

type refillLog struct {
	nonces  []uint64
	expires []int64
	// floor: grants made before it are not given back. A rule change that
	// lengthens how long grants can be given back sets it, since the
	// records of grants given back under the old rule may be gone.
	floor int64
}

// New returns an empty Map.
func New(c Config) *Map {
	n := c.Shards
	if n <= 0 {
		n = DefaultShards
	}
	n = 1 << bits.Len(uint(n-1))
	m := &Map{shards: make([]shard, n), shift: uint(64 - bits.Len(uint(n-1))), seed: maphash.MakeSeed(), keys: newGrantKeys(), max: c.MaxBuckets, budget: c.MaxBytes}
	if n == 1 {
		m.shift = 64
	}
	for i := range m.shards {
		m.shards[i].tab.Store(newTable(minTable))
	}
	return m
}

// bucketKey writes rule name, NUL and key into buf (names never hold NUL).
func bucketKey(buf []byte, ruleName, key string) []byte {
	buf = append(buf, ruleName...)
	buf = append(buf, 0)
	return append(buf, key...)
}

// shardOf returns the shard of bucket key bk and bk's hash.
func (m *Map) shardOf(bk []byte) (*shard, uint64) {
	h := maphash.Bytes(m.seed, bk)
	if m.shift == 64 {
		return &m.shards[0], h
	}
	return &m.shards[h>>m.shift], h
}

// lookup returns the live entry of bk, locked, or nil. It takes no shard
// lock.
func (m *Map) lookup(sh *shard, h uint64, bk []byte) *entry {
	for {
		e := sh.tab.Load().find(h, bk)
		if e == nil {
			return nil
		}
		e.mu.Lock()
		if e.rule != nil {
			return e
		}
		e.mu.Unlock() // evicted meanwhile: look again
	}
}

// lookupOrCreate returns the entry of bk, locked, creating it (against the
// caps) when there is none.
func (m *Map) lookupOrCreate(sh *shard, h uint64, bk []byte, c *rule.Compiled, cfg *bucket.Config, now int64) (*entry, error) {
	if e := m.lookup(sh, h, bk); e != nil {
		return e, nil
	}
	sh.mu.Lock()
	if e := m.lookup(sh, h, bk); e != nil { // created meanwhile
		sh.mu.Unlock()
		return e, nil
	}
	size := entryFixed + keyBytes(len(bk)) + bucket.InitialBytes(cfg)
	if err := m.admitNew(sh, c, size, now); err != nil {
		sh.mu.Unlock()
		return nil, err
	}
	b := bucket.New(cfg, now) // after admission: a refused key allocates nothing
	first := max(uint64(now), m.dropped.Load()+1)
	e := &entry{key: string(bk), seq: first - 1, first: first, b: b, rule: c}
	e.mu.Lock()
	sh.insert(m.seed, h, e)
	sh.mu.Unlock()
	return e, nil
}

// CheckRequest reports whether req is acceptable for cfg: permits >= 0, at
// most the capacity unless partial, partial only where the algorithm offers
// it, max_wait within [0, period].
func CheckRequest(cfg *bucket.Config, req bucket.Request) error {
	switch {
	case req.Permits < 0:
		return rule.Invalid("permits must be >= 0, got %d", req.Permits)
	case req.Partial && !bucket.OffersPartial(cfg.Algorithm):
		return rule.Invalid("partial: %s grants all or nothing; partial grants are offered by token-bucket, fixed-window and sliding-window", cfg.Algorithm)
	case req.Permits > cfg.Capacity() && !req.Partial:
		return rule.Invalid("permits %d is above the key's capacity %d and could never be granted; ask for at most %d or set partial", req.Permits, cfg.Capacity(), cfg.Capacity())
	case req.MaxWait < 0:
		return rule.Invalid("max_wait must be >= 0, got %dns", req.MaxWait)
	case req.MaxWait > cfg.Period:
		return rule.Invalid("max_wait %dns is above the rule's period %dns", req.MaxWait, cfg.Period)
	}
	return nil
}

// Acquire decides req for key under rule c at time now. A denial is a
// Decision with Allowed false, not an error; errors are rule.ErrInvalid for a
// bad request, ErrBucketCap and ErrMaxKeys for a new key past a cap.
func (m *Map) Acquire(c *rule.Compiled, key string, req bucket.Request, now int64) (Decision, error) {
	return m.acquire(c, key, req, false, now)
}

// Lease policy: under LeaseLowShare of capacity, a lease gets at most
// 1/LeaseTailDivisor of what remains.
const (
	LeaseLowShare    = 10 // percent
	LeaseTailDivisor = 2
)

// AcquireLease is a client lease of up to want permits: a partial grant
// capped at the rule's lease.max_batch and, once the key is under
// LeaseLowShare percent of its capacity, at 1/LeaseTailDivisor of what
// remains (at least one), so that clients share the tail (the limited
// grants near exhaustion of quota pre-allocation). Rules without leases
// refuse it with rule.ErrInvalid.
func (m *Map) AcquireLease(c *rule.Compiled, key string, want int64, now int64) (Decision, error) {
	if c.Rule.Lease.MaxBatch <= 0 {
		return Decision{}, rule.Invalid("rule %q does not allow leases (lease.max_batch is not set)", c.Rule.Name)
	}
	if want < 1 {
		return Decision{}, rule.Invalid("a lease wants permits >= 1, got %d", want)
	}
	return m.acquire(c, key, bucket.Request{Permits: want, Partial: true}, true, now)
}

func (m *Map) acquire(c *rule.Compiled, key string, req bucket.Request, lease bool, now int64) (Decision, error) {
	if l := c.Latest(); l != c {
		if l == nil {
			return Decision{}, rule.ErrDeleted(c.Rule.Name)
		}
		c = l
	}
	cfg := c.ConfigFor(key)
	if err := CheckRequest(cfg, req); err != nil {
		return Decision{}, err
	}
	if c.Allowed(key) {
		return Decision{Result: bucket.Result{Allowed: true, Granted: req.Permits, Remaining: cfg.Capacity()}, Reason: ReasonAllowList, Rule: c}, nil
	}
	var d Decision
	if c.Denied(key) {
		d = Decision{Result: bucket.Result{RetryAfter: cfg.Period}, Reason: ReasonDenyList, Rule: c}
		shadow(c, &d, req)
		return d, nil
	}
	var arr [rule.MaxNameLen + 1 + rule.MaxKeyLen]byte
	bk := bucketKey(arr[:0], c.Rule.Name, key)
	sh, h := m.shardOf(bk)
	var e *entry
	if req.Permits == 0 { // a peek creates nothing
		if e = m.lookup(sh, h, bk); e == nil {
			return Decision{Result: bucket.New(cfg, now).Acquire(cfg, now, req), Reason: ReasonLimit, Rule: c}, nil
		}
	} else {
		var err error
		if e, err = m.lookupOrCreate(sh, h, bk, c, cfg, now); err != nil {
			return Decision{}, err
		}
	}
	// Look again under the bucket's lock: a sweep drops a bucket of a gone
	// rule only after the rule learnt its successor, so this sees it.
	if l := c.Latest(); l != c {
		if l == nil {
			e.mu.Unlock()
			return Decision{}, rule.ErrDeleted(c.Rule.Name)
		}
		c, cfg = l, l.ConfigFor(key)
		if err := CheckRequest(cfg, req); err != nil {
			e.mu.Unlock()
			return Decision{}, err
		}
	}
	if e.rule != c {
		j, err := m.resolve(e, c, key, now)
		if err == nil && j != c {
			// The bucket is at a newer version than the caller's: it is
			// judged by that one (a bucket never moves back).
			c, cfg = j, j.ConfigFor(key)
			err = CheckRequest(cfg, req)
		}
		if err != nil {
			e.mu.Unlock()
			return Decision{}, err
		}
	}
	if now < e.penaltyUntil {
		d.Result, d.Reason = e.b.Acquire(cfg, now, bucket.Request{}), ReasonPenalty
		d.Allowed, d.RetryAfter = false, e.penaltyUntil-now
		e.mu.Unlock()
		d.Rule = c
		shadow(c, &d, req)
		return d, nil
	}
	if lease {
		left := e.b.Acquire(cfg, now, bucket.Request{}).Remaining
		want := min(req.Permits, c.Rule.Lease.MaxBatch)
		if left*100 < cfg.Capacity()*LeaseLowShare {
			want = min(want, max(1, left/LeaseTailDivisor))
		}
		req.Permits = want
	}
	e.seq++
	nonce := e.seq
	req.LeaseID = nonce
	var before int64
	if grows := bucket.Grows(cfg.Algorithm); grows {
		if m.budget > 0 && req.Permits > 0 && bucket.Full(e.b) && m.used.Load() >= m.budget {
			e.mu.Unlock()
			return Decision{}, m.errGrow(c)
		}
		before = bucket.Bytes(e.b)
	}
	d.Result, d.Reason = e.b.Acquire(cfg, now, req), ReasonLimit
	if before != 0 {
		m.charge(c, bucket.Bytes(e.b)-before)
	}
	if !d.Allowed && req.Permits > 0 && c.Rule.Penalty > 0 {
		e.penaltyUntil = addSat(now, int64(c.Rule.Penalty))
		d.RetryAfter = max(d.RetryAfter, int64(c.Rule.Penalty))
	}
	e.mu.Unlock()
	if d.Granted > 0 {
		d.Grant = Grant{Nonce: nonce, IssuedAt: now, Permits: d.Granted}
		m.keys.seal(&d.Grant, bk, c.Rule.Generation)
	}
	d.Rule = c
	shadow(c, &d, req)
	return d, nil
}

// shadow turns a denial into an allow in a shadow rule.
func shadow(c *rule.Compiled, d *Decision, req bucket.Request) {
	if c.Rule.Shadow && !d.Allowed {
		d.Allowed, d.ShadowDenied, d.Granted, d.RetryAfter = true, true, req.Permits, 0
	}
}

// admitNew counts a new bucket of size bytes against the node's and the
// rule's caps; sh.mu is held.
func (m *Map) admitNew(sh *shard, c *rule.Compiled, size, now int64) error {
	if m.max > 0 {
		if m.live.Load() >= m.max {
			m.evictIdle(sh, now, 64)
		}
		if !incrementBelow(&m.live, m.max) {
			m.capDenials.Add(1)
			return fmt.Errorf("%w: %d buckets live", ErrBucketCap, m.max)
		}
	} else {
		m.live.Add(1)
	}
	if err := m.admitBytes(sh, c, size, now); err != nil {
		m.live.Add(-1)
		m.capDenials.Add(1)
		return err
	}
	if c.MaxKeys > 0 && !incrementBelow(c.KeyCount, c.MaxKeys) {
		m.live.Add(-1)
		m.charge(c, -size)
		m.capDenials.Add(1)
		return fmt.Errorf("%w: rule %q holds its max_keys %d keys on this node", ErrMaxKeys, c.Rule.Name, c.MaxKeys)
	} else if c.MaxKeys == 0 {
		c.KeyCount.Add(1)
	}
	return nil
}

// admitBytes charges size bytes of a new bucket of c against the budget
// and c's fair share; sh.mu is held.
func (m *Map) admitBytes(sh *shard, c *rule.Compiled, size, now int64) error {
	if m.budget <= 0 {
		m.charge(c, size)
		return nil
	}
	if m.used.Load()+size > m.budget {
		m.evictIdle(sh, now, 64)
	}
	if used := m.used.Add(size); used > m.budget {
		m.used.Add(-size)
		return fmt.Errorf("%w: buckets hold %d bytes of the node's %d-byte bucket memory budget", ErrBucketCap, used-size, m.budget)
	} else if used > m.budget/100*FairShareAbove {
		mine := c.Bytes.Load()
		rules := m.active.Load()
		if mine == 0 {
			rules++
		}
		if share := m.budget / max(rules, 2); mine+size > share {
			m.used.Add(-size)
			return fmt.Errorf("%w: rule %q holds %d bytes, its fair share of the node's %d-byte bucket memory budget among %d rules is %d", ErrBucketCap, c.Rule.Name, mine, m.budget, max(rules, 2), share)
		}
	}
	m.used.Add(-size)
	m.charge(c, size)
	return nil
}

// charge adds d bytes to the node's and c's bucket memory.
func (m *Map) charge(c *rule.Compiled, d int64) {
	if d == 0 {
		return
	}
	m.used.Add(d)
	n := c.Bytes.Add(d)
	switch old := n - d; {
	case old <= 0 && n > 0:
		m.active.Add(1)
	case old > 0 && n <= 0:
		m.active.Add(-1)
	}
}

// errGrow is the error of a sliding log or lease set that would grow past
// the budget.
func (m *Map) errGrow(c *rule.Compiled) error {
	m.capDenials.Add(1)
	return fmt.Errorf("%w: the node's %d-byte bucket memory budget is full; rule %q's bucket for this key cannot hold more entries", ErrBucketCap, m.budget, c.Rule.Name)
}

// entryFixed is what every bucket costs besides its key and algorithm
// state: the entry and its share of the index's slots (8 bytes a slot,
// kept between 3/8 and 3/4 full).
var entryFixed = bucket.AllocBytes(int64(unsafe.Sizeof(entry{}))) + 16

// keyBytes is the heap size of a key of n bytes.
func keyBytes(n int) int64 { return bucket.AllocBytes(int64(n)) }

// bytes is the memory e holds; e.mu is held.
func (e *entry) bytes() int64 {
	return entryFixed + keyBytes(len(e.key)) + bucket.Bytes(e.b) + e.refilled.bytes()
}

func (l *refillLog) bytes() int64 {
	if l == nil {
		return 0
	}
	return bucket.AllocBytes(int64(unsafe.Sizeof(*l))) + bucket.AllocBytes(int64(cap(l.nonces))*8) + bucket.AllocBytes(int64(cap(l.expires))*8)
}

// incrementBelow adds one to n unless that would reach past limit.
func incrementBelow(n *atomic.Int64, limit int64) bool {
	for {
		v := n.Load()
		if v >= limit {
			return false
		}
		if n.CompareAndSwap(v, v+1) {
			return true
		}
	}
}

// resolve brings e to the newer of its own rule version and c, and returns
// the version e is now judged by: a bucket never moves back to an older
// version or generation, so requests still holding an older table are
// judged by the newer rule. e.mu is held.
func (m *Map) resolve(e *entry, c *rule.Compiled, key string, now int64) (*rule.Compiled, error) {
	if e.rule == c || c.Rule.Version <= e.rule.Rule.Version {
		return e.rule, nil
	}
	if err := m.update(e, c, key, now); err != nil {
		return nil, err
	}
	return c, nil
}

// update moves e to rule version c (newer than e's): the same generation
// and algorithm keep the state, clamped to the new capacity; otherwise the
// bucket starts fresh and counts as a new key of c against its max_keys
// (ErrMaxKeys leaves e as it was). e.mu is held.
func (m *Map) update(e *entry, c *rule.Compiled, key string, now int64) error {
	old := e.rule
	newCfg := c.ConfigFor(key)
	before := e.bytes()
	defer func() {
		m.charge(old, -before)
		m.charge(e.rule, e.bytes())
	}()
	if old.Rule.Generation == c.Rule.Generation && old.Rule.Algorithm == c.Rule.Algorithm {
		oldCfg := old.ConfigFor(key)
		e.b.Reconfigure(oldCfg, newCfg, now)
		if e.refilled != nil && validity(newCfg) > validity(oldCfg) {
			// Records of grants given back may be pruned by the shorter
			// validity: refuse grants made before now.
			e.refilled.floor = now
		}
	} else {
		if old.KeyCount != c.KeyCount {
			if c.MaxKeys > 0 && !incrementBelow(c.KeyCount, c.MaxKeys) {
				m.capDenials.Add(1)
				return fmt.Errorf("%w: rule %q holds its max_keys %d keys on this node", ErrMaxKeys, c.Rule.Name, c.MaxKeys)
			} else if c.MaxKeys == 0 {
				c.KeyCount.Add(1)
			}
			old.KeyCount.Add(-1)
		}
		e.b = bucket.New(newCfg, now)
		e.penaltyUntil = 0
		e.refilled = nil
	}
	if c.Rule.Penalty == 0 {
		e.penaltyUntil = 0
	}
	e.rule = c
	return nil
}

// Refill gives back up to permits (all the grant took when permits < 0) of
// the grant named by grantID, or ends a concurrency lease. It returns how
// many went back and what remains. An unknown, expired or already refilled
// grant changes nothing and returns 0; a malformed id is rule.ErrInvalid.
func (m *Map) Refill(c *rule.Compiled, key, grantID string, permits int64, now int64) (refilled, remaining int64, err error) {
	g, err := ParseGrant(grantID)
	if err != nil {
		return 0, 0, err
	}
	if l := c.Latest(); l != c {
		if l == nil {
			return 0, 0, rule.ErrDeleted(c.Rule.Name)
		}
		c = l
	}
	cfg := c.ConfigFor(key)
	var arr [rule.MaxNameLen + 1 + rule.MaxKeyLen]byte
	bk := bucketKey(arr[:0], c.Rule.Name, key)
	if !m.keys.open(&g, bk, c.Rule.Generation) {
		return 0, m.peek(c, bk, cfg, now), nil // not a grant of this node, rule generation and key
	}
	if permits < 0 || permits > g.Permits {
		permits = g.Permits
	}
	sh, h := m.shardOf(bk)
	e := m.lookup(sh, h, bk)
	if e == nil { // evicted: back at its initial state, nothing to give back
		return 0, bucket.New(cfg, now).Acquire(cfg, now, bucket.Request{}).Remaining, nil
	}
	defer e.mu.Unlock()
	if e.rule.Rule.Generation != c.Rule.Generation {
		// The bucket is of another generation than the grant: nothing of
		// the grant is here.
		return 0, bucket.New(cfg, now).Acquire(cfg, now, bucket.Request{}).Remaining, nil
	}
	if c, err = m.resolve(e, c, key, now); err != nil { // same generation: never fails
		return 0, 0, err
	}
	cfg = c.ConfigFor(key)
	if g.Nonce < e.first {
		// The grant belongs to an earlier bucket of the key, evicted
		// since (back at its initial state): nothing of it is here.
		return 0, e.b.Acquire(cfg, now, bucket.Request{}).Remaining, nil
	}
	bg := bucket.Grant{IssuedAt: g.IssuedAt, Permits: g.Permits, LeaseID: g.Nonce}
	if cfg.Algorithm == bucket.Concurrency {
		refilled = e.b.Refill(cfg, now, bg, g.Permits)
	} else {
		before := e.refilled.bytes()
		full := m.budget > 0 && m.used.Load() >= m.budget
		if e.refillOnce(g.Nonce, g.IssuedAt, validity(cfg), now, !full) {
			refilled = e.b.Refill(cfg, now, bg, permits)
		}
		m.charge(c, e.refilled.bytes()-before)
	}
	return refilled, e.b.Acquire(cfg, now, bucket.Request{}).Remaining, nil
}

// validity bounds how long after it was made a grant can still be given
// back (the bucket decides exactly; this bounds the refilled-grant record).
func validity(cfg *bucket.Config) int64 {
	if cfg.Algorithm == bucket.LeakyBucket {
		return 2*cfg.Period + cfg.Capacity()*(cfg.Period/cfg.Limit)
	}
	return cfg.Period
}

// refillOnce records that the grant nonce, made at issued and refillable
// for valid nanoseconds, is being given back, and reports false when it
// already was, it expired, it predates the record's floor, or the record is
// full (or would have to grow and grow is false).
func (e *entry) refillOnce(nonce uint64, issued, valid, now int64, grow bool) bool {
	expires := addSat(issued, valid)
	if expires <= now {
		return false
	}
	l := e.refilled
	if l == nil {
		if !grow {
			return false
		}
		l = &refillLog{}
		e.refilled = l
	}
	if issued < l.floor {
		return false
	}
	j := 0
	for i, n := range l.nonces {
		if n == nonce {
			return false
		}
		if l.expires[i] > now {
			l.nonces[j], l.expires[j] = n, l.expires[i]
			j++
		}
	}
	l.nonces, l.expires = l.nonces[:j], l.expires[:j]
	if j >= maxRefillLog || !grow && (j == cap(l.nonces) || j == cap(l.expires)) {
		return false // full, or the memory budget is: giving nothing back never over-admits
	}
	l.nonces = append(l.nonces, nonce)
	l.expires = append(l.expires, expires)
	return true
}

// live reports whether the refill record still holds an unexpired grant.
func (l *refillLog) live(now int64) bool {
	if l == nil {
		return false
	}
	for _, e := range l.expires {
		if e > now {
			return true
		}
	}
	return false
}

// peek answers the remaining permits of a bucket without creating one.
func (m *Map) peek(c *rule.Compiled, bk []byte, cfg *bucket.Config, now int64) int64 {
	sh, h := m.shardOf(bk)
	e := m.lookup(sh, h, bk)
	if e == nil {
		return bucket.New(cfg, now).Acquire(cfg, now, bucket.Request{}).Remaining
	}
	defer e.mu.Unlock()
	if e.rule.Rule.Generation != c.Rule.Generation {
		return bucket.New(cfg, now).Acquire(cfg, now, bucket.Request{}).Remaining
	}
	key := string(bk[len(c.Rule.Name)+1:])
	c, _ = m.resolve(e, c, key, now) // same generation: never fails
	return e.b.Acquire(c.ConfigFor(key), now, bucket.Request{}).Remaining
}

// Renew extends the concurrency lease named by grantID by the rule's period
// and reports whether it was still live.
func (m *Map) Renew(c *rule.Compiled, key, grantID string, now int64) (bool, error) {
	g, err := ParseGrant(grantID)
	if err != nil {
		return false, err
	}
	if l := c.Latest(); l != c {
		if l == nil {
			return false, rule.ErrDeleted(c.Rule.Name)
		}
		c = l
	}
	cfg := c.ConfigFor(key)
	if cfg.Algorithm != bucket.Concurrency {
		return false, rule.Invalid("rule %q is %s: only concurrency leases are renewed", c.Rule.Name, cfg.Algorithm)
	}
	var arr [rule.MaxNameLen + 1 + rule.MaxKeyLen]byte
	bk := bucketKey(arr[:0], c.Rule.Name, key)
	if !m.keys.open(&g, bk, c.Rule.Generation) {
		return false, nil
	}
	sh, h := m.shardOf(bk)
	e := m.lookup(sh, h, bk)
	if e == nil {
		return false, nil
	}
	defer e.mu.Unlock()
	if e.rule.Rule.Generation != c.Rule.Generation || g.Nonce < e.first {
		return false, nil // a lease of an earlier bucket of the key
	}
	c, _ = m.resolve(e, c, key, now) // same generation: never fails
	if cfg = c.ConfigFor(key); cfg.Algorithm != bucket.Concurrency {
		return false, nil
	}
	return e.b.Renew(cfg, now, bucket.Grant{IssuedAt: g.IssuedAt, Permits: g.Permits, LeaseID: g.Nonce}), nil
}

// idle reports whether e can be dropped: back at its initial state, no
// penalty, no grant that could still be refilled twice; e.mu is held.
func (e *entry) idle(now int64) bool {
	key := e.key[len(e.rule.Rule.Name)+1:]
	return now >= e.penaltyUntil && !e.refilled.live(now) && e.b.Idle(e.rule.ConfigFor(key), now)
}

// evictIdle drops up to limit idle entries of sh, looking at no more than
// 4*limit slots from where the previous call stopped; sh.mu is held.
func (m *Map) evictIdle(sh *shard, now int64, limit int) {
	t := sh.tab.Load()
	dropped := 0
	for seen := 0; seen < 4*limit && dropped < limit; seen++ {
		sh.cursor = (sh.cursor + 1) & int(t.mask)
		e := t.slots[sh.cursor].Load()
		if e == nil || e == tombstone {
			continue
		}
		e.mu.Lock()
		if e.rule != nil && e.idle(now) {
			m.drop(sh, e)
			dropped++
		}
		e.mu.Unlock()
	}
}

// drop takes e out of the index and marks it dead; sh.mu and e.mu are
// held.
func (m *Map) drop(sh *shard, e *entry) {
	sh.remove(maphash.String(m.seed, e.key), e)
	m.live.Add(-1)
	m.charge(e.rule, -e.bytes())
	e.rule.KeyCount.Add(-1)
	e.rule = nil
	for d := m.dropped.Load(); d < e.seq && !m.dropped.CompareAndSwap(d, e.seq); d = m.dropped.Load() {
	}
	m.evicted.Add(1)
}

// Sweep drops every bucket that is idle at now, or whose rule is gone from
// t (deleted, or re-created as a new generation). A bucket is judged by the
// rule version it belongs to: one whose version is newer than t (created or
// changed after t was loaded) is kept unless idle. It locks one shard at a
// time (and each bucket in turn), shrinks indexes left mostly empty, and
// returns how many it dropped.
func (m *Map) Sweep(now int64, t *rule.Table) int {
	n := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		tab := sh.tab.Load()
		for j := range tab.slots {
			e := tab.slots[j].Load()
			if e == nil || e == tombstone {
				continue
			}
			e.mu.Lock()
			if e.rule != nil && (gone(e.rule, t) || e.idle(now)) {
				m.drop(sh, e)
				n++
			}
			e.mu.Unlock()
		}
		if len(tab.slots) > minTable && (sh.live*8 < len(tab.slots) || sh.used*2 > len(tab.slots)) {
			sh.rehash(m.seed, max(minTable, 1<<bitsFor(2*sh.live+1)))
		}
		sh.mu.Unlock()
	}
	return n
}

// gone reports whether t, at least as new as c, no longer holds c's
// generation (deleted, or re-created).
func gone(c *rule.Compiled, t *rule.Table) bool {
	if c.Rule.Version > t.Version {
		return false // t predates c: it cannot judge it
	}
	cur := t.Get(c.Rule.Name)
	return cur == nil || cur.Rule.Generation != c.Rule.Generation
}

// Live is the number of buckets held.
func (m *Map) Live() int64 { return m.live.Load() }

// Evicted is the number of buckets dropped since start.
func (m *Map) Evicted() int64 { return m.evicted.Load() }

// Bytes is the memory the buckets hold, as counted against
// Config.MaxBytes.
func (m *Map) Bytes() int64 { return m.used.Load() }

// MaxBytes is the bucket memory budget (0: none).
func (m *Map) MaxBytes() int64 { return m.budget }

// CapDenials is the number of new keys refused by the node or rule caps.
func (m *Map) CapDenials() int64 { return m.capDenials.Load() }

// addSat returns a+b for b >= 0, saturating at math.MaxInt64.
func addSat(a, b int64) int64 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxInt64
}
