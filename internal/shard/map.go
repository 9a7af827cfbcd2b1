package shard

import (
	"errors"
	"hash/maphash"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/tokenserver/tokenserver/internal/bucket"
	"github.com/tokenserver/tokenserver/internal/grant"
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

// DefaultShards is the shard count when Config.Shards is 0: shards only
// stripe inserts and evictions (decisions lock one bucket), and 64 keep a
// new-key flood from contending at 2-16 cores while each shard's index stays
// large enough to grow rarely (BenchmarkAcquireParallel shows no difference from 1 to 256 shards on 2 cores).
const DefaultShards = 64

// Map holds the buckets. It is safe for simultaneous use by multiple
// goroutines. Time is passed in as monotonic nanoseconds.
type Map struct {
	shards     []shard
	shift      uint // 64 - log2(len(shards))
	seed       maphash.Seed
	keys       grant.Keys
	max        int64
	budget     int64
	accounts   accounts
	used       atomic.Int64 // bytes of live buckets
	active     atomic.Int64 // rule generations holding bytes
	live       atomic.Int64
	evicted    atomic.Int64
	capDenials atomic.Int64
	scanShard  atomic.Uint64 // where a search for a rule's full buckets starts (evictOwnFull)
	// dropped is the highest grant nonce of a dropped bucket.
	dropped  atomic.Uint64
	imported issuers                    // other nodes' grant keys (export.go)
	local    atomic.Pointer[LocalRules] // rules outside the rule table (localrules.go)
	freezes  atomic.Uint64              // HandOver calls, which mark what they freeze (export.go)
}

type shard struct {
	mu     sync.Mutex // serializes insert, remove and rehash of tab
	tab    atomic.Pointer[table]
	used   int       // slots holding an entry or a tombstone; under mu
	live   int       // slots holding an entry; under mu
	cursor int       // where on-demand eviction resumes; under mu
	dirty  dirtyList // entries of durable rules marked dirty (dirty.go)
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
	// last is when a decision last found the bucket (lookupOrCreate):
	// the recency by which a rule at its fair share evicts its own full
	// buckets, least recently used first (evictOwnFull).
	last int64
	// key is the bucket key: rule name, NUL, key. Immutable.
	key string
	// first is the bucket's first grant nonce: above every nonce of the
	// buckets dropped before it was made, so that a grant of an earlier
	// bucket of the key gives nothing back here. Set when the entry is
	// made; only Import lowers it, to the first nonce of a state it
	// installs (export.go).
	first uint64
	b     bucket.Bucket
	// rule is the compiled rule version the bucket was last judged by; it
	// only moves to newer versions. nil once the entry left the index (a
	// lookup that finds such a dead entry looks again). The bucket counts
	// in the account of its generation (see accounts).
	rule *rule.Compiled
	// cfg is the configuration the bucket was last judged by; a runtime
	// override changes it without a new rule version (see follow).
	cfg *bucket.Config
	// inl is the limit carried by the request that last acquired from the
	// bucket (a copy of its configuration), while cfg is inl; nil when
	// that request carried none.
	inl *bucket.Config
	// stamp is the stamp of rule's runtime overrides under which cfg (or,
	// while cfg is inl, rule's default) was found for the key: while it
	// holds, an acquire needs no override lookup. nil: none.
	stamp *rule.Stamp
	// penaltyUntil is the end of the key's penalty lock-out.
	penaltyUntil int64
	// refilled records grants already given back (windows and buckets;
	// concurrency leases vanish on release instead).
	refilled *refillLog
	// moved: the bucket was handed over to the key's new owner
	// (export.go); decisions on it fail with ErrMoved until it is
	// installed back or thawed.
	moved bool
	// dirty: the entry is on its shard's dirty list (dirty.go).
	dirty atomic.Bool
	// frozen marks the HandOver that set moved (export.go: DropFrozen
	// drops the bucket only if no other HandOver froze it since).
	frozen uint64
}

// New returns an empty Map.
func New(c Config) *Map {
	n := c.Shards
	if n <= 0 {
		n = DefaultShards
	}
	n = 1 << bits.Len(uint(n-1))
	m := &Map{shards: make([]shard, n), shift: uint(64 - bits.Len(uint(n-1))), seed: maphash.MakeSeed(), keys: grant.NewKeys(), max: c.MaxBuckets, budget: c.MaxBytes}
	if n == 1 {
		m.shift = 64
	}
	m.accounts.m = make(map[accountKey]*account)
	for i := range m.shards {
		m.shards[i].tab.Store(newTable(minTable))
	}
	return m
}

// current returns the version of c's rule that decides now (see
// rule.Compiled.Latest), or rule.ErrDeleted when the rule was deleted
// since c was loaded.
func current(c *rule.Compiled) (*rule.Compiled, error) {
	l := c.Latest()
	if l == nil {
		return nil, rule.ErrDeleted(c.Rule.Name)
	}
	return l, nil
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
// caps) when there is none: under cfg (which it keeps), or under a copy of
// inl, a request's limit, when inl is not nil.
func (m *Map) lookupOrCreate(sh *shard, h uint64, bk []byte, c *rule.Compiled, cfg, inl *bucket.Config, now int64) (*entry, error) {
	if e := m.lookup(sh, h, bk); e != nil {
		e.last = max(e.last, now)
		return e, nil
	}
	sh.mu.Lock()
	if e := m.lookup(sh, h, bk); e != nil { // created meanwhile
		sh.mu.Unlock()
		e.last = max(e.last, now)
		return e, nil
	}
	var own *bucket.Config
	if inl != nil {
		own = new(bucket.Config)
		*own = *inl
		cfg = own
	}
	size := entryFixed + keyBytes(len(bk)) + bucket.InitialBytes(cfg)
	if err := m.admitNew(sh, c, size, now); err != nil {
		sh.mu.Unlock()
		return nil, err
	}
	b := bucket.New(cfg, now) // after admission: a refused key allocates nothing
	first := max(uint64(now), m.dropped.Load()+1)
	e := &entry{key: string(bk), seq: first - 1, last: now, first: first, b: b, rule: c, cfg: cfg, inl: own}
	e.mu.Lock()
	sh.insert(m.seed, h, e)
	sh.mu.Unlock()
	return e, nil
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

// KeyCount is the number of buckets the Map holds for c's generation of
// its rule (every version of one generation shares the count, which
// max_keys caps; a new generation starts at zero).
func (m *Map) KeyCount(c *rule.Compiled) int64 {
	if a := m.accounts.find(c); a != nil {
		return a.keys.Load()
	}
	return 0
}

// RuleBytes is the memory of the buckets of c's generation of its rule,
// as counted against Config.MaxBytes and the rule's fair share of it.
func (m *Map) RuleBytes(c *rule.Compiled) int64 {
	if a := m.accounts.find(c); a != nil {
		return a.bytes.Load()
	}
	return 0
}

// addSat returns a+b for b >= 0, saturating at math.MaxInt64.
func addSat(a, b int64) int64 {
	if s := a + b; s >= a {
		return s
	}
	return math.MaxInt64
}
